//! Against the DMTF public-rackmount1 mockup payloads, served by a mock BMC
//! that adds sessions, ETags, task monitors, ActionInfo and faults.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::mock::{ACTION_INFO, MockBmc, SYSTEM, SYSTEM_UUID};
use common::{PASSWORD, USERNAME, mock_timing, password_file};
use ironclaim_redfish::discover::Fact;
use ironclaim_redfish::provider::ProviderOptions;
use ironclaim_redfish::{
    AuthMode, Bmc, BmcAddress, BmcConfig, Credentials, Error, PowerProvider, PowerState, RedfishProvider, ResetType, ServerSpec, SystemSelector,
    Timing, WattsSource,
};
use ironclaim_testenv::TempDir;
use serde_json::json;
use tokio::sync::Semaphore;

struct Fixture {
    mock: MockBmc,
    dir: TempDir,
}

impl Fixture {
    async fn start() -> Self {
        Fixture { mock: MockBmc::start().await, dir: TempDir::new("mockup") }
    }

    fn credentials(&self, password: &str) -> Credentials {
        Credentials::from_password_file(USERNAME, &password_file(self.dir.path(), password)).unwrap()
    }

    fn bmc_with(&self, password: &str, timing: Timing) -> Bmc {
        let endpoint = BmcAddress::parse(&self.mock.endpoint()).unwrap().endpoint;
        let mut config = BmcConfig::new(endpoint, self.credentials(password));
        config.timing = timing;
        Bmc::new(config, Arc::new(Semaphore::new(8))).unwrap()
    }

    fn bmc(&self) -> Bmc {
        self.bmc_with(PASSWORD, mock_timing())
    }
}

fn system() -> SystemSelector {
    SystemSelector::Id("437XR1138R2".into())
}

#[tokio::test]
async fn one_session_serves_every_request_and_shutdown_logs_out() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    for _ in 0..3 {
        assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    }
    {
        let w = f.mock.world();
        assert_eq!(w.logins, 1);
        assert_eq!(w.basic_requests, 0, "with sessions offered, Basic auth is not used");
        assert!(w.token_requests >= 3);
    }
    bmc.logout().await.unwrap();
    let w = f.mock.world();
    assert_eq!(w.logouts, 1);
    assert!(w.tokens.is_empty(), "the session was deleted on the BMC");
}

#[tokio::test]
async fn dropping_the_client_logs_out_in_the_background() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    bmc.power_state(&system()).await.unwrap();
    drop(bmc);
    for _ in 0..100 {
        if f.mock.world().logouts == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a dropped client must close its session");
}

#[tokio::test]
async fn expired_session_token_is_replaced_by_one_new_login() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    bmc.power_state(&system()).await.unwrap();
    f.mock.world().expire_sessions();
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    assert_eq!(f.mock.world().logins, 2);
}

#[tokio::test]
async fn wrong_password_at_session_login_is_auth_failed() {
    let f = Fixture::start().await;
    let err = f.bmc_with("guess", mock_timing()).power_state(&system()).await.unwrap_err();
    assert!(matches!(err, Error::AuthFailed { status: 401, .. }), "{err:?}");
    assert!(err.to_string().contains("logging in"), "{err}");
}

#[tokio::test]
async fn basic_auth_is_used_when_no_session_service_is_offered() {
    let f = Fixture::start().await;
    f.mock.world().basic_only = true;
    let bmc = f.bmc();
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    let w = f.mock.world();
    assert_eq!((w.logins, w.token_requests), (0, 0));
    assert!(w.basic_requests >= 1);
}

#[tokio::test]
async fn forced_basic_auth_with_wrong_password_is_auth_failed() {
    let f = Fixture::start().await;
    let endpoint = BmcAddress::parse(&f.mock.endpoint()).unwrap().endpoint;
    let mut config = BmcConfig::new(endpoint, f.credentials("guess"));
    config.auth = AuthMode::Basic;
    config.timing = mock_timing();
    let err = Bmc::new(config, Arc::new(Semaphore::new(2))).unwrap().power_state(&system()).await.unwrap_err();
    assert_eq!(err.metric_label(), "auth_failed");
}

/// The cache keeps, per URL, what the last full reader took, so a 304
/// answers only a reader of that kind: after a power read (a few fields),
/// the inventory (the whole body) reads the System in full, as does the
/// next power read; the one after that is answered 304.
#[tokio::test]
async fn a_304_answers_only_a_reader_whose_copy_is_cached() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    let fresh = f.mock.world().not_modified;
    let inventory = bmc.inventory(Some(&system())).await.unwrap();
    assert_eq!(f.mock.world().not_modified, fresh, "the power read's parsed fields cannot answer the inventory's read of the whole System");
    assert_eq!(format!("{inventory:?}"), format!("{:?}", f.bmc().inventory(Some(&system())).await.unwrap()), "a full read, as by a new client");
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    assert!(f.mock.world().not_modified > fresh, "a repeated power read is answered 304");
}

