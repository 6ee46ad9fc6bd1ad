//! Go durations (`90s`, `10m`, `1h30m`, `1.5h`) as annotations and the API
//! write them, parsed without overflow or panic on any input.

/// The longest duration accepted: a hundred years. Longer is a typo.
pub const MAX_DURATION_S: u64 = 100 * 365 * 24 * 3600;

/// Parses a non-negative Go duration into whole seconds, rounding up.
///
/// # Errors
/// A message saying what is wrong: empty, a sign, a missing or unknown
/// unit, a malformed number, or longer than [`MAX_DURATION_S`].
pub fn parse_duration_s(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty".into());
    }
    if s.starts_with('-') {
        return Err("negative".into());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(0);
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
    Ok(total_nanos.div_ceil(1_000_000_000) as u64)
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
    fn rejects_what_go_rejects_and_what_is_absurd() {
        for bad in ["", "-5m", "10", "1x", "h", "1..5s", ".s", "1e3s", "99999999999999999999999999999999999h", "1000000h", "5m-", "1h 30m"] {
            assert!(parse_duration_s(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
