//! Reading the whole cluster once into an [`Index`], for the command line
//! (`ironclaim explain`, `ironclaim servers`), which needs no watches.

use ironclaim_k8s::api::{Server, ServerClaim, ServerPool};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::index::{Index, Indexed};
use crate::locks::Locks;

async fn list<K>(client: &Client) -> Result<Vec<K>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| Error::ReadFailed { what: K::plural(&Default::default()).into_owned(), source })
}

fn reset<K: Indexed>(index: &mut Index, objects: Vec<K>) {
    index.reset::<K>(objects.into_iter().map(Indexed::listed).collect());
}

/// Lists every kind the controller watches, and reads the claim locks of
/// the controller in `lock_namespace` (a server locked but not yet named
/// by its claim is taken all the same).
///
/// # Errors
/// [`Error::ReadFailed`] naming the kind that could not be listed.
pub async fn read(client: &Client, lock_namespace: &str) -> Result<Index> {
    let mut index = Index::default();
    reset(&mut index, list::<Pod>(client).await?);
    reset(&mut index, list::<Node>(client).await?);
    reset(&mut index, list::<DaemonSet>(client).await?);
    reset(&mut index, list::<PodDisruptionBudget>(client).await?);
    reset(&mut index, list::<Server>(client).await?);
    reset(&mut index, list::<ServerPool>(client).await?);
    reset(&mut index, list::<ServerClaim>(client).await?);
    index.locks = Locks::new(client.clone(), lock_namespace).all().await?;
    Ok(index)
}
