//! Kubernetes resource quantities ("500m", "2Gi", "1.5", "1e3") parsed into
//! integers: millicores for cpu, bytes or plain units for everything else.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid quantity {text:?}: {why}")]
pub struct QuantityError {
    pub text: String,
    pub why: &'static str,
}

/// Parses a quantity and returns it scaled by `scale` (1000 for cpu in
/// millicores, 1 for bytes and counts), rounding up as Kubernetes does.
pub fn parse_quantity(text: &str, scale: i64) -> Result<i64, QuantityError> {
    let err = |why| QuantityError { text: text.to_string(), why };
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let (number, multiplier): (&str, f64) = {
        const BINARY: [(&str, f64); 6] = [
            ("Ki", 1024.0),
            ("Mi", 1048576.0),
            ("Gi", 1073741824.0),
            ("Ti", 1099511627776.0),
            ("Pi", 1125899906842624.0),
            ("Ei", 1152921504606846976.0),
        ];
        const DECIMAL: [(&str, f64); 8] = [("n", 1e-9), ("u", 1e-6), ("m", 1e-3), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12), ("P", 1e15)];
        if let Some((suffix, m)) = BINARY.iter().find(|(suf, _)| s.ends_with(suf)) {
            (&s[..s.len() - suffix.len()], *m)
        } else if let Some((suffix, m)) = DECIMAL.iter().find(|(suf, _)| s.ends_with(suf)) {
            (&s[..s.len() - suffix.len()], *m)
        } else if s.ends_with('E') && !s[..s.len() - 1].contains(['e', 'E']) {
            (&s[..s.len() - 1], 1e18)
        } else {
            (s, 1.0)
        }
    };
    if number.is_empty() {
        return Err(err("no number before the suffix"));
    }
    if !number.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'e' | 'E')) {
        return Err(err("not a number"));
    }
    let value: f64 = number.parse().map_err(|_| err("not a number"))?;
    if !value.is_finite() {
        return Err(err("not finite"));
    }
    if value < 0.0 {
        return Err(err("negative"));
    }
    let scaled = (value * multiplier * scale as f64).ceil();
    if scaled > i64::MAX as f64 / 2.0 {
        return Err(err("too large"));
    }
    Ok(scaled as i64)
}

/// Formats millicores the way people read them: "8", "1.5", "250m".
pub fn format_cpu_milli(milli: i64) -> String {
    if milli % 1000 == 0 {
        format!("{}", milli / 1000)
    } else if milli > 1000 {
        format!("{:.1}", milli as f64 / 1000.0)
    } else {
        format!("{milli}m")
    }
}

/// Formats bytes in the largest binary unit that keeps one decimal honest.
pub fn format_bytes(bytes: i64) -> String {
    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;
    if bytes >= GI {
        if bytes % GI == 0 { format!("{}Gi", bytes / GI) } else { format!("{:.1}Gi", bytes as f64 / GI as f64) }
    } else if bytes >= MI {
        format!("{}Mi", bytes / MI)
    } else {
        format!("{bytes}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_kubernetes_writes() {
        let cases: &[(&str, i64, i64)] = &[
            ("500m", 1000, 500),
            ("1", 1000, 1000),
            ("1.5", 1000, 1500),
            ("0.1", 1000, 100),
            ("2Gi", 1, 2 << 30),
            ("128Mi", 1, 128 << 20),
            ("1G", 1, 1_000_000_000),
            ("1e3", 1, 1000),
            ("1k", 1, 1000),
            ("100", 1, 100),
            ("1n", 1000, 1),
        ];
        for (text, scale, want) in cases {
            assert_eq!(parse_quantity(text, *scale), Ok(*want), "{text}");
        }
    }

    #[test]
    fn rejects_garbage_with_the_text_in_the_error() {
        for bad in ["", "Gi", "abc", "-1", "1..2", "1Qi", "nan"] {
            let err = parse_quantity(bad, 1).unwrap_err();
            assert_eq!(err.text, bad);
        }
    }
}
