//! Durations on the command line: Go's spelling (`90s`, `1h30m`, `500ms`)
//! for every flag that takes one, through the workspace's one parser,
//! [`ironclaim_core::duration`]. These are clap value parsers: a bad value
//! is a usage error naming the flag (exit 2).

use std::time::Duration;

use ironclaim_core::duration::{parse_duration, parse_duration_or_seconds};

const EXAMPLES: &str = "e.g. 90s, 1h30m, 500ms";

/// A Go duration: `90s`, `1h30m`, `500ms`.
pub fn go(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|why| format!("{why}; {EXAMPLES}"))
}

/// A Go duration, or a bare number of seconds, for the flags that took
/// seconds before they took durations.
pub fn go_or_seconds(text: &str) -> Result<Duration, String> {
    parse_duration_or_seconds(text).map_err(|why| format!("{why}; {EXAMPLES}, or a number of seconds"))
}

/// Whole seconds, rounded up: the simulator's clock ticks in seconds.
pub fn whole_seconds(duration: Duration) -> u64 {
    duration.as_nanos().div_ceil(1_000_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_spelling_reads_as_go_does() {
        assert_eq!(go("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(go("500ms"), Ok(Duration::from_millis(500)));
        assert!(go("90").unwrap_err().contains("missing unit"));
        assert_eq!(go_or_seconds("90"), Ok(Duration::from_secs(90)));
        assert!(go_or_seconds("2d").unwrap_err().contains("unknown unit"));
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::ZERO), 0);
    }
}
