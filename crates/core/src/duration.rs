//! Go durations (`90s`, `10m`, `1h30m`, `1.5h`, `500ms`) as annotations,
//! the API and every command-line flag write them: the one parser of the
//! workspace, without overflow or panic on any input.

use std::time::Duration;

/// The longest duration accepted: a hundred years. Longer is a typo.
pub const MAX_DURATION_S: u64 = 100 * 365 * 24 * 3600;

/// Parses a non-negative Go duration into whole seconds, rounding up.
///
/// # Errors
/// As [`parse_duration`].
pub fn parse_duration_s(text: &str) -> Result<u64, String> {
    parse_duration(text).map(|d| d.as_nanos().div_ceil(1_000_000_000) as u64)
}

/// Parses a duration given on a command line where a bare number has
/// always meant seconds (`90` is `90s`); anything else is a Go duration.
///
/// # Errors
/// As [`parse_duration`].
pub fn parse_duration_or_seconds(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = t.parse().map_err(|_| "too long".to_string())?;
        if seconds > MAX_DURATION_S {
            return Err(format!("longer than {} years", MAX_DURATION_S / (365 * 24 * 3600)));
        }
        return Ok(Duration::from_secs(seconds));
    }
    parse_duration(t)
}

/// Parses a non-negative Go duration, to the nanosecond.
///
/// # Errors
/// A message saying what is wrong: empty, a sign, a missing or unknown
/// unit, a malformed number, or longer than [`MAX_DURATION_S`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty".into());
    }
    if s.starts_with('-') {
        return Err("negative".into());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err("no number".into());
    }
    const MAX_NANOS: u128 = MAX_DURATION_S as u128 * 1_000_000_000;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if number.is_empty() {
            return Err(format!("expected a number before {unit:?}"));
        }
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{00b5}s" | "\u{03bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("missing unit after {number:?} (use ns, us, ms, s, m or h)")),
            other => return Err(format!("unknown unit {other:?} (use ns, us, ms, s, m or h)")),
        };
        let (whole, fraction) = match number.split_once('.') {
            Some((w, f)) => (w, f),
            None => (number, ""),
        };
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(format!("malformed number {number:?}"));
        }
        // More than 30 digits cannot be under the maximum: stop before the
        // arithmetic could overflow.
        if whole.trim_start_matches('0').len() > 30 {
            return Err("too long".into());
        }
        let whole_value: u128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| format!("malformed number {number:?}"))? };
        let mut nanos = whole_value.checked_mul(unit_nanos).ok_or("too long")?;
        // Fractions beyond nanosecond precision are dropped, as Go drops them.
        let mut scale = unit_nanos;
        for digit in fraction.bytes().take(30) {
            scale /= 10;
            if scale == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * scale;
        }
        total_nanos = total_nanos.checked_add(nanos).ok_or("too long")?;
        if total_nanos > MAX_NANOS {
            return Err(format!("longer than {} years", MAX_DURATION_S / (365 * 24 * 3600)));
        }
        rest = after;
    }
    // Under the maximum, so the seconds fit a u64.
    Ok(Duration::new((total_nanos / 1_000_000_000) as u64, (total_nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations_to_whole_seconds_rounding_up() {
        let cases: &[(&str, u64)] = &[
            ("90s", 90),
            ("10m", 600),
            ("1h", 3600),
            ("1h30m", 5400),
            ("1.5h", 5400),
            (".5m", 30),
            ("0", 0),
            ("0s", 0),
            ("+2m", 120),
            ("1500ms", 2),
            ("1ns", 1),
            ("2m0.5s", 121),
            ("1µs", 1),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration_s(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn keeps_what_is_under_a_second() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m0.25s"), Ok(Duration::from_millis(60_250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn a_bare_number_is_seconds_only_where_asked_for() {
        assert_eq!(parse_duration_or_seconds("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration_or_seconds("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration_or_seconds("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("90").is_err());
        for bad in ["", "2d", "-5", "5 m", "99999999999999999999999"] {
            assert!(parse_duration_or_seconds(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn rejects_what_go_rejects_and_what_is_absurd() {
        for bad in ["", "-5m", "10", "1x", "h", "1..5s", ".s", "1e3s", "99999999999999999999999999999999999h", "1000000h", "5m-", "1h 30m"] {
            assert!(parse_duration_s(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
