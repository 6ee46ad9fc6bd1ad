//! The preflight: what would stop the controller, or one of its servers,
//! checked against a cluster before (or while) it runs.
//!
//! - The API server answers.
//! - The ironclaim.dev CRDs are installed, and are this version's.
//! - The controller's ServiceAccount holds every permission the shipped
//!   RBAC grants (deploy/rbac.yaml), and may read each BMC Secret a
//!   Server references; asked of the API server by SubjectAccessReview.
//! - Every Server: its spec reads; its BMC configuration works (Secret and
//!   keys, address, TLS), its BMC answers with these credentials, its
//!   system reports an identity that agrees with the recorded one, and a
//!   power reading.
//! - Every ServerPool: its spec reads, and some Server matches it.
//!
//! Each check is read through the controller's own code (the same
//! [`Power`] and conversions), so a check that passes here passes there.

use std::collections::BTreeSet;

use ironclaim_k8s::api::{Server, ServerPool};
use ironclaim_k8s::{server_to_core, serverpool_to_core};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::provider::Power;

/// The RBAC the controller ships with: what its ServiceAccount must hold.
const SHIPPED_RBAC: &str = include_str!("../../../deploy/rbac.yaml");

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    /// Works, but something is missing or worth a look.
    Warn,
    /// Stops the controller, or keeps it from using this object.
    Fail,
}

/// One check of one object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// What was checked: `cluster`, `CustomResourceDefinition servers.ironclaim.dev`, `Server r1-u01`.
    pub object: String,
    pub check: &'static str,
    pub verdict: Verdict,
    pub detail: String,
    /// The next step, when it is not Ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn new(object: impl Into<String>, check: &'static str, verdict: Verdict, detail: impl Into<String>, fix: Option<String>) -> Self {
        Finding { object: object.into(), check, verdict, detail: detail.into(), fix }
    }
}

/// Who the controller runs as.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The controller's namespace (its Lease, claim locks and, by default,
    /// the BMC Secrets).
    pub namespace: String,
    pub service_account: String,
}

impl Default for Identity {
    fn default() -> Self {
        Identity { namespace: "ironclaim-system".into(), service_account: "ironclaim".into() }
    }
}

/// Every check, in order: the cluster, the CRDs, RBAC, Servers,
/// ServerPools. Later checks are skipped when the API does not answer or
/// the CRDs are missing (they would only repeat it).
pub async fn examine(client: &Client, power: &dyn Power, identity: &Identity) -> Vec<Finding> {
    let mut out = Vec::new();
    if !api_answers(client, &mut out).await || !crds(client, &mut out).await {
        return out;
    }
    rbac(client, identity, &mut out).await;
    let servers = match Api::<Server>::all(client.clone()).list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(err) => {
            out.push(Finding::new("Servers", "list", Verdict::Fail, one_line(&err), None));
            return out;
        }
    };
    secrets_readable(client, identity, &servers, &mut out).await;
    for server in &servers {
        server_checks(power, server, &mut out).await;
    }
    pools(client, &servers, &mut out).await;
    out
}

/// What no retry mends, checked before the controller starts: the API
/// server answers and every CRD is installed. The failures, when not.
pub async fn preflight(client: &Client) -> Result<(), Vec<Finding>> {
    let mut out = Vec::new();
    if api_answers(client, &mut out).await && crds(client, &mut out).await {
        Ok(())
    } else {
        Err(out.into_iter().filter(|f| f.verdict == Verdict::Fail).collect())
    }
}

/// True when the API server answers.
async fn api_answers(client: &Client, out: &mut Vec<Finding>) -> bool {
    match client.apiserver_version().await {
        Ok(v) => {
            out.push(Finding::new("cluster", "api", Verdict::Ok, format!("Kubernetes {}", v.git_version), None));
            true
        }
        Err(err) => {
            out.push(Finding::new(
                "cluster",
                "api",
                Verdict::Fail,
                format!("the API server does not answer: {}", one_line(&err)),
                Some("check the kubeconfig, its context and the network path to the API server".into()),
            ));
            false
        }
    }
}

