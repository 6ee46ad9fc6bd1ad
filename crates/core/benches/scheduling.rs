//! Criterion benches for the provisioner on the standard shapes. The same
//! shapes back `ironclaim bench scheduling`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ironclaim_core::{provision, shapes};

fn reference(c: &mut Criterion) {
    let mut group = c.benchmark_group("provision/reference");
    group.sample_size(10);
    for pods in [100usize, 1000, 5000, 20000] {
        let snapshot = shapes::reference(pods);
        group.throughput(Throughput::Elements(pods as u64));
        group.bench_with_input(BenchmarkId::from_parameter(pods), &snapshot, |b, s| b.iter(|| provision(s, 0)));
    }
    group.finish();
}

fn bare_metal(c: &mut Criterion) {
    let mut group = c.benchmark_group("provision/bare-metal");
    group.sample_size(10);
    for pods in [1000usize, 50000] {
        let snapshot = shapes::bare_metal(pods);
        group.throughput(Throughput::Elements(pods as u64));
        group.bench_with_input(BenchmarkId::from_parameter(pods), &snapshot, |b, s| b.iter(|| provision(s, 0)));
    }
    group.finish();
}

fn worked_example(c: &mut Criterion) {
    let snapshot = ironclaim_core::scenario::worked_example();
    c.bench_function("provision/worked-example", |b| b.iter(|| provision(&snapshot, 0)));
}

criterion_group!(benches, worked_example, reference, bare_metal);
criterion_main!(benches);
