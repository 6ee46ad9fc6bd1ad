//! Warm spares: powering idle unclaimed servers off once it pays, and
//! cold ones on to restore a warm floor.
//!
//! # Guarantees
//! - The server is read again right before acting: one that a claim took
//!   meanwhile is left to the claim.
//! - A claim that lands during a power-off gets its server back on.

use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use crate::scaledown::drain::{DrainError, Drainer};
use crate::scaledown::notes::Kind;

fn unclaimed(server: &Server) -> bool {
    let status = server.status.clone().unwrap_or_default();
    status.claim.is_none_or(|c| c.is_empty()) && !server.spec.maintenance && !status.quarantined
}

/// Powers an idle spare off, if it is still unclaimed. Returns whether it did.
///
/// # Errors
/// Reading the server, the power-off or its confirmation failed.
pub async fn power_off_spare(drainer: &Drainer, name: &str, note: &str) -> Result<bool, DrainError> {
    let api: Api<Server> = Api::all(drainer.client.clone());
    let server = api.get(name).await.map_err(|source| DrainError::ReadServerFailed { server: name.to_string(), source })?;
    if !unclaimed(&server) {
        return Ok(false);
    }
    drainer.power_off_confirmed(&server).await?;
    let after = api.get(name).await.map_err(|source| DrainError::ReadServerFailed { server: name.to_string(), source })?;
    if !unclaimed(&after) {
        // A claim won the race: it expects the server on its way up.
        if let Err(err) = drainer.power.power_on(&after).await {
            tracing::warn!(server = %name, error = %err, "powering a just-claimed server back on failed; its claim retries");
        }
        return Ok(false);
    }
    drainer.notes.normal(Kind::Server, name, "PoweredOff", note).await;
    Ok(true)
}

/// Powers a cold spare on to restore a warm floor, if still unclaimed.
///
/// # Errors
/// Reading the server, or the power-on, failed.
pub async fn power_on_spare(drainer: &Drainer, name: &str, note: &str) -> Result<bool, DrainError> {
    let api: Api<Server> = Api::all(drainer.client.clone());
    let server = api.get(name).await.map_err(|source| DrainError::ReadServerFailed { server: name.to_string(), source })?;
    if !unclaimed(&server) {
        return Ok(false);
    }
    drainer.power.power_on(&server).await.map_err(|source| DrainError::PowerOnFailed { server: server.name_any(), source })?;
    let patch = serde_json::json!({"status": {"powerState": PowerState::On}});
    if let Err(err) = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        tracing::warn!(server = %name, error = %err, "writing the power state failed; the sweep will");
    }
    drainer.notes.normal(Kind::Server, name, "PoweredOn", note).await;
    Ok(true)
}
