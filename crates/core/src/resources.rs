//! Resource vectors: what a pod requests and what a node or server offers.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The GPU resource name the NVIDIA device plugin advertises.
pub const GPU: &str = "nvidia.com/gpu";

/// The extended resource a shared GPU is accounted in: every GPU offers
/// 1000, a pod asking for a share of one GPU requests its share, a pod
/// asking for whole GPUs requests 1000 per GPU on top of `nvidia.com/gpu`.
pub const GPU_MILLI: &str = "ironclaim.dev/gpu-milli";

/// The kubelet's default `maxPods`: the pod slots of a node made from a
/// server whose capacity names none.
pub const DEFAULT_MAX_PODS: i64 = 110;

/// A resource vector. Extended resources (`nvidia.com/gpu`, hugepages, any
/// device plugin's) are kept sorted by name so that comparison and
/// arithmetic are merges, not lookups.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub cpu_milli: i64,
    #[serde(default)]
    pub memory_bytes: i64,
    #[serde(default)]
    pub ephemeral_bytes: i64,
    /// Pod slots. A pod requests one; a node offers `maxPods`.
    #[serde(default)]
    pub pods: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extended: Vec<(String, i64)>,
}

/// The first resource that does not fit, with what was asked and what was left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub resource: String,
    pub requested: i64,
    pub available: i64,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: i64| match self.resource.as_str() {
            "cpu" => crate::quantity::format_cpu_milli(v),
            "memory" | "ephemeral-storage" => crate::quantity::format_bytes(v),
            _ => v.to_string(),
        };
        write!(f, "{} {} requested, {} available", self.resource, show(self.requested), show(self.available))
    }
}

impl Resources {
    pub fn new(cpu_milli: i64, memory_bytes: i64) -> Self {
        Resources { cpu_milli, memory_bytes, ..Default::default() }
    }

    pub fn with_pods(mut self, pods: i64) -> Self {
        self.pods = pods;
        self
    }

    /// A server's capacity as its node will report it: a server that says
    /// nothing of pod slots gets the kubelet's default `maxPods`.
    pub fn with_default_pods(&self) -> Self {
        let mut r = self.clone();
        if r.pods == 0 {
            r.pods = DEFAULT_MAX_PODS;
        }
        r
    }

    pub fn with_extended(mut self, name: &str, amount: i64) -> Self {
        self.set_extended(name, amount);
        self
    }

    pub fn extended(&self, name: &str) -> i64 {
        self.extended.binary_search_by(|(n, _)| n.as_str().cmp(name)).map(|i| self.extended[i].1).unwrap_or(0)
    }

