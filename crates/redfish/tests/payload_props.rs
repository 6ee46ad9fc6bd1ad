//! The payload parsers meet arbitrary JSON and arbitrary bytes: they may
//! return errors, never panic.

mod common;

use ironclaim_redfish::payload;
use proptest::prelude::*;
use serde_json::Value;

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        // Field names the parsers look for, so they get deep, not just rejected.
        prop::sample::select(vec!["On", "Off", "/redfish/v1/Systems/1", "ResetType", "Completed", "Exception"])
            .prop_map(|s| Value::String(s.to_owned())),
    ];
    let keys = prop::sample::select(vec![
        "@odata.id",
        "Members",
        "Links",
        "Sessions",
        "SessionService",
        "Systems",
        "Chassis",
        "Id",
        "UUID",
        "PowerState",
        "Actions",
        "#ComputerSystem.Reset",
        "target",
        "ResetType@Redfish.AllowableValues",
        "@Redfish.ActionInfo",
        "Parameters",
        "Name",
        "AllowableValues",
        "EnvironmentMetrics",
        "Power",
        "PowerControl",
        "PowerConsumedWatts",
        "PowerWatts",
        "Reading",
        "TaskState",
        "Messages",
        "Message",
        "error",
        "@Message.ExtendedInfo",
        "message",
    ]);
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

fn parse_everything(value: &Value) {
    let _ = payload::service_root(value);
    let _ = payload::collection_members(value);
    let _ = payload::system(value);
    let _ = payload::action_info_reset_types(value);
    let _ = payload::chassis(value);
    let _ = payload::power_control_watts(value);
    let _ = payload::environment_metrics_watts(value);
    let _ = payload::task(value);
    let _ = payload::error_message(value);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsers_never_panic_on_arbitrary_json(value in any_json()) {
        parse_everything(&value);
    }

    #[test]
    fn body_parser_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(value) = payload::parse_body(&bytes) {
            parse_everything(&value);
        }
    }

    #[test]
    fn real_payloads_with_one_field_replaced_never_panic(
        which in 0usize..4,
        key in "[A-Za-z@#.]{1,24}",
        replacement in any_json(),
    ) {
        let file = ["Systems/437XR1138R2", "Chassis/1U/Power", "Chassis/1U/EnvironmentMetrics", "index.json"][which];
        let path = common::mockup_dir().join(file);
        let path = if path.is_dir() { path.join("index.json") } else { common::mockup_dir().join("index.json") };
        let mut value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        if let Some(obj) = value.as_object_mut() {
            let existing: Vec<String> = obj.keys().cloned().collect();
            let target = existing.iter().find(|k| k.starts_with(&key[..1])).cloned().unwrap_or(key);
            obj.insert(target, replacement);
        }
        parse_everything(&value);
    }

    #[test]
    fn truncated_real_payloads_are_errors_not_panics(cut in 0usize..4000) {
        let text = std::fs::read_to_string(common::mockup_dir().join("Systems/437XR1138R2/index.json")).unwrap();
        let bytes = &text.as_bytes()[..cut.min(text.len().saturating_sub(1))];
        prop_assert!(payload::parse_body(bytes).is_err());
    }
}
