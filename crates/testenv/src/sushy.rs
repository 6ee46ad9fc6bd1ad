//! The sushy-tools Redfish emulator (the BMC emulator of OpenStack Ironic
//! and Metal3 CI) in a child process, for every test crate that powers
//! servers through a real Redfish endpoint.
//!
//! ```no_run
//! use ironclaim_testenv::sushy::{Sushy, SystemPower};
//! let sushy = Sushy::builder().system("5e7a0000-0000-4000-8000-000000000001", SystemPower::Off).start()?;
//! let url = sushy.system_url("5e7a0000-0000-4000-8000-000000000001");
//! // ... power it on through `url`, then:
//! assert_eq!(sushy.resets("5e7a0000-0000-4000-8000-000000000001"), 1);
//! # Ok::<(), ironclaim_testenv::sushy::Error>(())
//! ```
//!
//! Each emulator runs the fake driver (no libvirt, no hardware) on a free
//! loopback port with a state directory of its own, so tests never share a
//! system. Plain HTTP without authentication by default; [`SushyBuilder::tls`]
//! serves HTTPS with a certificate from a CA made for the test, and
//! [`SushyBuilder::basic_auth`] requires one user (bcrypt htpasswd). The
//! emulator is killed when the [`Sushy`] drops; its access log is kept in
//! memory, so tests count the resets it answered.
//!
//! The emulator is found at `$IRONCLAIM_SUSHY_EMULATOR`, else in the cache
//! `hack/redfish-emulator-setup` fills
//! (`${IRONCLAIM_CACHE:-$HOME/.cache/ironclaim}/sushy-venv/bin/sushy-emulator`).
//! A missing emulator is an error, never a skipped test.

use crate::TempDir;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Overrides where the emulator executable is.
pub const EMULATOR_VAR: &str = "IRONCLAIM_SUSHY_EMULATOR";
/// How long a start may take before it counts as failed. sushy-tools
/// imports its Flask app in about a second; a loaded 2-core machine with
/// several emulators starting at once needs more.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);
/// A free port can be taken between the moment it is picked and the moment
/// the emulator binds it: start again on a fresh one, at most this often.
const START_ATTEMPTS: u32 = 3;

/// What went wrong while starting or restarting an emulator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the sushy-tools Redfish emulator is not installed at {path}: run hack/redfish-emulator-setup \
         (or set {EMULATOR_VAR} to its sushy-emulator)"
    )]
    NotInstalled { path: PathBuf },

    #[error("failed to prepare the emulator's files in {path}")]
    WriteFiles {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("failed to find a free loopback port")]
    NoFreePort {
        #[source]
        source: std::io::Error,
    },

    #[error("failed to make the emulator's test certificates")]
    Certificates {
        #[source]
        source: rcgen::Error,
    },

    #[error("failed to hash the emulator's password")]
    HashPassword {
        #[source]
        source: bcrypt::BcryptError,
    },

    #[error("failed to start {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("sushy-emulator exited with {status} before listening on port {port}; its log:\n{log}")]
    Exited { status: ExitStatus, port: u16, log: String },

    #[error("sushy-emulator did not listen on port {port} within {timeout:?}; its log:\n{log}")]
    NotListening { port: u16, timeout: Duration, log: String },
}

impl Error {
    /// A short, stable name for the failed step, for counting failures by kind.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NotInstalled { .. } => "not_installed",
            Error::WriteFiles { .. } => "write_files",
            Error::NoFreePort { .. } => "no_free_port",
            Error::Certificates { .. } => "certificates",
            Error::HashPassword { .. } => "hash_password",
            Error::Spawn { .. } => "spawn",
            Error::Exited { .. } => "exited",
            Error::NotListening { .. } => "not_listening",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The power state a fake system starts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SystemPower {
    On,
    Off,
}

impl SystemPower {
    fn as_redfish(self) -> &'static str {
        match self {
            SystemPower::On => "On",
            SystemPower::Off => "Off",
        }
    }
}

