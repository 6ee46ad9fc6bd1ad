//! Batching of pending pods: the driver's [`Batcher`], on the controller's
//! monotonic clock (a [`Duration`](std::time::Duration) since the loop
//! started).

pub use ironclaim_driver::batch::{Batcher, Windows};