    pub fn set_extended(&mut self, name: &str, amount: i64) {
        match self.extended.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) if amount == 0 => {
                self.extended.remove(i);
            }
            Ok(i) => self.extended[i].1 = amount,
            Err(_) if amount == 0 => {}
            Err(i) => self.extended.insert(i, (name.to_string(), amount)),
        }
    }

    pub fn gpus(&self) -> i64 {
        self.extended(GPU)
    }

    /// GPUs in thousandths: the shares asked or offered, else 1000 per
    /// whole GPU.
    pub fn gpu_milli(&self) -> i64 {
        self.extended(GPU_MILLI).max(self.gpus() * 1000)
    }

    pub fn is_zero(&self) -> bool {
        self.cpu_milli == 0 && self.memory_bytes == 0 && self.ephemeral_bytes == 0 && self.pods == 0 && self.extended.is_empty()
    }

    pub fn add(&mut self, other: &Resources) {
        self.cpu_milli += other.cpu_milli;
        self.memory_bytes += other.memory_bytes;
        self.ephemeral_bytes += other.ephemeral_bytes;
        self.pods += other.pods;
        for (name, amount) in &other.extended {
            let sum = self.extended(name) + amount;
            self.set_extended(name, sum);
        }
    }

    pub fn sub(&mut self, other: &Resources) {
        self.cpu_milli -= other.cpu_milli;
        self.memory_bytes -= other.memory_bytes;
        self.ephemeral_bytes -= other.ephemeral_bytes;
        self.pods -= other.pods;
        for (name, amount) in &other.extended {
            let diff = self.extended(name) - amount;
            self.set_extended(name, diff);
        }
    }

    pub fn plus(&self, other: &Resources) -> Resources {
        let mut sum = self.clone();
        sum.add(other);
        sum
    }

    pub fn minus(&self, other: &Resources) -> Resources {
        let mut diff = self.clone();
        diff.sub(other);
        diff
    }

    /// Every field multiplied by `factor`, rounded up (request scaling in
    /// the sensitivity table). Pod slots stay as they are.
    pub fn scaled(&self, factor: f64) -> Resources {
        let s = |v: i64| (v as f64 * factor).ceil() as i64;
        Resources {
            cpu_milli: s(self.cpu_milli),
            memory_bytes: s(self.memory_bytes),
            ephemeral_bytes: s(self.ephemeral_bytes),
            pods: self.pods,
            extended: self.extended.iter().map(|(n, v)| (n.clone(), s(*v))).collect(),
        }
    }

    /// Checks that `self` (a request) fits into `free`. A resource the
    /// request does not mention is never a shortfall, and an extended
    /// resource `free` does not list counts as zero, as kube-scheduler's
    /// NodeResourcesFit does.
    pub fn fits_in(&self, free: &Resources) -> Result<(), Shortfall> {
        let check = |resource: &str, requested: i64, available: i64| {
            if requested > 0 && requested > available { Err(Shortfall { resource: resource.to_string(), requested, available }) } else { Ok(()) }
        };
        check("pods", self.pods, free.pods)?;
        check("cpu", self.cpu_milli, free.cpu_milli)?;
        check("memory", self.memory_bytes, free.memory_bytes)?;
        check("ephemeral-storage", self.ephemeral_bytes, free.ephemeral_bytes)?;
        for (name, amount) in &self.extended {
            check(name, *amount, free.extended(name))?;
        }
        Ok(())
    }

    /// The same test as [`Resources::fits_in`] without building the shortfall:
    /// this is the scheduler's hot path.
    pub fn fits(&self, free: &Resources) -> bool {
        let ok = |requested: i64, available: i64| requested <= 0 || requested <= available;
        ok(self.pods, free.pods)
            && ok(self.cpu_milli, free.cpu_milli)
            && ok(self.memory_bytes, free.memory_bytes)
            && ok(self.ephemeral_bytes, free.ephemeral_bytes)
            && self.extended.iter().all(|(name, amount)| ok(*amount, free.extended(name)))
    }

    /// Component-wise maximum, as used for init containers.
    pub fn max_with(&self, other: &Resources) -> Resources {
        let mut out = Resources {
            cpu_milli: self.cpu_milli.max(other.cpu_milli),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
            ephemeral_bytes: self.ephemeral_bytes.max(other.ephemeral_bytes),
            pods: self.pods.max(other.pods),
            extended: self.extended.clone(),
        };
        for (name, amount) in &other.extended {
            let m = out.extended(name).max(*amount);
            out.set_extended(name, m);
        }
        out
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} vCPU, {}", crate::quantity::format_cpu_milli(self.cpu_milli), crate::quantity::format_bytes(self.memory_bytes))?;
        for (name, amount) in &self.extended {
            write!(f, ", {amount} {name}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resources_missing_on_the_node_count_as_zero() {
        let pod = Resources::new(1000, 1 << 30).with_extended(GPU, 1);
        let node = Resources::new(8000, 8 << 30).with_pods(110);
        let short = pod.fits_in(&node).unwrap_err();
        assert_eq!(short.resource, GPU);
        assert_eq!(short.available, 0);
    }

    #[test]
    fn a_zero_request_fits_even_an_overcommitted_node() {
        let pod = Resources::default();
        let free = Resources::new(-500, -1);
        assert!(pod.fits(&free));
    }

    #[test]
    fn arithmetic_keeps_extended_sorted_and_drops_zeros() {
        let mut a = Resources::default().with_extended("b.io/x", 2).with_extended("a.io/y", 1);
        assert_eq!(a.extended[0].0, "a.io/y");
        a.sub(&Resources::default().with_extended("a.io/y", 1));
        assert_eq!(a.extended.len(), 1);
    }

    #[test]
    fn pods_slot_is_checked_first() {
        let pod = Resources::new(1, 1).with_pods(1);
        let free = Resources::new(1000, 1000).with_pods(0);
        assert_eq!(pod.fits_in(&free).unwrap_err().resource, "pods");
    }
}
