//! What the readers of upstream autoscaling APIs share (CapacityBuffers,
//! ProvisioningRequests, [`crate::buffers`] and
//! [`crate::provisioning_requests`]): a pass every few seconds where the
//! API's CRD is installed, and the conditions they write.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A reader of an API that may not be installed.
pub trait Reader: Send + Sync + 'static {
    /// The API, for logs (`CapacityBuffer (autoscaling.x-k8s.io/v1beta1)`).
    const API: &'static str;
    /// How often it is read.
    const EVERY: Duration;
    /// One pass; a 404 means the CRD is not installed.
    fn pass(&self) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Forgets what earlier passes kept, once the API is gone.
    fn forget(&self);
}

/// Runs `reader` every [`Reader::EVERY`] until aborted. Without the CRD it
/// forgets what it kept and says so once; another failure keeps it.
pub fn spawn<R: Reader>(reader: R) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut absent_said = false;
        loop {
            match reader.pass().await {
                Ok(()) => absent_said = false,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    if !absent_said {
                        tracing::debug!(api = R::API, "the CRD is not installed: nothing to read");
                        absent_said = true;
                    }
                    reader.forget();
                }
                Err(err) => tracing::warn!(api = R::API, error = %err, "reading failed; what the last pass kept stays"),
            }
            tokio::time::sleep(R::EVERY).await;
        }
    })
}

/// A condition as these APIs write it, stamped now.
pub fn condition(type_: &str, ok: bool, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(jiff::Timestamp::now()),
    }
}
