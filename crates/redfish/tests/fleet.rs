//! The shared fleet against mock BMCs: every server behind one endpoint
//! shares one client (one session), resets to one endpoint never overlap,
//! and different endpoints are worked in parallel.

mod common;

use std::time::Duration;

use common::mock::{MockBmc, SYSTEM};
use common::{PASSWORD, USERNAME, mock_timing, password_file};
use ironclaim_redfish::{
    Bmc, BmcAddress, BmcFleet, Credentials, FleetOptions, PowerProvider, PowerState, RedfishProvider, ServerSpec, SystemSelector, TlsSettings,
};
use ironclaim_testenv::TempDir;
use tokio::time::Instant;

fn fleet() -> BmcFleet {
    BmcFleet::new(FleetOptions { timing: mock_timing(), ..FleetOptions::default() })
}

fn credentials(dir: &TempDir) -> Credentials {
    Credentials::from_password_file(USERNAME, &password_file(dir.path(), PASSWORD)).unwrap()
}

/// The client a server behind `mock` gets, asked for as the controller
/// asks: once per server, with its own copy of the settings.
fn client_for(fleet: &BmcFleet, mock: &MockBmc, dir: &TempDir) -> Bmc {
    let endpoint = BmcAddress::parse(&mock.endpoint()).unwrap().endpoint;
    fleet.client(&endpoint, &credentials(dir), &TlsSettings::default()).unwrap()
}

fn mockup_system() -> SystemSelector {
    SystemSelector::Path(SYSTEM.into())
}

fn other(id: &str) -> SystemSelector {
    SystemSelector::Id(id.into())
}

#[tokio::test]
async fn a_connection_closes_once_idle_and_serves_the_requests_of_one_step_before() {
    ironclaim_redfish::install_crypto_provider();
    let mock = chassis(&[], "On").await;
    let (endpoint, connections) = mock.counted_endpoint().await;
    let idle = Duration::from_millis(300);
    let fleet = BmcFleet::new(FleetOptions {
        timing: ironclaim_redfish::client::Timing { idle_connection: idle, ..mock_timing() },
        ..FleetOptions::default()
    });
    let dir = TempDir::new("fleet-idle");
    let bmc = fleet.client(&BmcAddress::parse(&endpoint).unwrap().endpoint, &credentials(&dir), &TlsSettings::default()).unwrap();
    for _ in 0..3 {
        assert_eq!(bmc.power_state(&mockup_system()).await.unwrap(), PowerState::On);
    }
    assert_eq!(connections.now(), (1, 0), "the reads one after the other share one connection");
    let waited = Instant::now();
    while connections.now().1 == 0 && waited.elapsed() < idle * 10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(connections.now(), (1, 1), "the idle connection is closed within {:?}", idle * 10);
    assert_eq!(bmc.power_state(&mockup_system()).await.unwrap(), PowerState::On);
    assert_eq!(connections.now().0, 2, "the next read opens a new connection");
}

