# ironclaim's image, for machines with a container engine:
#
#   docker build --build-arg IRONCLAIM_COMMIT=$(git rev-parse --short=12 HEAD) -t ironclaim .
#
# Without one, `hack/image` assembles the same contents (the binary, the
# libraries it links, the user 65532) as an OCI layout; docs/image.md.

FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
# The build context has no .git: the commit comes in as an argument.
ARG IRONCLAIM_COMMIT=unknown
ENV IRONCLAIM_COMMIT=${IRONCLAIM_COMMIT}
RUN cargo build --release --locked -p ironclaim \
    && install -D -m 0755 target/release/ironclaim /out/ironclaim

# glibc and libgcc, CA certificates, the user nonroot (65532); no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ironclaim /usr/local/bin/ironclaim
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ironclaim"]
CMD ["controller"]
