//! The loader returns an error, never a panic, whatever it is given.

use ironclaim_k8s::load_str;
use proptest::prelude::*;

const EXAMPLE: &str = include_str!("../../../examples/worked-example.yaml");

fn load_both_ways(text: &str) {
    let _ = load_str("fuzz.yaml", text);
    let _ = load_str("fuzz.json", text);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        load_both_ways(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn arbitrary_yaml_like_text(text in "[a-zA-Z0-9 :{}\\[\\],'\"&*!|>#%@`?~-]{0,64}(\n[a-zA-Z0-9 :{}\\[\\],'\"&*!|>#%@`?~-]{0,64}){0,24}") {
        load_both_ways(&text);
    }

    /// Real manifests with a few bytes cut, repeated or replaced: every
    /// structure the loader knows, broken in every place.
    #[test]
    fn the_worked_example_mutated(
        edits in proptest::collection::vec((0usize..EXAMPLE.len(), 0usize..16, any::<u8>(), 0u8..3), 1..6)
    ) {
        let mut bytes = EXAMPLE.as_bytes().to_vec();
        for (at, len, byte, kind) in edits {
            let at = at.min(bytes.len());
            let end = (at + len).min(bytes.len());
            match kind {
                0 => { bytes.drain(at..end); }
                1 => { let copy = bytes[at..end].to_vec(); bytes.splice(at..at, copy); }
                _ => { bytes.splice(at..end, [byte]); }
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(manifests) = load_str("example.yaml", &text) {
            // Whatever loads is a snapshot the core can plan on.
            let _ = ironclaim_core::provision(&manifests.snapshot, 0);
        }
    }

    /// Any field of a pod may hold any scalar.
    #[test]
    fn any_scalar_in_any_pod_field(
        field in prop::sample::select(vec![
            "metadata.name", "spec.containers[0].resources.requests.cpu", "spec.priority", "spec.nodeName",
            "spec.containers[0].ports[0].hostPort", "spec.topologySpreadConstraints[0].maxSkew",
            "spec.tolerations[0].effect", "metadata.annotations.ironclaim.dev/deadline",
        ]),
        value in prop_oneof![
            any::<i64>().prop_map(|v| v.to_string()),
            any::<f64>().prop_map(|v| format!("{v:e}")),
            "[ -~]{0,24}".prop_map(|s| format!("{s:?}")),
            Just("null".to_string()), Just("[]".to_string()), Just("{}".to_string()),
        ],
    ) {
        let set = |path: &str| if path == field { value.clone() } else { match path {
            "metadata.name" => "p".into(),
            "spec.containers[0].resources.requests.cpu" => "'1'".into(),
            "spec.priority" => "0".into(),
            "spec.nodeName" => "n1".into(),
            "spec.containers[0].ports[0].hostPort" => "80".into(),
            "spec.topologySpreadConstraints[0].maxSkew" => "1".into(),
            "spec.tolerations[0].effect" => "NoSchedule".into(),
            _ => "10m".into(),
        }};
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\n  annotations: {{ironclaim.dev/deadline: {}}}\nspec:\n  nodeName: {}\n  priority: {}\n  tolerations: [{{key: k, effect: {}}}]\n  topologySpreadConstraints: [{{maxSkew: {}, topologyKey: z, whenUnsatisfiable: DoNotSchedule}}]\n  containers:\n  - name: c\n    resources: {{requests: {{cpu: {}}}}}\n    ports: [{{containerPort: 80, hostPort: {}}}]\n",
            set("metadata.name"), set("metadata.annotations.ironclaim.dev/deadline"), set("spec.nodeName"), set("spec.priority"),
            set("spec.tolerations[0].effect"), set("spec.topologySpreadConstraints[0].maxSkew"),
            set("spec.containers[0].resources.requests.cpu"), set("spec.containers[0].ports[0].hostPort"),
        );
        let _ = load_str("pod.yaml", &text);
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let depth = 100_000;
    let head = "apiVersion: v1\nkind: Node\nmetadata: {name: n}\n";
    let yaml_flow = format!("{head}x: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    let yaml_block: String = head.to_string() + &(0..2000).map(|i| format!("{}k:\n", " ".repeat(i))).collect::<String>();
    let json = format!("{{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"x\": {}{}}}", "[".repeat(depth), "]".repeat(depth));
    for (file, text) in [("flow.yaml", &yaml_flow), ("block.yaml", &yaml_block), ("deep.json", &json)] {
        let err = load_str(file, text).expect_err(file);
        assert_eq!(err.metric_label(), "syntax", "{file}: {err}");
    }
}

#[test]
fn alias_bombs_are_refused() {
    let mut text = String::from("apiVersion: v1\nkind: Node\nmetadata: {name: n}\na: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..12 {
        let prev = if i == 0 { "a".to_string() } else { format!("a{}", i - 1) };
        text.push_str(&format!("a{i}: &a{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
    }
    let err = load_str("bomb.yaml", &text).expect_err("an alias bomb");
    assert_eq!(err.metric_label(), "syntax", "{err}");
}

#[test]
fn absurd_numbers_are_errors() {
    let pod = |cpu: &str| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: [{{name: c, resources: {{requests: {{cpu: '{cpu}'}}}}}}]\n")
    };
    for cpu in ["1e400", "99999999999999999999999999", "1e18", "nan", "inf", ".inf"] {
        assert!(load_str("a.yaml", &pod(cpu)).is_err(), "{cpu}");
    }
    let many: String = (0..40).map(|i| format!("  - {{name: c{i}, resources: {{requests: {{memory: 900Ti}}}}}}\n")).collect();
    let summed = format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n{many}");
    let err = load_str("a.yaml", &summed).unwrap_err().to_string();
    assert!(err.contains("spec.containers: memory adds up to more than any machine holds"), "{err}");
}
