//! Kubernetes resource lists (`requests`, `limits`, `allocatable`) read into
//! the core's resource vectors, with checked arithmetic.

use crate::error::{ConvertError, Result};
use ironclaim_core::Resources;
use ironclaim_core::quantity::parse_quantity;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The largest amount of any one resource in one list: 2^50 (a pebibyte of
/// memory, a trillion cores). Larger values are typos, and keeping every
/// value below it keeps the core's sums far from overflow.
pub const MAX_AMOUNT: i64 = 1 << 50;

/// Amounts by resource name, cpu in millicores, memory and storage in
/// bytes, everything else in units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Amounts(BTreeMap<String, i64>);

/// `path.name`, or `path["name"]` when the name has dots or slashes.
pub fn field(path: &str, name: &str) -> String {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        format!("{path}.{name}")
    } else {
        format!("{path}[{name:?}]")
    }
}

impl Amounts {
    /// Reads a resource list; `path` is where the list sits in its object.
    pub fn parse(list: Option<&BTreeMap<String, Quantity>>, path: &str) -> Result<Amounts> {
        let mut out = BTreeMap::new();
        for (name, quantity) in list.into_iter().flatten() {
            let scale = if name == "cpu" { 1000 } else { 1 };
            let at = || field(path, name);
            let amount = parse_quantity(&quantity.0, scale).map_err(|e| ConvertError::quantity(at(), e))?;
            if amount > MAX_AMOUNT {
                return Err(ConvertError::Quantity { path: at(), text: quantity.0.clone(), why: "larger than any machine (over 2^50)".into() });
            }
            out.insert(name.clone(), amount);
        }
        Ok(Amounts(out))
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }

    pub fn set(&mut self, name: &str, amount: i64) {
        self.0.insert(name.to_string(), amount);
    }

    /// Adds `other`; `path` names what is being summed, for the error.
    pub fn add(&mut self, other: &Amounts, path: &str) -> Result<()> {
        for (name, amount) in &other.0 {
            let sum = self.0.get(name).copied().unwrap_or(0).checked_add(*amount);
            match sum {
                Some(sum) if sum <= MAX_AMOUNT => {
                    self.0.insert(name.clone(), sum);
                }
                _ => return Err(ConvertError::invalid(path.to_string(), format!("{name} adds up to more than any machine holds"))),
            }
        }
        Ok(())
    }

    /// Keeps the larger amount of each resource.
    pub fn max_with(&mut self, other: &Amounts) {
        for (name, amount) in &other.0 {
            let entry = self.0.entry(name.clone()).or_insert(0);
            *entry = (*entry).max(*amount);
        }
    }

    /// Resources `limits` names and these do not: Kubernetes uses a
    /// container's limit as its request when the request is unset.
    pub fn default_from(&mut self, limits: &Amounts) {
        for (name, amount) in &limits.0 {
            self.0.entry(name.clone()).or_insert(*amount);
        }
    }

    /// The core's vector. `pods` is taken from the list only when
    /// `keep_pods` (a node's allocatable); a pod's slot is set by the caller.
    pub fn to_resources(&self, keep_pods: bool) -> Resources {
        let mut r = Resources::default();
        for (name, amount) in &self.0 {
            match name.as_str() {
                "cpu" => r.cpu_milli = *amount,
                "memory" => r.memory_bytes = *amount,
                "ephemeral-storage" => r.ephemeral_bytes = *amount,
                "pods" => {
                    if keep_pods {
                        r.pods = *amount;
                    }
                }
                other => r.set_extended(other, *amount),
            }
        }
        r
    }
}

/// Parses one quantity at `path`, bounded like resource lists.
pub fn quantity(q: &Quantity, scale: i64, path: impl Fn() -> String) -> Result<i64> {
    let amount = parse_quantity(&q.0, scale).map_err(|e| ConvertError::quantity(path(), e))?;
    if amount > MAX_AMOUNT {
        return Err(ConvertError::Quantity { path: path(), text: q.0.clone(), why: "larger than any machine (over 2^50)".into() });
    }
    Ok(amount)
}
