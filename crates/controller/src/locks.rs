//! Claim locks: one `coordination.k8s.io` Lease per claimed server, in the
//! controller's namespace, named after the server.
//!
//! Creating a Lease is atomic (the API server answers 409 to the second
//! creator) and costs about a quarter of a write to a custom resource, so
//! a burst of claims takes its locks quickly and each power-on waits for
//! one cheap write. The claim is then written to the Server's status, as
//! before, once the power-on is under way.
//!
//! # Invariant
//! The lock is held at least as long as the Server names the claim: it is
//! taken before `status.claim` is written and given up only after it is
//! cleared. So a server is free exactly when it has neither, and a
//! controller that died between the two writes leaves a lock whose holder
//! the Server does not name: the sweep breaks it once it is older than the
//! opening grace (powering the server off if it never became a node).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};

use crate::error::{Error, Result};
use ironclaim_k8s::api::Server;

/// The label every claim lock carries (its value is always "true"); the
/// controller watches only these Leases.
pub const LOCK_LABEL: &str = "ironclaim.dev/claim-lock";
/// The annotation naming the locked server (a label value is too short for
/// a server name).
pub const LOCK_SERVER_ANNOTATION: &str = "ironclaim.dev/server";

/// The Lease name of a server's lock: `server.NAME`, or for a name too
/// long for that, a prefix and a hash of the whole name.
pub fn lock_name(server: &str) -> String {
    let name = format!("server.{server}");
    if name.len() <= 253 {
        return name;
    }
    // FNV-1a: stable across processes and releases, unlike the std hasher.
    let hash = server.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let prefix = name[..236].trim_end_matches(['-', '.']);
    format!("{prefix}.{hash:016x}")
}

/// A lock as the index holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Lock {
    pub server: String,
    pub holder: String,
    /// When it was taken.
    pub acquired: Option<jiff::Timestamp>,
}

impl Lock {
    /// The lock a Lease is, if it is one of ours.
    pub fn from_lease(lease: &Lease) -> Option<Lock> {
        let server = lease.annotations().get(LOCK_SERVER_ANNOTATION)?.clone();
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.clone()).unwrap_or_default();
        let acquired = spec.and_then(|s| s.acquire_time.as_ref()).map(|t| t.0);
        Some(Lock { server, holder, acquired })
    }
}

/// Whether taking a lock made this claim its holder or found it already was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    Now,
    Already,
}

/// Takes and gives up claim locks in one namespace.
#[derive(Clone)]
pub struct Locks {
    api: Api<Lease>,
    namespace: String,
}

impl Locks {
    pub fn new(client: Client, namespace: &str) -> Self {
        Locks { api: Api::namespaced(client, namespace), namespace: namespace.to_string() }
    }

    fn failed(&self, server: &str, source: kube::Error) -> Error {
        Error::ClaimLockFailed { server: server.to_string(), lease: format!("{}/{}", self.namespace, lock_name(server)), source }
    }

    /// Takes the lock of `server` for `claim`.
    ///
    /// # Errors
    /// [`Error::ServerHeld`] when another claim holds it;
    /// [`Error::ClaimLockFailed`] when the API refused otherwise.
    pub async fn take(&self, server: &Server, claim: &str) -> Result<Taken> {
        let server_name = server.name_any();
        // The Server owns its lock, so deleting a Server collects it.
        let owner = server.metadata.uid.clone().map(|uid| OwnerReference {
            api_version: "ironclaim.dev/v1alpha1".into(),
            kind: "Server".into(),
            name: server_name.clone(),
            uid,
            ..OwnerReference::default()
        });
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(lock_name(&server_name)),
                labels: Some([(LOCK_LABEL.to_string(), "true".to_string())].into()),
                annotations: Some([(LOCK_SERVER_ANNOTATION.to_string(), server_name.clone())].into()),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(claim.to_string()),
                acquire_time: Some(MicroTime(jiff::Timestamp::now())),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Taken::Now),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let held = self.api.get(&lock_name(&server_name)).await.map_err(|e| self.failed(&server_name, e))?;
                let holder = held.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                if holder == claim { Ok(Taken::Already) } else { Err(Error::ServerHeld { server: server_name, holder }) }
            }
            Err(source) => Err(self.failed(&server_name, source)),
        }
    }

    /// Gives up the lock of `server` if `claim` holds it (a lock another
    /// claim took since is left alone).
    ///
    /// # Errors
    /// [`Error::ClaimLockFailed`] when it could not be read or deleted.
    pub async fn give_up(&self, server: &str, claim: &str) -> Result<()> {
        let held = match self.api.get_opt(&lock_name(server)).await {
            Ok(Some(held)) => held,
            Ok(None) => return Ok(()),
            Err(source) => return Err(self.failed(server, source)),
        };
        if held.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(claim) {
            return Ok(());
        }
        // Deleted only in the version read: a lock taken anew in between stays.
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: held.metadata.uid.clone(), resource_version: held.metadata.resource_version.clone() }),
            ..DeleteParams::default()
        };
        match self.api.delete(&lock_name(server), &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(source) => Err(self.failed(server, source)),
        }
    }

    /// The lock of `server` as the API holds it now.
    ///
    /// # Errors
    /// [`Error::ClaimLockFailed`] when it could not be read.
    pub async fn read(&self, server: &str) -> Result<Option<Lock>> {
        let lease = self.api.get_opt(&lock_name(server)).await.map_err(|e| self.failed(server, e))?;
        Ok(lease.as_ref().and_then(Lock::from_lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_are_valid_distinct_and_bounded() {
        assert_eq!(lock_name("r1-u07"), "server.r1-u07");
        let long_a = "a".repeat(253);
        let long_b = format!("{}b", "a".repeat(252));
        let (a, b) = (lock_name(&long_a), lock_name(&long_b));
        assert!(a.len() <= 253 && b.len() <= 253, "{} {}", a.len(), b.len());
        assert_ne!(a, b);
        assert_eq!(a, lock_name(&long_a), "stable");
        for name in [a, b, lock_name("x.y-z")] {
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'), "{name}");
            assert!(!name.ends_with(['-', '.']) && !name.starts_with(['-', '.']), "{name}");
        }
    }

    #[test]
    fn a_lease_without_the_server_annotation_is_not_a_lock() {
        let lease = Lease { metadata: ObjectMeta { name: Some("ironclaim-controller".into()), ..ObjectMeta::default() }, spec: None };
        assert_eq!(Lock::from_lease(&lease), None);
    }
}