/// A status read of a BMC that serves one system closes its connection
/// after the last read: the sweep that reads it comes back a period later,
/// and the idle connections of thousands of fast BMCs add up. A BMC known
/// to serve several systems keeps it for the next.
#[tokio::test]
async fn a_status_read_closes_the_connection_of_a_bmc_of_one_system() {
    ironclaim_redfish::install_crypto_provider();
    let idle = Duration::from_secs(60);
    let timing = ironclaim_redfish::client::Timing { idle_connection: idle, ..mock_timing() };
    let dir = TempDir::new("fleet-status");
    let client = |endpoint: &str| {
        let fleet = BmcFleet::new(FleetOptions { timing: timing.clone(), ..FleetOptions::default() });
        fleet.client(&BmcAddress::parse(endpoint).unwrap().endpoint, &credentials(&dir), &TlsSettings::default()).unwrap()
    };
    let closed_within = |connections: std::sync::Arc<common::mock::Connections>, wait: Duration| async move {
        let waited = Instant::now();
        while connections.now().1 == 0 && waited.elapsed() < wait {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        connections.now()
    };

    let one = chassis(&[], "On").await;
    let (endpoint, connections) = one.counted_endpoint().await;
    let bmc = client(&endpoint);
    let status = bmc.status(&mockup_system(), true).await.unwrap();
    assert_eq!(status.power_state, PowerState::On);
    assert_eq!(status.watts.expect("asked, and the system is on").unwrap().watts, 374.0);
    assert_eq!(closed_within(connections.clone(), Duration::from_secs(5)).await, (1, 1), "closed after the reading's read, long before {idle:?}");
    let again = bmc.status(&mockup_system(), false).await.unwrap();
    assert!(again.watts.is_none(), "watts are read only when asked");
    assert_eq!(again.identity, bmc.identity(&mockup_system()).await.unwrap());

    let many = chassis(&["blade-2"], "On").await;
    let (endpoint, connections) = many.counted_endpoint().await;
    let bmc = client(&endpoint);
    assert_eq!(bmc.status(&other("blade-2"), false).await.unwrap().power_state, PowerState::On);
    let status = bmc.status(&mockup_system(), true).await.unwrap();
    assert!(status.watts.expect("asked").is_ok());
    assert_eq!(closed_within(connections, Duration::from_millis(500)).await, (1, 0), "kept for the BMC's next system");
}

/// A mock BMC serving the mockup's system and `others` more, all `power`.
async fn chassis(others: &[&str], power: &str) -> MockBmc {
    let mock = MockBmc::start().await;
    {
        let mut w = mock.world();
        w.power = power.into();
        for id in others {
            w.add_system(id, power);
        }
    }
    mock
}

#[tokio::test]
async fn two_systems_behind_one_endpoint_share_one_session() {
    let (main, blade) = (mockup_system(), other("blade-2"));
    let mock = chassis(&["blade-2"], "On").await;
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let (a, b) = (client_for(&fleet, &mock, &dir), client_for(&fleet, &mock, &dir));
    for _ in 0..3 {
        let (state_a, state_b) = tokio::join!(a.power_state(&main), b.power_state(&blade));
        assert_eq!((state_a.unwrap(), state_b.unwrap()), (PowerState::On, PowerState::On));
    }
    assert_eq!(mock.world().logins, 1, "one login serves every system of the endpoint");
    assert_eq!(fleet.endpoint_count(), 1);

    mock.world().expire_sessions();
    let (state_a, state_b) = tokio::join!(a.power_state(&main), b.power_state(&blade));
    assert_eq!((state_a.unwrap(), state_b.unwrap()), (PowerState::On, PowerState::On));
    assert_eq!(mock.world().logins, 2, "an expired session is replaced once, for both systems");
}

#[tokio::test]
async fn power_actions_on_one_endpoint_never_overlap() {
    let mock = chassis(&["blade-2", "blade-3"], "Off").await;
    mock.world().reset_delay = Duration::from_millis(150);
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let servers = [mockup_system(), other("blade-2"), other("blade-3")];
    let clients: Vec<Bmc> = servers.iter().map(|_| client_for(&fleet, &mock, &dir)).collect();
    let outcomes = tokio::join!(clients[0].power_on(&servers[0]), clients[1].power_on(&servers[1]), clients[2].power_on(&servers[2]));
    for outcome in [outcomes.0, outcomes.1, outcomes.2] {
        assert_eq!(outcome.unwrap().state, PowerState::On);
    }
    let mut w = mock.world();
    assert_eq!(w.reset_log.len(), 3, "{:?}", w.reset_log);
    assert_eq!(w.max_resets_in_flight, 1, "resets to one BMC overlapped: {:?}", w.reset_log);
    for (i, first) in w.reset_log.iter().enumerate() {
        for second in &w.reset_log[i + 1..] {
            assert!(!first.overlaps(second), "{first:?} overlaps {second:?}");
        }
    }
    for system in [SYSTEM, "/redfish/v1/Systems/blade-2", "/redfish/v1/Systems/blade-3"] {
        assert_eq!(w.power_of(system), "On", "{system}");
    }
    assert_eq!(w.logins, 1);
}

#[tokio::test]
async fn power_actions_on_different_endpoints_run_in_parallel() {
    let main = mockup_system();
    let (first, second) = (chassis(&[], "Off").await, chassis(&[], "Off").await);
    for mock in [&first, &second] {
        mock.world().reset_delay = Duration::from_millis(300);
    }
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let (a, b) = (client_for(&fleet, &first, &dir), client_for(&fleet, &second, &dir));
    let (on_a, on_b) = tokio::join!(a.power_on(&main), b.power_on(&main));
    assert_eq!((on_a.unwrap().state, on_b.unwrap().state), (PowerState::On, PowerState::On));
    let (reset_a, reset_b) = (first.world().reset_log[0].clone(), second.world().reset_log[0].clone());
    assert!(reset_a.overlaps(&reset_b), "two BMCs were reset one after the other: {reset_a:?} then {reset_b:?}");
    assert_eq!(fleet.endpoint_count(), 2);
}

#[tokio::test]
async fn reads_go_on_while_a_reset_to_the_same_endpoint_is_in_flight() {
    let (main, blade) = (mockup_system(), other("blade-2"));
    let mock = chassis(&["blade-2"], "Off").await;
    mock.world().reset_delay = Duration::from_millis(800);
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let (a, b) = (client_for(&fleet, &mock, &dir), client_for(&fleet, &mock, &dir));
    b.power_state(&blade).await.unwrap();
    let reading = async {
        // Well inside the reset's 800 ms.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let state = b.power_state(&blade).await.unwrap();
        (state, Instant::now())
    };
    let (on, (state, read_at)) = tokio::join!(a.power_on(&main), reading);
    on.unwrap();
    assert_eq!(state, PowerState::Off);
    let reset = mock.world().reset_log[0].clone();
    assert!(read_at < reset.answered, "the read waited for the reset to be answered: {reset:?}, read at {read_at:?}");
}

#[tokio::test]
async fn one_system_powered_on_twice_at_once_is_reset_once() {
    let main = mockup_system();
    let mock = chassis(&[], "Off").await;
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let (a, b) = (client_for(&fleet, &mock, &dir), client_for(&fleet, &mock, &dir));
    let (first, second) = tokio::join!(a.power_on(&main), b.power_on(&main));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(mock.world().reset_log.len(), 1);
    assert!(first.was_no_op() != second.was_no_op(), "one sent the reset, the other found the system on");
}

#[tokio::test]
async fn changed_settings_rebuild_the_client_and_the_old_one_logs_out() {
    let main = mockup_system();
    let mock = chassis(&[], "On").await;
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let endpoint = BmcAddress::parse(&mock.endpoint()).unwrap().endpoint;

    let wrong = Credentials::from_password_file(USERNAME, &password_file(dir.path(), "stale")).unwrap();
    let stale = fleet.client(&endpoint, &wrong, &TlsSettings::default()).unwrap();
    assert_eq!(stale.power_state(&main).await.unwrap_err().metric_label(), "auth_failed");
    // The Secret is fixed: the next call gets a client with the new password.
    let fixed = client_for(&fleet, &mock, &dir);
    assert!(!fixed.is_same_client(&stale));
    assert_eq!(fixed.power_state(&main).await.unwrap(), PowerState::On);
    assert_eq!(mock.world().logins, 1);

    // New TLS settings for the endpoint: a new client, a new session, and
    // the replaced client closes its own once nobody holds it.
    let insecure = TlsSettings { ca_file: None, insecure_skip_verify: true };
    let rebuilt = fleet.client(&endpoint, &credentials(&dir), &insecure).unwrap();
    assert!(!rebuilt.is_same_client(&fixed));
    rebuilt.power_state(&main).await.unwrap();
    assert_eq!(mock.world().logins, 2);
    drop(fixed);
    wait_for_logouts(&mock, 1).await;
    assert_eq!(fleet.endpoint_count(), 1);
}

#[tokio::test]
async fn an_unused_endpoint_past_the_bound_is_dropped_and_logged_out() {
    let main = mockup_system();
    let (first, second) = (chassis(&[], "On").await, chassis(&[], "On").await);
    let dir = TempDir::new("fleet");
    let fleet = BmcFleet::new(FleetOptions { max_endpoints: 1, timing: mock_timing(), ..FleetOptions::default() });
    client_for(&fleet, &first, &dir).power_state(&main).await.unwrap();
    let held = client_for(&fleet, &second, &dir);
    held.power_state(&main).await.unwrap();
    assert_eq!(fleet.endpoint_count(), 1);
    wait_for_logouts(&first, 1).await;
    // An endpoint in use is kept, even past the bound.
    let again = client_for(&fleet, &first, &dir);
    assert_eq!(fleet.endpoint_count(), 2);
    assert!(held.is_same_client(&client_for(&fleet, &second, &dir)));
    drop(again);
}

#[tokio::test]
async fn providers_on_one_fleet_share_its_sessions() {
    let mock = chassis(&["blade-2"], "On").await;
    let dir = TempDir::new("fleet");
    let fleet = fleet();
    let endpoint = BmcAddress::parse(&mock.endpoint()).unwrap().endpoint;
    let spec = |name: &str, system: SystemSelector| ServerSpec {
        name: name.into(),
        endpoint: endpoint.clone(),
        system,
        credentials: credentials(&dir),
        tls: TlsSettings::default(),
    };
    let one = RedfishProvider::with_fleet(vec![spec("a", mockup_system())], &fleet).unwrap();
    let two = RedfishProvider::with_fleet(vec![spec("b", other("blade-2"))], &fleet).unwrap();
    assert_eq!(one.power_state("a").await.unwrap(), PowerState::On);
    assert_eq!(two.power_state("b").await.unwrap(), PowerState::On);
    assert_eq!(mock.world().logins, 1);
}

async fn wait_for_logouts(mock: &MockBmc, logouts: u32) {
    for _ in 0..200 {
        if mock.world().logouts >= logouts {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {logouts} logout(s), saw {}", mock.world().logouts);
}

/// CPU seconds this process has used so far (user and system), from
/// /proc/self/stat; None where there is no /proc.
fn cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Reads the power state of `n` BMCs, one system each, through one
/// shared fleet; returns the wall time and how many answered On.
async fn sweep(n: usize, options: FleetOptions) -> (Duration, usize, Vec<MockBmc>) {
    let mut mocks = Vec::with_capacity(n);
    for _ in 0..n {
        mocks.push(chassis(&[], "On").await);
    }
    let dir = TempDir::new("sweep");
    let fleet = BmcFleet::new(options);
    let clients: Vec<Bmc> = mocks.iter().map(|m| client_for(&fleet, m, &dir)).collect();
    let system = mockup_system();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in clients {
        let system = system.clone();
        tasks.spawn(async move { c.power_state(&system).await });
    }
    let mut on = 0;
    while let Some(answer) = tasks.join_next().await {
        on += usize::from(matches!(answer, Ok(Ok(PowerState::On))));
    }
    let took = started.elapsed();
    (took, on, mocks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_of_many_bmcs_reads_each_once_with_one_login_each() {
    let (_, on, mocks) = sweep(40, FleetOptions { timing: mock_timing(), max_concurrent_requests: 8, ..FleetOptions::default() }).await;
    assert_eq!(on, 40, "every BMC answered On");
    assert!(mocks.iter().all(|m| m.world().logins == 1), "one session per BMC");
}

/// The fleet sweep at the size of a rack row: 500 BMCs, each its own
/// endpoint serving the DMTF mockup, status of all through one fleet.
/// Prints the wall time and the process's CPU per BMC (the mock BMCs run
/// in the same process, so it bounds ironclaim's own cost from above).
///
///     cargo test --release -p ironclaim-redfish --test fleet -- --ignored --nocapture fleet_sweep
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored --nocapture"]
async fn fleet_sweep_of_500_bmcs() {
    for concurrency in [16, 64, 256] {
        let before = cpu_s();
        let options = FleetOptions { timing: mock_timing(), max_concurrent_requests: concurrency, ..FleetOptions::default() };
        let (took, on, mocks) = sweep(500, options).await;
        let cpu = cpu_s().zip(before).map(|(a, b)| a - b);
        assert_eq!(on, 500);
        println!(
            "500 BMCs, {concurrency} requests in flight: {:.2} s wall, {} ms CPU per BMC (login, system read; mock included)",
            took.as_secs_f64(),
            cpu.map_or("?".to_string(), |c| format!("{:.2}", c * 1000.0 / 500.0))
        );
        drop(mocks);
    }
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

/// What a BMC client costs in memory, as the controller holds one per
/// Server when each has a BMC of its own: built, and then after one read
/// each over a connection kept alive. Run with `cargo test --release -p
/// ironclaim-redfish --test fleet -- --ignored --nocapture
/// the_memory_of_bmc_clients`; `IRONCLAIM_BMC_CLIENTS` sets how many
/// (default 2,000). The mock BMC's side of the connections is in the same
/// process: `served` is its share, measured with connections that do not
/// go through a client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, printed"]
async fn the_memory_of_bmc_clients() {
    ironclaim_redfish::install_crypto_provider();
    let n: usize = std::env::var("IRONCLAIM_BMC_CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let mock = chassis(&[], "On").await;
    let mut endpoints = Vec::with_capacity(n);
    for _ in 0..n {
        endpoints.push(mock.listen_again().await);
    }
    // The server side of n kept-alive connections, through bare sockets.
    let before_served = rss_kib();
    let mut sockets = Vec::with_capacity(n);
    for e in &endpoints {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = e.trim_start_matches("http://");
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET /redfish/v1 HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 512];
        let _ = s.read(&mut buf).await.unwrap();
        sockets.push(s);
    }
    let served = rss_kib().saturating_sub(before_served);
    drop(sockets);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let dir = TempDir::new("fleet-memory");
    let fleet = BmcFleet::new(FleetOptions { timing: mock_timing(), max_endpoints: usize::MAX, ..FleetOptions::default() });
    let before = rss_kib();
    let clients: Vec<Bmc> = endpoints
        .iter()
        .map(|e| fleet.client(&BmcAddress::parse(&format!("{e}{SYSTEM}")).unwrap().endpoint, &credentials(&dir), &TlsSettings::default()).unwrap())
        .collect();
    let built = rss_kib().saturating_sub(before);
    for c in &clients {
        assert_eq!(c.power_state(&mockup_system()).await.unwrap(), PowerState::On);
    }
    let used = rss_kib().saturating_sub(before);
    println!(
        "{n} BMC clients: built {} KiB each; after one read each {} KiB each, of which the mock's side of a connection about {} KiB",
        built / n as u64,
        used / n as u64,
        served / n as u64
    );
}