/// Where the emulator executable is expected: `$IRONCLAIM_SUSHY_EMULATOR`,
/// else the cache `hack/redfish-emulator-setup` installs into. The path is
/// returned whether or not the file exists.
pub fn emulator_path() -> PathBuf {
    if let Some(path) = std::env::var_os(EMULATOR_VAR) {
        return PathBuf::from(path);
    }
    crate::cache_root().join("sushy-venv/bin/sushy-emulator")
}

/// The files of a TLS-serving emulator: the CA a client must trust, and the
/// server's certificate (for 127.0.0.1 and localhost) and key.
#[derive(Clone, Debug)]
pub struct Certificates {
    pub ca_pem: PathBuf,
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
}

/// How an emulator is to be started; see [`Sushy::builder`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct SushyBuilder {
    systems: Vec<(String, SystemPower)>,
    tls: bool,
    basic_auth: Option<(String, String)>,
    refuse_power_off: bool,
}

impl SushyBuilder {
    /// Adds a fake system, known by its UUID (which is also its Redfish
    /// identity in the emulator's URLs).
    pub fn system(mut self, uuid: impl Into<String>, power: SystemPower) -> Self {
        self.systems.push((uuid.into(), power));
        self
    }

    /// Adds fake systems, in order.
    pub fn systems<S: Into<String>>(mut self, systems: impl IntoIterator<Item = (S, SystemPower)>) -> Self {
        self.systems.extend(systems.into_iter().map(|(uuid, power)| (uuid.into(), power)));
        self
    }

    /// Serves HTTPS with a certificate signed by a CA made for this
    /// emulator; [`Sushy::certificates`] names the CA to trust.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Requires HTTP Basic authentication as `username`/`password`. Without
    /// it, the emulator accepts every request, whatever its credentials.
    pub fn basic_auth(mut self, username: &str, password: &str) -> Self {
        self.basic_auth = Some((username.to_owned(), password.to_owned()));
        self
    }

    /// Refuses every power-off reset with 400, as BMCs configured to do.
    pub fn refuse_power_off(mut self) -> Self {
        self.refuse_power_off = true;
        self
    }

    /// Writes the emulator's files into a fresh directory and starts it.
    ///
    /// # Guarantees
    /// On `Ok`, the emulator accepts connections on [`Sushy::port`], and is
    /// killed when the returned value drops.
    ///
    /// # Errors
    /// [`Error::NotInstalled`] when the executable is missing;
    /// [`Error::Exited`] or [`Error::NotListening`] with the emulator's log
    /// when it does not come up.
    pub fn start(self) -> Result<Sushy> {
        let program = emulator_path();
        if !program.is_file() {
            return Err(Error::NotInstalled { path: program });
        }
        let dir = TempDir::create("sushy").map_err(|source| Error::WriteFiles { path: std::env::temp_dir(), source })?;
        let certificates = if self.tls { Some(make_certificates(dir.path())?) } else { None };
        let auth_file = match &self.basic_auth {
            Some((username, password)) => {
                let hash = bcrypt::hash(password, 4).map_err(|source| Error::HashPassword { source })?;
                let path = dir.path().join("htpasswd");
                write(&path, &format!("{username}:{hash}\n"))?;
                Some(path)
            }
            None => None,
        };
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).map_err(|source| Error::WriteFiles { path: state_dir.clone(), source })?;
        let config = dir.path().join("emulator.conf");
        let mut sushy = Sushy { program, child: None, port: 0, config, log: Arc::default(), certificates, dir };
        let mut attempt = 1;
        loop {
            sushy.port = free_port().map_err(|source| Error::NoFreePort { source })?;
            write(&sushy.config, &self.config_text(sushy.port, &state_dir, auth_file.as_deref(), sushy.certificates.as_ref()))?;
            match sushy.spawn() {
                Err(Error::Exited { log, .. }) if attempt < START_ATTEMPTS && log.contains("Address already in use") => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
                Ok(()) => return Ok(sushy),
            }
        }
    }

    fn config_text(&self, port: u16, state_dir: &Path, auth_file: Option<&Path>, certificates: Option<&Certificates>) -> String {
        let mut text = String::new();
        let _ = writeln!(text, "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'");
        let _ = writeln!(text, "SUSHY_EMULATOR_LISTEN_PORT = {port}");
        let _ = writeln!(text, "SUSHY_EMULATOR_FAKE_DRIVER = True");
        let _ = writeln!(text, "SUSHY_EMULATOR_STATE_DIR = {}", python_str(&state_dir.to_string_lossy()));
        if let Some(path) = auth_file {
            let _ = writeln!(text, "SUSHY_EMULATOR_AUTH_FILE = {}", python_str(&path.to_string_lossy()));
        }
        if let Some(certs) = certificates {
            let _ = writeln!(text, "SUSHY_EMULATOR_SSL_CERT = {}", python_str(&certs.cert_pem.to_string_lossy()));
            let _ = writeln!(text, "SUSHY_EMULATOR_SSL_KEY = {}", python_str(&certs.key_pem.to_string_lossy()));
        }
        let _ = writeln!(text, "SUSHY_EMULATOR_DISABLE_POWER_OFF = {}", if self.refuse_power_off { "True" } else { "False" });
        let _ = writeln!(text, "SUSHY_EMULATOR_FAKE_SYSTEMS = [");
        for (i, (uuid, power)) in self.systems.iter().enumerate() {
            let _ =
                writeln!(text, "    {{'uuid': {}, 'name': 'system-{i:03}', 'power_state': '{}', 'nics': []}},", python_str(uuid), power.as_redfish());
        }
        text.push_str("]\n");
        text
    }
}