#[tokio::test]
async fn etag_turns_repeat_reads_into_not_modified_until_the_state_changes() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    assert!(f.mock.world().not_modified >= 1, "the second read must be answered 304");
    f.mock.world().power = "Off".into();
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::Off, "a changed ETag means a fresh body");
}

#[tokio::test]
async fn system_is_found_by_id_by_uuid_and_by_metal3_address() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    let metal3 = BmcAddress::parse(&format!("redfish+http://{}{SYSTEM}", f.mock.addr)).unwrap();
    for selector in [system(), SystemSelector::parse(SYSTEM_UUID).unwrap(), metal3.system.unwrap()] {
        assert_eq!(bmc.resolve(&selector).await.unwrap(), SYSTEM, "{selector}");
    }
    let err = bmc.power_state(&SystemSelector::Id("nope".into())).await.unwrap_err();
    assert_eq!(err.metric_label(), "system_not_found");
}

#[tokio::test]
async fn power_off_is_graceful_and_confirmed() {
    let f = Fixture::start().await;
    let outcome = f.bmc().power_off(&system()).await.unwrap();
    assert_eq!(outcome.sent, vec![ResetType::GracefulShutdown]);
    assert_eq!(outcome.state, PowerState::Off);
    assert_eq!(f.mock.world().power, "Off");
}

#[tokio::test]
async fn power_on_with_a_task_monitor_is_followed_to_completion() {
    let f = Fixture::start().await;
    {
        let mut w = f.mock.world();
        w.power = "Off".into();
        w.task_polls = Some(3);
    }
    let outcome = f.bmc().power_on(&system()).await.unwrap();
    assert_eq!(outcome.sent, vec![ResetType::On]);
    assert_eq!(f.mock.world().task_polls_seen, 3);
}

