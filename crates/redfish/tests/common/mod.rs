//! Test harnesses: the sushy-tools emulator as these tests run it (the
//! harness itself is `ironclaim_testenv::sushy`), and a mock BMC serving the
//! DMTF public-rackmount1 mockup with injectable faults.
#![allow(dead_code)]

pub mod mock;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ironclaim_redfish::client::Timing;
pub use ironclaim_testenv::sushy::{Sushy, SushyBuilder, SystemPower};

pub const USERNAME: &str = "ironclaim";
pub const PASSWORD: &str = "correct horse battery";

/// `<repo>/../shared`, or `$IRONCLAIM_SHARED_DIR`.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("IRONCLAIM_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

pub fn mockup_dir() -> PathBuf {
    let dir = shared_dir().join("data/redfish-mockups/public-rackmount1");
    assert!(dir.join("index.json").is_file(), "the DMTF mockup is missing at {}; set IRONCLAIM_SHARED_DIR to the shared/ folder", dir.display());
    dir
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local addr").port()
}

/// Writes a password file and returns its path.
pub fn password_file(dir: &Path, password: &str) -> PathBuf {
    let path = dir.join("password");
    std::fs::write(&path, format!("{password}\n")).expect("write password file");
    path
}

/// One fake system of the emulator: its UUID and first power state.
pub fn fake_system(index: usize, power: SystemPower) -> (String, SystemPower) {
    (format!("7f3e0000-0000-4000-8000-{index:012x}"), power)
}

/// The emulator as these tests meet it: TLS from a CA made for the test,
/// Basic auth as [`USERNAME`]/[`PASSWORD`] (a bcrypt htpasswd file), and
/// `systems`. Add to it, then `start()`.
pub fn sushy_with(systems: &[(String, SystemPower)]) -> SushyBuilder {
    Sushy::builder().systems(systems.iter().cloned()).tls().basic_auth(USERNAME, PASSWORD)
}

/// The CA a client must trust to reach `sushy`.
pub fn ca_pem(sushy: &Sushy) -> PathBuf {
    sushy.certificates().expect("the emulator serves TLS").ca_pem.clone()
}

/// Timing for sushy, whose fake driver applies a reset 1 to 11 s later.
pub fn sushy_timing() -> Timing {
    Timing {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(2),
        retries: 2,
        retry_backoff: Duration::from_millis(100),
        poll_initial: Duration::from_millis(300),
        poll_max: Duration::from_secs(1),
        resend_after: Duration::from_secs(15),
        confirm_timeout: Duration::from_secs(40),
        graceful_timeout: Duration::from_secs(20),
        task_timeout: Duration::from_secs(10),
        idle_connection: Duration::from_secs(2),
    }
}

/// Timing for the in-process mock, whose resets apply in 100 ms.
pub fn mock_timing() -> Timing {
    Timing {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        retries: 2,
        retry_backoff: Duration::from_millis(10),
        poll_initial: Duration::from_millis(20),
        poll_max: Duration::from_millis(100),
        resend_after: Duration::from_millis(600),
        confirm_timeout: Duration::from_millis(1500),
        graceful_timeout: Duration::from_millis(800),
        task_timeout: Duration::from_secs(2),
        idle_connection: Duration::from_secs(2),
    }
}