/// True when the run can go on: every CRD is installed.
async fn crds(client: &Client, out: &mut Vec<Finding>) -> bool {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut installed = true;
    for want in ironclaim_k8s::api::crds() {
        let name = want.name_any();
        let object = format!("CustomResourceDefinition {name}");
        let apply = "run `ironclaim crds | kubectl apply --server-side -f -` (or install the Helm chart)".to_string();
        match api.get_opt(&name).await {
            Ok(None) => {
                installed = false;
                out.push(Finding::new(object, "installed", Verdict::Fail, "the ironclaim.dev CRDs are not installed", Some(apply)));
            }
            Ok(Some(have)) => {
                let schema = |crd: &CustomResourceDefinition| {
                    crd.spec.versions.iter().map(|v| (v.name.clone(), serde_json::to_value(&v.schema).unwrap_or_default())).collect::<Vec<_>>()
                };
                if schema(&have) == schema(&want) {
                    out.push(Finding::new(object, "version", Verdict::Ok, "installed, this version's schema", None));
                } else {
                    out.push(Finding::new(object, "version", Verdict::Fail, "installed, but its schema is not this version's", Some(apply)));
                }
            }
            Err(err) => {
                installed = false;
                out.push(Finding::new(object, "installed", Verdict::Fail, one_line(&err), None));
            }
        }
    }
    installed
}

/// One permission: (API group, resource, namespace or cluster-wide, verb, resource name).
type Access = (String, String, Option<String>, String, Option<String>);