#[tokio::test]
async fn failed_task_is_reported_with_its_message() {
    let f = Fixture::start().await;
    {
        let mut w = f.mock.world();
        w.power = "Off".into();
        w.task_polls = Some(1);
        w.task_fails = true;
    }
    let err = f.bmc().power_on(&system()).await.unwrap_err();
    match err {
        Error::TaskFailed { state, message, reset_type, .. } => {
            assert_eq!((state.as_str(), reset_type), ("Exception", ResetType::On));
            assert!(message.contains("Exception"), "{message}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn reset_types_listed_in_action_info_decide_the_power_on_type() {
    let f = Fixture::start().await;
    {
        let mut w = f.mock.world();
        w.power = "Off".into();
        w.action_info = Some(vec!["ForceOn".into(), "ForceOff".into(), "PushPowerButton".into()]);
    }
    let outcome = f.bmc().power_on(&system()).await.unwrap();
    assert_eq!(outcome.sent, vec![ResetType::ForceOn]);
    let w = f.mock.world();
    assert!(w.action_info_reads >= 1, "{ACTION_INFO} was read");
    assert_eq!(w.resets, vec!["ForceOn"]);
}

#[tokio::test]
async fn action_info_without_a_power_on_type_is_action_not_supported() {
    let f = Fixture::start().await;
    {
        let mut w = f.mock.world();
        w.power = "Off".into();
        w.action_info = Some(vec!["ForceOff".into(), "Nmi".into()]);
    }
    let err = f.bmc().power_on(&system()).await.unwrap_err();
    assert_eq!(err.metric_label(), "action_not_supported", "{err:?}");
    assert!(f.mock.world().resets.is_empty());
}

#[tokio::test]
async fn action_accepted_but_never_applied_is_resent_once_then_reported() {
    let f = Fixture::start().await;
    {
        let mut w = f.mock.world();
        w.power = "Off".into();
        w.drop_resets = u32::MAX;
    }
    let err = f.bmc().power_on(&system()).await.unwrap_err();
    match err {
        Error::TimedOutWaitingForState { expected, last_seen, sends, reset_type, .. } => {
            assert_eq!((expected, last_seen, sends, reset_type), (PowerState::On, PowerState::Off, 2, ResetType::On));
        }
        other => panic!("expected TimedOutWaitingForState, got {other:?}"),
    }
    assert_eq!(f.mock.world().resets, vec!["On", "On"], "sent exactly twice");
}

#[tokio::test]
async fn action_dropped_once_succeeds_on_the_resend() {
    let f = Fixture::start().await;
    {
        let mut w = f.mock.world();
        w.power = "Off".into();
        w.drop_resets = 1;
    }
    let outcome = f.bmc().power_on(&system()).await.unwrap();
    assert_eq!(outcome.sent, vec![ResetType::On, ResetType::On]);
    assert_eq!(f.mock.world().power, "On");
}

#[tokio::test]
async fn watts_come_from_environment_metrics_or_chassis_power() {
    let newer = Fixture::start().await;
    let watts = newer.bmc().watts(&system()).await.unwrap();
    assert_eq!((watts.watts, watts.source), (374.0, WattsSource::EnvironmentMetrics));
    assert_eq!(watts.resource, "/redfish/v1/Chassis/1U/EnvironmentMetrics");

    let older = Fixture::start().await;
    older.mock.world().hide_environment_metrics = true;
    let watts = older.bmc().watts(&system()).await.unwrap();
    assert_eq!((watts.watts, watts.source), (344.0, WattsSource::PowerControl));
}

#[tokio::test]
async fn fleet_watts_sum_the_servers_that_answered() {
    let newer = Fixture::start().await;
    let older = Fixture::start().await;
    older.mock.world().hide_environment_metrics = true;
    let silent = Fixture::start().await;
    silent.mock.world().replace.insert("/redfish/v1/Chassis/1U/EnvironmentMetrics".into(), json!({"PowerWatts": {}}));
    silent.mock.world().replace.insert("/redfish/v1/Chassis/1U/Power".into(), json!({"PowerControl": []}));
    let spec = |name: &str, f: &Fixture| ServerSpec {
        name: name.into(),
        endpoint: BmcAddress::parse(&f.mock.endpoint()).unwrap().endpoint,
        system: system(),
        credentials: f.credentials(PASSWORD),
        tls: Default::default(),
    };
    let options = ProviderOptions { timing: mock_timing(), ..ProviderOptions::default() };
    let provider = RedfishProvider::new(vec![spec("a", &newer), spec("b", &older), spec("c", &silent)], options).unwrap();
    let fleet = provider.fleet_watts().await;
    assert_eq!(fleet.total_watts, 374.0 + 344.0);
    let c = &fleet.readings[2];
    assert_eq!(c.0, "c");
    assert_eq!(c.1.as_ref().unwrap_err().metric_label(), "watts_unavailable");
    assert_eq!(provider.list().await.unwrap(), vec!["a", "b", "c"]);
    assert_eq!(provider.watts("zz").await.unwrap_err().metric_label(), "unknown_server");
}

#[tokio::test]
async fn a_passing_server_error_is_retried_and_a_lasting_one_reported() {
    let f = Fixture::start().await;
    let bmc = f.bmc();
    bmc.power_state(&system()).await.unwrap();
    f.mock.world().fail_next = 1;
    assert_eq!(bmc.power_state(&system()).await.unwrap(), PowerState::On);
    f.mock.world().fail_next = 100;
    let err = bmc.power_state(&system()).await.unwrap_err();
    assert!(matches!(err, Error::HttpStatus { status: 500, .. }), "{err:?}");
    assert!(err.to_string().contains("internal error injected"), "the BMC's message is kept: {err}");
}

#[tokio::test]
async fn slow_answer_past_the_timeout_is_request_timed_out() {
    let f = Fixture::start().await;
    f.mock.world().slow = Some((SYSTEM.into(), Duration::from_secs(3)));
    let timing = Timing { request_timeout: Duration::from_millis(300), retries: 1, ..mock_timing() };
    let err = f.bmc_with(PASSWORD, timing).power_state(&system()).await.unwrap_err();
    assert_eq!(err.metric_label(), "request_timed_out", "{err:?}");
}

#[tokio::test]
async fn truncated_json_is_a_malformed_payload_at_the_root() {
    let f = Fixture::start().await;
    f.mock.world().truncate = Some(SYSTEM.into());
    let err = f.bmc().power_state(&system()).await.unwrap_err();
    match err {
        Error::MalformedPayload { path, .. } => assert_eq!(path, "$"),
        other => panic!("expected MalformedPayload, got {other:?}"),
    }
}

#[tokio::test]
async fn power_state_of_the_wrong_type_names_its_json_path() {
    let f = Fixture::start().await;
    let mut body: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::mockup_dir().join("Systems/437XR1138R2/index.json")).unwrap()).unwrap();
    body["PowerState"] = json!(1);
    f.mock.world().replace.insert(SYSTEM.into(), body.clone());
    let err = f.bmc().power_state(&system()).await.unwrap_err();
    assert!(matches!(&err, Error::MalformedPayload { path, .. } if path == "$.PowerState"), "{err:?}");

    body["PowerState"] = json!("On");
    body["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = json!("On");
    f.mock.world().replace.insert(SYSTEM.into(), body);
    let err = f.bmc().power_off(&system()).await.unwrap_err();
    assert!(
        matches!(&err, Error::MalformedPayload { path, .. }
            if path == r##"$.Actions["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"]"##),
        "{err:?}"
    );
}

#[tokio::test]
async fn unreachable_bmc_is_unreachable_after_retries() {
    let port = common::free_port();
    let endpoint = BmcAddress::parse(&format!("http://127.0.0.1:{port}")).unwrap().endpoint;
    let dir = TempDir::new("unreachable");
    let creds = Credentials::from_password_file(USERNAME, &password_file(dir.path(), PASSWORD)).unwrap();
    let mut config = BmcConfig::new(endpoint, creds);
    config.timing = mock_timing();
    let err = Bmc::new(config, Arc::new(Semaphore::new(1))).unwrap().power_state(&system()).await.unwrap_err();
    assert_eq!(err.metric_label(), "unreachable", "{err:?}");
}

/// The mockup's system as discovery reads it: every value is the
/// mockup's own, from its ProcessorSummary, MemorySummary,
/// EthernetInterfaces, chassis Location and EnvironmentMetrics.
#[tokio::test]
async fn inventory_reads_the_mockup_system_exactly() {
    let f = Fixture::start().await;
    let outcomes = f.bmc().inventory(None).await.unwrap();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].path, SYSTEM);
    let found = outcomes[0].result.as_ref().unwrap();
    assert_eq!(found.id.as_deref(), Some("437XR1138R2"));
    assert_eq!(found.uuid.as_deref(), Some(SYSTEM_UUID));
    assert_eq!(found.serial_number.as_deref(), Some("437XR1138R2"));
    assert_eq!(found.host_name.as_deref(), Some("web483"));
    assert_eq!(found.cpus, Some(16), "ProcessorSummary.LogicalProcessorCount");
    assert_eq!(found.memory_mib, Some(96 * 1024), "MemorySummary.TotalSystemMemoryGiB");
    // The FPGA is no GPU; the VLAN shares its parent's address; the BMC's
    // host interface is no network port; 12446A3B8890 has its MAC
    // overridden, and the burnt-in one is kept.
    assert_eq!(found.gpus, Some(vec![]));
    assert_eq!(found.mac_addresses.as_deref(), Some(&["12:44:6a:3b:04:11".to_owned(), "12:44:6a:3b:88:90".to_owned()][..]));
    assert_eq!(
        (found.location.rack.as_deref(), found.location.row.as_deref(), found.location.rack_offset.as_deref()),
        (Some("WEB43"), Some("North"), Some("12"))
    );
    let watts = found.watts.as_ref().expect("the system is on");
    assert_eq!((watts.watts, watts.source), (374.0, WattsSource::EnvironmentMetrics));
    assert!(found.unknown.is_empty(), "{:?}", found.unknown);
}

/// Without the summaries, CPUs and memory come from the Processors and
/// Memory collections (the empty socket and slot left out), and a GPU
/// among the processors is counted by model.
#[tokio::test]
async fn inventory_falls_back_to_the_collections_and_counts_gpus() {
    let f = Fixture::start().await;
    let read = |path: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(common::mockup_dir().join(path).join("index.json")).unwrap()).unwrap()
    };
    let mut body = read("Systems/437XR1138R2");
    body.as_object_mut().unwrap().remove("ProcessorSummary");
    body.as_object_mut().unwrap().remove("MemorySummary");
    body["PowerState"] = json!("Off");
    let processors = format!("{SYSTEM}/Processors");
    let mut collection = read("Systems/437XR1138R2/Processors");
    for gpu in ["GPU1", "GPU2"] {
        collection["Members"].as_array_mut().unwrap().push(json!({"@odata.id": format!("{processors}/{gpu}")}));
        f.mock.world().replace.insert(
            format!("{processors}/{gpu}"),
            json!({"@odata.id": format!("{processors}/{gpu}"), "Id": gpu, "ProcessorType": "GPU", "Model": "H100", "Status": {"State": "Enabled"}}),
        );
    }
    f.mock.world().replace.insert(SYSTEM.into(), body);
    f.mock.world().replace.insert(processors, collection);

    let outcomes = f.bmc().inventory(Some(&system())).await.unwrap();
    let found = outcomes[0].result.as_ref().unwrap();
    assert_eq!(found.cpus, Some(16), "CPU1's TotalThreads; CPU2 is absent");
    assert_eq!(found.memory_mib, Some(3 * 32768), "three DIMMs; DIMM4 is absent");
    assert_eq!(found.gpus, Some(vec![ironclaim_redfish::discover::GpuModel { model: "H100".into(), count: 2 }]));
    assert_eq!(found.watts, None);
    let unknown: Vec<_> = found.unknown.iter().map(|u| (u.fact, u.reason.as_str())).collect();
    assert_eq!(unknown, vec![(Fact::Watts, "the system is Off: power is read only while it is on")]);
}

