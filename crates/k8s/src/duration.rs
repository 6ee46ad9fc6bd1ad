//! Go durations, as annotations and the API write them: the one parser,
//! [`ironclaim_core::duration`], under the name this crate has used.

pub use ironclaim_core::duration::{MAX_DURATION_S, parse_duration_s};