/// A running sushy-tools emulator; killed on drop.
#[derive(Debug)]
pub struct Sushy {
    program: PathBuf,
    child: Option<Child>,
    port: u16,
    config: PathBuf,
    /// The emulator's stderr (its access log among it), one entry a line,
    /// across restarts.
    log: Arc<Mutex<Vec<String>>>,
    certificates: Option<Certificates>,
    dir: TempDir,
}

impl Sushy {
    /// An emulator to configure, then [`SushyBuilder::start`].
    pub fn builder() -> SushyBuilder {
        SushyBuilder::default()
    }

    /// The loopback port it listens on (the same across [`Sushy::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`, or `https://` when it serves TLS.
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.port)
    }

    /// The URL of one system: `<endpoint>/redfish/v1/Systems/<uuid>`.
    pub fn system_url(&self, uuid: &str) -> String {
        format!("{}/redfish/v1/Systems/{uuid}", self.endpoint())
    }

    /// One system's address the way Metal3 writes it: `redfish+https://...`.
    pub fn metal3_address(&self, uuid: &str) -> String {
        format!("redfish+{}", self.system_url(uuid))
    }

    /// The CA, certificate and key when it serves TLS.
    pub fn certificates(&self) -> Option<&Certificates> {
        self.certificates.as_ref()
    }

    /// A directory of the emulator's own, removed on drop; tests may put
    /// files there (a password file, say).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the emulator logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).join("\n")
    }

    /// The reset actions on system `uuid` that the emulator answered with
    /// 204 (accepted), from its access log.
    pub fn resets(&self, uuid: &str) -> usize {
        let target = format!("/Systems/{uuid}/Actions/ComputerSystem.Reset HTTP/");
        self.count_resets(|line| line.contains(&target))
    }

    /// The reset actions it answered with 204, on any system.
    pub fn resets_answered(&self) -> usize {
        self.count_resets(|line| line.contains("/Actions/ComputerSystem.Reset HTTP/"))
    }

    fn count_resets(&self, on_target: impl Fn(&str) -> bool) -> usize {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.iter().filter(|line| line.contains("\"POST ") && on_target(line) && line.contains("\" 204 ")).count()
    }

    /// Kills the emulator (SIGKILL, as a BMC losing power) and waits for it.
    /// Its state stays, for [`Sushy::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with the same state (after
    /// [`Sushy::kill`], or killing it first).
    ///
    /// # Errors
    /// As [`SushyBuilder::start`]; the port may have been taken meanwhile.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    fn scheme(&self) -> &'static str {
        if self.certificates.is_some() { "https" } else { "http" }
    }

    fn spawn(&mut self) -> Result<()> {
        let mut child = Command::new(&self.program)
            .arg("--config")
            .arg(&self.config)
            .env("SUSHY_EMULATOR_CONFIG", &self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::Spawn { program: self.program.clone(), source })?;
        if let Some(stderr) = child.stderr.take() {
            let sink = self.log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).push(without_colours(&line));
                }
            });
        }
        self.child = Some(child);
        self.wait_until_listening()
    }

    fn wait_until_listening(&mut self) -> Result<()> {
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                // The reader thread may still be draining the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Err(Error::Exited { status, port: self.port, log: self.log_text() });
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(Error::NotListening { port: self.port, timeout: LISTEN_TIMEOUT, log: self.log_text() });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::WriteFiles { path: path.to_owned(), source })
}

