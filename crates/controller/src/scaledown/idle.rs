//! Since when each server has idled, kept across restarts: the driver's
//! idle clocks ([`ironclaim_driver::idle`]), whose writes this module's
//! caller sends to each Server's `status.idleSince`.

pub use ironclaim_driver::idle::{IdleClock, Seen, Write, stamp};
