//! Test harnesses: the sushy-tools emulator in a child process, and a mock
//! BMC serving the DMTF public-rackmount1 mockup with injectable faults.
#![allow(dead_code)]

pub mod mock;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ironclaim_redfish::client::Timing;

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
    assert!(
        dir.join("index.json").is_file(),
        "the DMTF mockup is missing at {}; set IRONCLAIM_SHARED_DIR to the shared/ folder",
        dir.display()
    );
    dir
}

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("ironclaim-{tag}-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// A self-made CA and a server certificate for 127.0.0.1 and localhost.
pub struct TestCertificates {
    pub ca_pem: PathBuf,
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
}

pub fn make_certificates(dir: &Path) -> TestCertificates {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "ironclaim test BMC CA");
    let ca = ca_params.self_signed(&ca_key).expect("self-signed ca");
    let ca_issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("server params");
    let cert = params.signed_by(&key, &ca_issuer).expect("server cert");

    let certs = TestCertificates {
        ca_pem: dir.join("ca.pem"),
        cert_pem: dir.join("server.pem"),
        key_pem: dir.join("server-key.pem"),
    };
    std::fs::write(&certs.ca_pem, ca.pem()).expect("write ca");
    std::fs::write(&certs.cert_pem, cert.pem()).expect("write cert");
    std::fs::write(&certs.key_pem, key.serialize_pem()).expect("write key");
    certs
}

/// Where the sushy-tools emulator lives: `$IRONCLAIM_SUSHY_EMULATOR`, or the
/// cache hack/redfish-emulator-setup fills. Missing means a failed test.
pub fn sushy_emulator() -> PathBuf {
    let path = match std::env::var_os("IRONCLAIM_SUSHY_EMULATOR") {
        Some(path) => PathBuf::from(path),
        None => {
            let cache = match std::env::var_os("IRONCLAIM_CACHE") {
                Some(dir) => PathBuf::from(dir),
                None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ironclaim"),
            };
            cache.join("sushy-venv/bin/sushy-emulator")
        }
    };
    assert!(
        path.is_file(),
        "the sushy-tools Redfish emulator is not installed at {}: run hack/redfish-emulator-setup \
         (or set IRONCLAIM_SUSHY_EMULATOR to its sushy-emulator)",
        path.display()
    );
    path
}

/// One fake system of the emulator.
pub fn fake_system(index: usize, power_state: &str) -> (String, String) {
    (format!("7f3e0000-0000-4000-8000-{index:012x}"), power_state.to_owned())
}

pub struct SushyOptions {
    pub systems: Vec<(String, String)>,
    pub disable_power_off: bool,
}

/// A running sushy-emulator with the fake driver, Basic auth (bcrypt
/// htpasswd) and TLS from a test CA, in a fresh state directory.
pub struct Sushy {
    child: Option<Child>,
    pub port: u16,
    pub certs: TestCertificates,
    pub log: Arc<Mutex<Vec<String>>>,
    pub dir: TempDir,
}

impl Sushy {
    pub fn start(options: SushyOptions) -> Sushy {
        let emulator = sushy_emulator();
        let dir = TempDir::new("sushy");
        let certs = make_certificates(dir.path());
        let hash = bcrypt::hash(PASSWORD, 4).expect("bcrypt");
        let htpasswd = dir.path().join("htpasswd");
        std::fs::write(&htpasswd, format!("{USERNAME}:{hash}\n")).expect("write htpasswd");
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).expect("state dir");
        let port = free_port();
        let systems: Vec<String> = options
            .systems
            .iter()
            .enumerate()
            .map(|(i, (uuid, power))| {
                format!("{{'uuid': '{uuid}', 'name': 'node-{i:03}', 'power_state': '{power}', 'nics': []}}")
            })
            .collect();
        let config = dir.path().join("emulator.conf");
        let mut file = std::fs::File::create(&config).expect("config");
        writeln!(
            file,
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
             SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
             SUSHY_EMULATOR_FAKE_DRIVER = True\n\
             SUSHY_EMULATOR_STATE_DIR = '{state}'\n\
             SUSHY_EMULATOR_AUTH_FILE = '{auth}'\n\
             SUSHY_EMULATOR_SSL_CERT = '{cert}'\n\
             SUSHY_EMULATOR_SSL_KEY = '{key}'\n\
             SUSHY_EMULATOR_DISABLE_POWER_OFF = {disable}\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = [\n    {systems}\n]",
            state = state_dir.display(),
            auth = htpasswd.display(),
            cert = certs.cert_pem.display(),
            key = certs.key_pem.display(),
            disable = if options.disable_power_off { "True" } else { "False" },
            systems = systems.join(",\n    "),
        )
        .expect("write config");
        drop(file);

        let mut child = Command::new(&emulator)
            .arg("--config")
            .arg(&config)
            .env("SUSHY_EMULATOR_CONFIG", &config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", emulator.display()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let mut sushy = Sushy { child: Some(child), port, certs, log, dir };
        sushy.wait_until_listening();
        sushy
    }

    fn wait_until_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("sushy-emulator exited with {status}: {}", self.log_text());
            }
            assert!(Instant::now() < deadline, "sushy-emulator did not listen within 60 s: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
    }

    /// Reset actions the emulator answered with 204, from its access log.
    pub fn resets_answered(&self) -> usize {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().filter(|line| line.contains("/Actions/ComputerSystem.Reset HTTP/1.1") && line.contains("\" 204")).count()
    }

    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Metal3-style address of one system.
    pub fn metal3_address(&self, uuid: &str) -> String {
        format!("redfish+https://127.0.0.1:{}/redfish/v1/Systems/{uuid}", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        self.kill();
    }
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
    }
}
