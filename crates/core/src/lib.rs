//! The pure decision core of ironclaim.
//!
//! No IO, no clock, no async: the core takes a [`Snapshot`] of the world and a
//! time, and returns a [`Plan`]. Every driver (the controller, the simulator,
//! `ironclaim plan`) calls the same functions.
#![forbid(unsafe_code)]
