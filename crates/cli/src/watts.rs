//! Watts on the command line: the fleet's power budget. A clap value
//! parser, so a bad value is a usage error naming the flag (exit 2).

/// A power budget: a positive, finite number of watts (`12000`, `7500.5`).
pub fn budget(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(w) if w.is_finite() && w > 0.0 => Ok(w),
        _ => Err("expected a positive number of watts, e.g. 12000".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_a_positive_finite_number_of_watts() {
        assert_eq!(budget("12000"), Ok(12000.0));
        assert_eq!(budget("7500.5"), Ok(7500.5));
        for bad in ["0", "-1", "NaN", "inf", "", "12kW"] {
            assert!(budget(bad).is_err(), "{bad}");
        }
    }
}