/// A BMC that lists its GPUs as PCIe devices, not as Processors: two H100
/// cards (their functions in a PCIeFunctions collection), an A100 whose
/// function is linked the older way, an empty slot, the onboard VGA
/// (ASPEED, a display controller too) and a NIC. The GPUs are counted by
/// model; the VGA, the NIC and the empty slot are not.
#[tokio::test]
async fn inventory_counts_gpus_among_the_pcie_devices() {
    let f = Fixture::start().await;
    let mut body: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::mockup_dir().join("Systems/437XR1138R2/index.json")).unwrap()).unwrap();
    let devices = format!("{SYSTEM}/PCIeDevices");
    {
        let mut world = f.mock.world();
        let mut links = Vec::new();
        let mut device = |id: &str, model: Option<&str>, functions: &[(&str, &str)], older: bool, state: &str| {
            let path = format!("{devices}/{id}");
            links.push(json!({"@odata.id": path}));
            let function_paths: Vec<String> = (0..functions.len()).map(|i| format!("{path}/PCIeFunctions/{i}")).collect();
            for ((class, vendor), fpath) in functions.iter().zip(&function_paths) {
                world.replace.insert(fpath.clone(), json!({"@odata.id": fpath, "DeviceClass": class, "VendorId": vendor}));
            }
            let mut device = json!({"@odata.id": path, "Id": id, "Name": format!("Slot {id}"), "Status": {"State": state}});
            if let Some(model) = model {
                device["Model"] = json!(model);
            }
            let members: Vec<_> = function_paths.iter().map(|p| json!({"@odata.id": p})).collect();
            if older {
                device["Links"] = json!({"PCIeFunctions": members});
            } else {
                let collection = format!("{path}/PCIeFunctions");
                world.replace.insert(collection.clone(), json!({"@odata.id": collection, "Members": members}));
                device["PCIeFunctions"] = json!({"@odata.id": collection});
            }
            world.replace.insert(path, device);
        };
        device("1", Some("NVIDIA H100 80GB HBM3"), &[("DisplayController", "0x10DE")], false, "Enabled");
        device("2", Some("NVIDIA H100 80GB HBM3"), &[("DisplayController", "0x10de")], false, "Enabled");
        device("3", Some("NVIDIA A100-SXM4-40GB"), &[("ProcessingAccelerators", "0x10de")], true, "Enabled");
        device("4", Some("NVIDIA H100 80GB HBM3"), &[("DisplayController", "0x10de")], false, "Absent");
        device("VGA", Some("AST2600"), &[("DisplayController", "0x1a03")], false, "Enabled");
        device("NIC", Some("ConnectX-7"), &[("NetworkController", "0x15b3"), ("NetworkController", "0x15b3")], false, "Enabled");
        body["PCIeDevices"] = json!(links);
        world.replace.insert(SYSTEM.into(), body);
    }

    let outcomes = f.bmc().inventory(Some(&system())).await.unwrap();
    let found = outcomes[0].result.as_ref().unwrap();
    use ironclaim_redfish::discover::GpuModel;
    assert_eq!(
        found.gpus,
        Some(vec![GpuModel { model: "NVIDIA A100-SXM4-40GB".into(), count: 1 }, GpuModel { model: "NVIDIA H100 80GB HBM3".into(), count: 2 }])
    );
    assert!(found.unknown.iter().all(|u| u.fact != Fact::Gpus), "{:?}", found.unknown);

    // A device that fails to answer is a gap in the table, not a guess.
    f.mock.world().replace.remove(&format!("{devices}/2"));
    let outcomes = f.bmc().inventory(Some(&system())).await.unwrap();
    let found = outcomes[0].result.as_ref().unwrap();
    assert_eq!(found.gpus, None);
    let why = &found.unknown.iter().find(|u| u.fact == Fact::Gpus).expect("a GPU gap").reason;
    assert!(why.starts_with("no GPU among the Processors, and "), "{why}");
}