/// Every permission the shipped RBAC grants, each once; a Role's in its
/// namespace (the controller's).
fn shipped_access(namespace: &str) -> Vec<Access> {
    let mut out = BTreeSet::new();
    for doc in SHIPPED_RBAC.split("\n---") {
        let Ok(value) = serde_saphyr::from_str::<serde_json::Value>(doc) else { continue };
        let kind = value["kind"].as_str().unwrap_or_default();
        let scope = match kind {
            "ClusterRole" => None,
            "Role" => Some(namespace.to_string()),
            _ => continue,
        };
        for rule in value["rules"].as_array().into_iter().flatten() {
            let list = |key: &str| rule[key].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect::<Vec<_>>());
            // No names: the rule grants the resource whole.
            let names: Vec<Option<String>> = match list("resourceNames") {
                Some(names) if !names.is_empty() => names.into_iter().map(Some).collect(),
                _ => vec![None],
            };
            for group in list("apiGroups").unwrap_or_default() {
                for resource in list("resources").unwrap_or_default() {
                    for verb in list("verbs").unwrap_or_default() {
                        for name in &names {
                            out.insert((group.clone(), resource.clone(), scope.clone(), verb.clone(), name.clone()));
                        }
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Whether the controller's ServiceAccount may do `access`, as the API
/// server answers a SubjectAccessReview.
async fn allowed(client: &Client, identity: &Identity, access: &Access) -> Result<bool, kube::Error> {
    let (group, resource, namespace, verb, name) = access.clone();
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{}:{}", identity.namespace, identity.service_account)),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", identity.namespace),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group),
                resource: Some(resource),
                subresource,
                namespace,
                verb: Some(verb),
                name,
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone()).create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

fn described(access: &Access) -> String {
    let (group, resource, namespace, verb, name) = access;
    let group = if group.is_empty() { "core" } else { group };
    let scope = namespace.as_deref().map_or("cluster-wide".to_string(), |n| format!("in {n}"));
    let name = name.as_deref().map(|n| format!(" {n}")).unwrap_or_default();
    format!("{verb} {group}/{resource}{name} {scope}")
}

async fn rbac(client: &Client, identity: &Identity, out: &mut Vec<Finding>) {
    let object = format!("ServiceAccount {}/{}", identity.namespace, identity.service_account);
    let mut missing = Vec::new();
    let wanted = shipped_access(&identity.namespace);
    for access in &wanted {
        match allowed(client, identity, access).await {
            Ok(true) => {}
            Ok(false) => missing.push(described(access)),
            Err(err) => {
                out.push(Finding::new(object, "rbac", Verdict::Warn, format!("cannot ask the API server: {}", one_line(&err)), None));
                return;
            }
        }
    }
    if missing.is_empty() {
        out.push(Finding::new(object, "rbac", Verdict::Ok, format!("all {} permissions of deploy/rbac.yaml", wanted.len()), None));
    } else {
        out.push(Finding::new(
            object,
            "rbac",
            Verdict::Fail,
            format!("{} of {} permissions missing: {}", missing.len(), wanted.len(), missing.join("; ")),
            Some("apply this version's deploy/rbac.yaml (or upgrade the Helm chart)".into()),
        ));
    }
}

/// May the controller read each Secret a Redfish Server references?
async fn secrets_readable(client: &Client, identity: &Identity, servers: &[Server], out: &mut Vec<Finding>) {
    let refs: BTreeSet<(String, String)> = servers
        .iter()
        .filter(|s| crate::provider::uses_redfish(s))
        .filter_map(|s| s.spec.bmc.as_ref())
        .map(|b| (b.credentials_secret_ref.namespace.clone(), b.credentials_secret_ref.name.clone()))
        .collect();
    for (namespace, name) in refs {
        let access: Access = (String::new(), "secrets".into(), Some(namespace.clone()), "get".into(), Some(name.clone()));
        let object = format!("Secret {namespace}/{name}");
        match allowed(client, identity, &access).await {
            Ok(true) => {}
            Ok(false) => out.push(Finding::new(
                object,
                "readable",
                Verdict::Fail,
                "the controller's ServiceAccount may not read it",
                Some(format!("bind the Role ironclaim-bmc-credentials in namespace {namespace}, or keep BMC Secrets in {}", identity.namespace)),
            )),
            Err(err) => out.push(Finding::new(object, "readable", Verdict::Warn, format!("cannot ask the API server: {}", one_line(&err)), None)),
        }
    }
}

/// The next step for a power failure, by its reason.
fn power_fix(reason: ironclaim_driver::FailureReason, server: &Server) -> String {
    use ironclaim_driver::FailureReason as R;
    if let Some(external) = server.spec.external_provider() {
        return format!(
            "check the external provider {} (the controller's --external-providers file; pass the same file to doctor) and its answer above; see docs/providers.md",
            external.name
        );
    }
    if let Some(md) = server.spec.machine_deployment() {
        return format!(
            "check the MachineDeployment {}/{} and that the controller may get, list and patch machinedeployments and machines (deploy/rbac.yaml)",
            md.namespace, md.machine_deployment
        );
    }
    let secret =
        server.spec.bmc.as_ref().map(|b| format!("{}/{}", b.credentials_secret_ref.namespace, b.credentials_secret_ref.name)).unwrap_or_default();
    match reason {
        R::BmcCredentialsMissing => format!("create the Secret {secret} with keys username and password (or let the controller read it)"),
        R::BmcAuthenticationFailed => format!("check the username and password in the Secret {secret} against the BMC's accounts"),
        R::BmcConfigInvalid => "fix spec.bmc: an https:// or http:// address ending in /redfish/v1/Systems/ID of a system the BMC has; spec.bmc.caBundle for a private CA".into(),
        R::BmcUnreachable => "check spec.bmc.address and the network path from the controller to the BMC".into(),
        _ => "read the BMC's own logs; `ironclaim bmc status` talks to it directly".into(),
    }
}

async fn server_checks(power: &dyn Power, server: &Server, out: &mut Vec<Finding>) {
    let object = format!("Server {}", server.name_any());
    if let Err(err) = server_to_core(server) {
        out.push(Finding::new(object.clone(), "spec", Verdict::Fail, err.to_string(), Some("fix the field named".into())));
        return;
    }
    let state = match power.power_state(server).await {
        Ok(state) => state,
        Err(err) => {
            let reason = err.reason;
            out.push(Finding::new(object, "bmc", Verdict::Fail, format!("{:?}: {}", err.reason, err.message), Some(power_fix(reason, server))));
            return;
        }
    };
    out.push(Finding::new(object.clone(), "bmc", Verdict::Ok, format!("answers: power {state:?}"), None));
    let recorded = server.status.as_ref().and_then(|s| s.identity.as_ref()).and_then(|i| i.system_uuid.clone());
    match power.identity(server).await {
        Ok(Some(id)) => match (id.uuid.as_deref(), recorded.as_deref()) {
            (Some(read), Some(rec)) if !ironclaim_core::identity::same_uuid(read, rec) => out.push(Finding::new(
                object.clone(),
                "identity",
                Verdict::Fail,
                format!("the BMC answers for system {read}, but the Server recorded {rec}"),
                Some("fix spec.bmc.address (or the BMC), then clear status.identity to have it read again".into()),
            )),
            (Some(read), _) => out.push(Finding::new(object.clone(), "identity", Verdict::Ok, format!("system {read}"), None)),
            (None, _) => {
                out.push(Finding::new(object.clone(), "identity", Verdict::Warn, "the system reports no UUID: its node is linked by name only", None))
            }
        },
        Ok(None) => {}
        Err(err) => out.push(Finding::new(object.clone(), "identity", Verdict::Warn, err.message, None)),
    }
    match power.watts(server).await {
        Ok(Some(w)) => out.push(Finding::new(object, "watts", Verdict::Ok, format!("{w:.0} W"), None)),
        Ok(None) => out.push(Finding::new(object, "watts", Verdict::Warn, "no power reading: spec.power's figures stand in", None)),
        Err(err) => out.push(Finding::new(object, "watts", Verdict::Warn, err.message, None)),
    }
}

async fn pools(client: &Client, servers: &[Server], out: &mut Vec<Finding>) {
    let pools = match Api::<ServerPool>::all(client.clone()).list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(err) => {
            out.push(Finding::new("ServerPools", "list", Verdict::Fail, one_line(&err), None));
            return;
        }
    };
    if pools.is_empty() {
        out.push(Finding::new(
            "ServerPools",
            "present",
            Verdict::Fail,
            "no ServerPool: no server is ever claimed",
            Some("create a ServerPool".into()),
        ));
    }
    let inventory: Vec<ironclaim_core::model::Server> = servers.iter().filter_map(|s| server_to_core(s).ok()).collect();
    for pool in &pools {
        let object = format!("ServerPool {}", pool.name_any());
        match serverpool_to_core(pool) {
            Err(err) => out.push(Finding::new(object, "spec", Verdict::Fail, err.to_string(), Some("fix the field named".into()))),
            Ok(p) => {
                let matching = inventory.iter().filter(|s| p.admits(s)).count();
                if matching == 0 {
                    out.push(Finding::new(object, "servers", Verdict::Warn, "no Server matches its requirements", None));
                } else {
                    out.push(Finding::new(object, "servers", Verdict::Ok, format!("{matching} Server(s) match"), None));
                }
            }
        }
    }
}

/// An API error in one line: its message, not the client's debug dump.
pub fn one_line(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} (HTTP {})", status.message, status.code),
        other => other.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_rbac_is_read_whole() {
        let access = shipped_access("ironclaim-system");
        let has = |group: &str, resource: &str, verb: &str, ns: bool| {
            access.iter().any(|(g, r, n, v, _)| g == group && r == resource && v == verb && n.is_some() == ns)
        };
        assert!(has("", "pods/eviction", "create", false));
        assert!(has("ironclaim.dev", "servers/status", "patch", false));
        assert!(has("", "secrets", "get", true));
        assert!(has("coordination.k8s.io", "leases", "update", true));
        // Every ledger ConfigMap by name: the legacy one and each shard.
        let ledger = |name: String, verb: &str| access.iter().any(|(_, r, _, v, n)| r == "configmaps" && v == verb && n.as_ref() == Some(&name));
        let ledgers =
            std::iter::once(crate::locks::LEGACY_LEDGER_NAME.to_string()).chain((0..crate::locks::SHARD_COUNT).map(crate::locks::shard_name));
        for name in ledgers {
            assert!(ledger(name.clone(), "get") && ledger(name.clone(), "patch"), "{name}");
        }
        assert!(has("", "configmaps", "watch", true), "the index watches the ledger by label");
        assert!(access.len() >= 30, "{}", access.len());
    }
}