/// `line` without the ANSI colour sequences (`ESC [ ... m`) werkzeug puts
/// around the request in its access log, so the log reads as text.
fn without_colours(line: &str) -> String {
    let mut text = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip `[`, the parameters and the final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            text.push(c);
        }
    }
    text
}

/// `s` as a single-quoted Python string literal.
fn python_str(s: &str) -> String {
    let mut quoted = String::with_capacity(s.len() + 2);
    quoted.push('\'');
    for c in s.chars() {
        if matches!(c, '\\' | '\'') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('\'');
    quoted
}

fn make_certificates(dir: &Path) -> Result<Certificates> {
    let (ca, cert, key) = test_pki("ironclaim test BMC CA").map_err(|source| Error::Certificates { source })?;
    let files = Certificates { ca_pem: dir.join("ca.pem"), cert_pem: dir.join("server.pem"), key_pem: dir.join("server-key.pem") };
    write(&files.ca_pem, &ca)?;
    write(&files.cert_pem, &cert)?;
    write(&files.key_pem, &key)?;
    Ok(files)
}

/// A CA named `ca_name` made for one test, and a server certificate it
/// signed for 127.0.0.1 and localhost: the PEM of the CA, the certificate
/// and the certificate's key.
pub(crate) fn test_pki(ca_name: &str) -> Result<(String, String, String), rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, ca_name);
    let ca = ca_params.self_signed(&ca_key)?;
    let ca_issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    let cert = params.signed_by(&key, &ca_issuer)?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_strings_escape_quotes_and_backslashes() {
        assert_eq!(python_str("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(python_str(r"it's a\b"), r"'it\'s a\\b'");
    }

    #[test]
    fn colours_are_taken_out_of_the_access_log() {
        let line = "127.0.0.1 - - [01/Dec/2026 12:04:55] \"\u{1b}[35m\u{1b}[1mPOST /redfish/v1/Systems/u-1/Actions/ComputerSystem.Reset HTTP/1.1\u{1b}[0m\" 204 -";
        assert_eq!(
            without_colours(line),
            "127.0.0.1 - - [01/Dec/2026 12:04:55] \"POST /redfish/v1/Systems/u-1/Actions/ComputerSystem.Reset HTTP/1.1\" 204 -"
        );
    }

    #[test]
    fn the_config_lists_every_system_with_its_power_state() {
        let builder = Sushy::builder().system("u-1", SystemPower::On).system("u-2", SystemPower::Off).refuse_power_off();
        let text = builder.config_text(8123, Path::new("/tmp/state"), None, None);
        assert!(text.contains("SUSHY_EMULATOR_LISTEN_PORT = 8123\n"), "{text}");
        assert!(text.contains("{'uuid': 'u-1', 'name': 'system-000', 'power_state': 'On', 'nics': []},"), "{text}");
        assert!(text.contains("{'uuid': 'u-2', 'name': 'system-001', 'power_state': 'Off', 'nics': []},"), "{text}");
        assert!(text.contains("SUSHY_EMULATOR_DISABLE_POWER_OFF = True\n"), "{text}");
        assert!(!text.contains("AUTH_FILE") && !text.contains("SSL_CERT"), "{text}");
    }
}
