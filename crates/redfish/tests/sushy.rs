//! Against sushy-tools, the Redfish emulator of OpenStack Ironic and Metal3
//! CI, run with its fake driver, Basic auth from a bcrypt htpasswd file and
//! TLS from a certificate made by the test. Install it with
//! `hack/redfish-emulator-setup`; without it these tests fail.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{PASSWORD, Sushy, SystemPower, USERNAME, ca_pem, fake_system, password_file, sushy_timing, sushy_with};
use ironclaim_redfish::provider::ProviderOptions;
use ironclaim_redfish::{
    Bmc, BmcAddress, BmcConfig, Credentials, Error, PowerProvider, PowerState, RedfishProvider, ResetType, ServerSpec, SystemSelector, TlsSettings,
};
use tokio::sync::Semaphore;

fn bmc_for(sushy: &Sushy, password: &str) -> Bmc {
    let creds = Credentials::from_password_file(USERNAME, &password_file(sushy.dir(), password)).unwrap();
    let mut config = BmcConfig::new(BmcAddress::parse(&sushy.endpoint()).unwrap().endpoint, creds);
    config.tls = TlsSettings { ca_file: Some(ca_pem(sushy)), insecure_skip_verify: false };
    config.timing = sushy_timing();
    Bmc::new(config, Arc::new(Semaphore::new(8))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_powers_a_system_on_and_off_over_tls_with_basic_auth() {
    let systems: Vec<_> = (0..3).map(|i| fake_system(i, SystemPower::Off)).collect();
    let sushy = sushy_with(&systems).start().unwrap();
    let target = &systems[1].0;

    // Named the way Metal3 writes it.
    let address = BmcAddress::parse(&sushy.metal3_address(target)).unwrap();
    let creds = Credentials::from_password_file(USERNAME, &password_file(sushy.dir(), PASSWORD)).unwrap();
    let spec = ServerSpec {
        name: "node-1".into(),
        endpoint: address.endpoint.clone(),
        system: address.system.clone().unwrap(),
        credentials: creds,
        tls: TlsSettings { ca_file: Some(ca_pem(&sushy)), insecure_skip_verify: false },
    };
    let options = ProviderOptions { timing: sushy_timing(), ..ProviderOptions::default() };
    let provider = RedfishProvider::new(vec![spec], options).unwrap();

    assert_eq!(provider.power_state("node-1").await.unwrap(), PowerState::Off);
    let on = provider.power_on("node-1").await.unwrap_or_else(|e| panic!("power on: {e:#?}\n{}", sushy.log_text()));
    assert_eq!(on.state, PowerState::On);
    assert_eq!(on.sent, vec![ResetType::On]);
    assert_eq!(provider.power_state("node-1").await.unwrap(), PowerState::On);

    let again = provider.power_on("node-1").await.unwrap();
    assert!(again.was_no_op(), "power on of a system already on must send nothing: {again:?}");

    let off = provider.power_off("node-1").await.unwrap_or_else(|e| panic!("power off: {e:#?}\n{}", sushy.log_text()));
    assert_eq!(off.state, PowerState::Off);
    assert_eq!(off.sent, vec![ResetType::GracefulShutdown]);
    assert_eq!(provider.power_state("node-1").await.unwrap(), PowerState::Off);

    // The neighbours were never touched; one is found by its UUID.
    let bmc = bmc_for(&sushy, PASSWORD);
    for (uuid, _) in [&systems[0], &systems[2]] {
        assert_eq!(bmc.power_state(&SystemSelector::parse(uuid).unwrap()).await.unwrap(), PowerState::Off);
    }
    let resets = sushy.resets_answered();
    assert_eq!(resets, 2, "exactly one On and one GracefulShutdown reached the emulator");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_with_a_wrong_password_is_auth_failed() {
    let systems = vec![fake_system(0, SystemPower::Off)];
    let sushy = sushy_with(&systems).start().unwrap();
    let bmc = bmc_for(&sushy, "not the password");
    let err = bmc.power_on(&SystemSelector::parse(&systems[0].0).unwrap()).await.unwrap_err();
    assert_eq!(err.metric_label(), "auth_failed", "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("not the password"), "the password leaked: {shown}");
    assert_eq!(sushy.resets_answered(), 0, "no action may be accepted without authentication");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_certificate_from_an_untrusted_ca_is_refused_unless_skipping_is_explicit() {
    let systems = vec![fake_system(0, SystemPower::Off)];
    let sushy = sushy_with(&systems).start().unwrap();
    let selector = SystemSelector::parse(&systems[0].0).unwrap();
    let endpoint = BmcAddress::parse(&sushy.endpoint()).unwrap().endpoint;
    let creds = Credentials::from_password_file(USERNAME, &password_file(sushy.dir(), PASSWORD)).unwrap();

    // Default settings: the system trust store, which does not know the test CA.
    let mut config = BmcConfig::new(endpoint.clone(), creds.clone());
    config.timing = sushy_timing();
    let err = Bmc::new(config, Arc::new(Semaphore::new(2))).unwrap().power_state(&selector).await.unwrap_err();
    assert_eq!(err.metric_label(), "tls_handshake_failed", "{err:?}");

    let mut config = BmcConfig::new(endpoint, creds);
    config.timing = sushy_timing();
    config.tls = TlsSettings { ca_file: None, insecure_skip_verify: true };
    let bmc = Bmc::new(config, Arc::new(Semaphore::new(2))).unwrap();
    assert_eq!(bmc.power_state(&selector).await.unwrap(), PowerState::Off);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_refusing_power_off_is_a_typed_rejection() {
    let systems = vec![fake_system(0, SystemPower::On)];
    let sushy = sushy_with(&systems).refuse_power_off().start().unwrap();
    let bmc = bmc_for(&sushy, PASSWORD);
    let err = bmc.power_off(&SystemSelector::parse(&systems[0].0).unwrap()).await.unwrap_err();
    match &err {
        Error::ActionRejected { reset_type, status, message } => {
            assert_eq!((*reset_type, *status), (ResetType::ForceOff, 400), "{err:?}");
            assert!(message.contains("disabled"), "the BMC's reason is kept: {message}");
        }
        other => panic!("expected ActionRejected, got {other:?}"),
    }
    assert_eq!(bmc.power_state(&SystemSelector::parse(&systems[0].0).unwrap()).await.unwrap(), PowerState::On);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_killed_mid_action_is_unreachable() {
    let systems = vec![fake_system(0, SystemPower::Off)];
    let mut sushy = sushy_with(&systems).start().unwrap();
    let creds = Credentials::from_password_file(USERNAME, &password_file(sushy.dir(), PASSWORD)).unwrap();
    let mut config = BmcConfig::new(BmcAddress::parse(&sushy.endpoint()).unwrap().endpoint, creds);
    config.tls = TlsSettings { ca_file: Some(ca_pem(&sushy)), insecure_skip_verify: false };
    // The first confirmation read comes well after the emulator is gone.
    config.timing = ironclaim_redfish::Timing { poll_initial: Duration::from_secs(3), ..sushy_timing() };
    let bmc = Bmc::new(config, Arc::new(Semaphore::new(4))).unwrap();
    let selector = SystemSelector::parse(&systems[0].0).unwrap();
    let action = tokio::spawn(async move { bmc.power_on(&selector).await });

    let deadline = Instant::now() + Duration::from_secs(30);
    while sushy.resets_answered() == 0 {
        assert!(Instant::now() < deadline, "the reset never reached the emulator: {}", sushy.log_text());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The emulator logs the reset as answered before the answer reaches
    // the client: a kill at once may cut it off, and the client rightly
    // reports the reset itself unreachable. Killed a second later, the
    // answer is in and the first confirmation read (at 3 s) is not.
    tokio::time::sleep(Duration::from_secs(1)).await;
    sushy.kill();

    let err = action.await.unwrap().unwrap_err();
    assert_eq!(err.metric_label(), "unreachable", "{err:?}");
    assert!(err.to_string().contains("confirming the power state"), "the failed step is named: {err}");
}

/// A status sweep of 500 systems on one emulator with at most 16 requests
/// in flight. Prints the time; asserts only correctness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_status_sweep_of_500_systems() {
    const SYSTEMS: usize = 500;
    let systems: Vec<_> = (0..SYSTEMS).map(|i| fake_system(i, if i % 3 == 0 { SystemPower::On } else { SystemPower::Off })).collect();
    let sushy = sushy_with(&systems).start().unwrap();
    let creds = Credentials::from_password_file(USERNAME, &password_file(sushy.dir(), PASSWORD)).unwrap();
    let endpoint = BmcAddress::parse(&sushy.endpoint()).unwrap().endpoint;
    let specs = systems
        .iter()
        .enumerate()
        .map(|(i, (uuid, _))| ServerSpec {
            name: format!("node-{i:03}"),
            endpoint: endpoint.clone(),
            system: SystemSelector::parse(uuid).unwrap(),
            credentials: creds.clone(),
            tls: TlsSettings { ca_file: Some(ca_pem(&sushy)), insecure_skip_verify: false },
        })
        .collect();
    let options = ProviderOptions { max_concurrent_requests: 16, timing: sushy_timing(), ..ProviderOptions::default() };
    let provider = RedfishProvider::new(specs, options).unwrap();

    let started = Instant::now();
    let statuses = provider.status_sweep().await;
    let elapsed = started.elapsed();

    assert_eq!(statuses.len(), SYSTEMS);
    for (i, status) in statuses.iter().enumerate() {
        assert_eq!(status.name, format!("node-{i:03}"));
        let expected = if i % 3 == 0 { PowerState::On } else { PowerState::Off };
        match &status.result {
            Ok(state) => assert_eq!(state, &expected, "{}", status.name),
            Err(err) => panic!("{}: {err:#?}", status.name),
        }
    }
    let slowest = statuses.iter().map(|s| s.latency).max().unwrap_or_default();
    println!(
        "status sweep of {SYSTEMS} sushy-tools systems, 16 requests in flight: {:.2} s ({:.1} systems/s, slowest {:.0} ms)",
        elapsed.as_secs_f64(),
        SYSTEMS as f64 / elapsed.as_secs_f64(),
        slowest.as_secs_f64() * 1000.0
    );
}
