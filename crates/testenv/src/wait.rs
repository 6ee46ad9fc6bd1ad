use std::future::Future;
use std::time::Duration;

/// Interval between two checks of [`eventually`]; short, because the
/// control plane is local and tests wait on it.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Polls `check` until it returns `Ok`, and returns that value. `check`
/// returns `Err` with a description of what it saw while not there yet.
///
/// The control plane converges asynchronously (the scheduler binds, kwok
/// reports Running, the disruption controller computes PDB status), so tests
/// wait for an observable state instead of sleeping.
///
/// # Panics
/// When `timeout` passes without `check` returning `Ok`; the message names
/// `what` was awaited and shows the last observation `check` reported.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last_seen = match check().await {
            Ok(value) => return value,
            Err(last_seen) => last_seen,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last_seen}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
