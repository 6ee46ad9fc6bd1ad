//! TLS for BMC connections: rustls on the `ring` provider.
//!
//! Verification is on by default against the system trust store. A server
//! may name its own CA bundle, which then replaces the system store (BMC
//! certificates come from a private CA far more often than a public one).
//! Skipping verification is an explicit per-server setting that logs a
//! warning each time a client is built with it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, Result};

/// TLS settings for one BMC.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM bundle of the CAs to trust for this BMC instead of the system store.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate. Never the default; logs a warning.
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// Installs `ring` as the process-wide default rustls provider, so that
/// other users of rustls in the same binary (kube) agree with this crate.
/// Idempotent; harmless when a provider is already installed.
pub fn install_crypto_provider() {
    // An Err only says another provider was installed first, which is fine:
    // this crate never relies on the process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsSettings {
    /// Builds the rustls client configuration for BMCs with these settings.
    /// It does not warn about `insecure_skip_verify`: each client built on
    /// it does, naming its BMC.
    ///
    /// # Errors
    /// [`Error::TlsConfig`] when both a CA file and skip-verify are set, or
    /// the CA file is unreadable or holds no certificate.
    pub fn client_config(&self) -> Result<rustls::ClientConfig> {
        let provider = provider();
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|err| Error::TlsConfig { reason: err.to_string() })?;
        if self.insecure_skip_verify {
            if self.ca_file.is_some() {
                return Err(Error::TlsConfig { reason: "a CA file and insecure_skip_verify exclude each other".into() });
            }
            let verifier = AcceptAnyCertificate { algorithms: provider.signature_verification_algorithms };
            return Ok(builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth());
        }
        let roots = match &self.ca_file {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|err| Error::TlsConfig { reason: format!("cannot read CA file {}: {err}", path.display()) })?;
                for cert in certs {
                    let cert = cert.map_err(|err| Error::TlsConfig { reason: format!("bad PEM in CA file {}: {err}", path.display()) })?;
                    roots.add(cert).map_err(|err| Error::TlsConfig { reason: format!("bad certificate in CA file {}: {err}", path.display()) })?;
                }
                if roots.is_empty() {
                    return Err(Error::TlsConfig { reason: format!("CA file {} holds no certificate", path.display()) });
                }
                roots
            }
            None => return Ok(builder.with_root_certificates(system_roots()).with_no_client_auth()),
        };
        Ok(builder.with_root_certificates(roots).with_no_client_auth())
    }
}

/// The system trust store, read once per process and shared by every
/// client that trusts it: a fleet of 5,000 BMCs holds one copy of it, not
/// 5,000 (about 150 KB each).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: std::sync::OnceLock<Arc<RootCertStore>> = std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let loaded = rustls_native_certs::load_native_certs();
            for err in &loaded.errors {
                tracing::debug!(error = %err, "skipping part of the system trust store");
            }
            let (added, ignored) = roots.add_parsable_certificates(loaded.certs);
            tracing::debug!(added, ignored, "loaded the system trust store");
            Arc::new(roots)
        })
        .clone()
}

/// Stores a CA bundle given as PEM text (a Server's `spec.bmc.caBundle`)
/// in `dir`, under a name made of its SHA-256, and returns the file.
///
/// # Guarantees
/// Equal bundles get one file, hence equal [`TlsSettings`], so servers that
/// share a BMC and a bundle share one client in a [`crate::BmcFleet`]; a
/// changed bundle gets a new file, so that endpoint's client is rebuilt. A
/// file is written once, atomically (a temporary file renamed into place),
/// and never rewritten, so a client being built never reads half a bundle.
///
/// # Errors
/// [`Error::TlsConfig`] when the directory or the file cannot be written.
/// The content is checked only when a client is built from it.
pub fn ca_bundle_file(dir: &Path, pem: &str) -> Result<PathBuf> {
    let io = |err: std::io::Error| Error::TlsConfig { reason: format!("cannot store a CA bundle in {}: {err}", dir.display()) };
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
        .tls13()
        .ok_or_else(|| Error::TlsConfig { reason: "no SHA-256 to name the CA bundle by".into() })?;
    let digest = suite.common.hash_provider.hash(pem.as_bytes());
    let name: String = digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect();
    let path = dir.join(format!("ca-{name}.pem"));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    let partial = dir.join(format!(".ca-{name}.{}.{}.partial", std::process::id(), fastrand::u64(..)));
    std::fs::write(&partial, pem).map_err(io)?;
    std::fs::rename(&partial, &path).map_err(|err| {
        let _ = std::fs::remove_file(&partial);
        io(err)
    })?;
    Ok(path)
}

/// Accepts any server certificate but still checks handshake signatures, so
/// the session keys belong to whoever holds the presented certificate.
#[derive(Debug)]
struct AcceptAnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_client_that_trusts_the_system_store_shares_one_copy_of_it() {
        assert!(Arc::ptr_eq(&system_roots(), &system_roots()));
        let settings = TlsSettings::default();
        let configs: Vec<rustls::ClientConfig> = (0..2).map(|_| settings.client_config().expect("a client configuration")).collect();
        // Each configuration holds the shared store (other tests may hold
        // it too): the static's, this call's and the two configurations'.
        assert!(Arc::strong_count(&system_roots()) >= 4, "{}", Arc::strong_count(&system_roots()));
        drop(configs);
    }

    use super::*;

    #[test]
    fn equal_bundles_share_one_file_and_a_changed_one_gets_another() {
        let dir = std::env::temp_dir().join(format!("ironclaim-ca-{}-{}", std::process::id(), fastrand::u64(..)));
        let first = ca_bundle_file(&dir, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let again = ca_bundle_file(&dir, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let changed = ca_bundle_file(&dir, "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n").unwrap();
        assert_eq!(first, again);
        assert_ne!(first, changed);
        assert!(std::fs::read_to_string(&changed).unwrap().contains("BBBB"));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "no partial file is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
