//! Kubernetes resource quantities ("500m", "2Gi", "1.5", "1e3") parsed into
//! integers: millicores for cpu, bytes or plain units for everything else.
//!
//! The grammar is the one `k8s.io/apimachinery/pkg/api/resource` reads:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | +<number> | -<number>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= e<signedNumber> | E<signedNumber>   (integer exponent)
//! ```
//!
//! "1E" is Exa; "1E3" is an exponent. Values are computed exactly, on
//! decimal digits, never through floating point.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid quantity {text:?}: {why}")]
pub struct QuantityError {
    pub text: String,
    pub why: &'static str,
}

/// The longest quantity read, after trimming: more is a typo or an attack.
const MAX_LEN: usize = 100;

/// The largest result: twice it still fits an i64.
const LIMIT: u64 = (i64::MAX / 2) as u64;

/// Parses a quantity and returns it scaled by `scale` (1000 for cpu in
/// millicores, 1 for bytes and counts), rounding up as Kubernetes'
/// `MilliValue()` and `Value()` do: "1n" at scale 1000 is 1.
pub fn parse_quantity(text: &str, scale: i64) -> Result<i64, QuantityError> {
    let err = |why| QuantityError { text: text.to_string(), why };
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.len() > MAX_LEN {
        return Err(err("too long"));
    }
    Quantity::parse(s.as_bytes()).and_then(|q| q.scaled(scale)).map_err(err)
}

/// A quantity split into its parts: ±int.frac × 10^pow10 × 2^pow2.
struct Quantity<'a> {
    negative: bool,
    int: &'a [u8],
    frac: &'a [u8],
    pow10: i64,
    pow2: u32,
}

impl<'a> Quantity<'a> {
    fn parse(s: &'a [u8]) -> Result<Self, &'static str> {
        let (negative, rest) = match s {
            [b'-', rest @ ..] => (true, rest),
            [b'+', rest @ ..] => (false, rest),
            rest => (false, rest),
        };
        let (int, rest) = split_digits(rest);
        let (frac, rest) = match rest {
            [b'.', rest @ ..] => split_digits(rest),
            rest => (&rest[..0], rest),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(if !rest.is_empty() && suffix(rest).is_ok() { "no number before the suffix" } else { "not a number" });
        }
        let (pow10, pow2) = suffix(rest)?;
        Ok(Quantity { negative, int, frac, pow10, pow2 })
    }

    /// The value times `scale`, rounded up.
    fn scaled(&self, scale: i64) -> Result<i64, &'static str> {
        let mut n = Digits::new(self.int, self.frac).ok_or("too long")?;
        if n.is_zero() {
            return Ok(0); // "-0" included
        }
        if self.negative {
            return Err("negative");
        }
        if scale == 0 {
            return Ok(0);
        }
        n.mul(scale.unsigned_abs()).ok_or("too large")?;
        n.mul(1 << self.pow2).ok_or("too large")?;
        // The value is n × 10^pow10; a non-negative value times a negative
        // scale rounds up by rounding its magnitude down.
        let frac_len = i64::try_from(self.frac.len()).map_err(|_| "too long")?;
        let pow10 = self.pow10.checked_sub(frac_len).ok_or("too large")?;
        let magnitude = n.round(pow10, scale > 0).ok_or("too large")?;
        if magnitude > LIMIT {
            return Err("too large");
        }
        // LIMIT < i64::MAX, so both signs fit.
        let magnitude = magnitude as i64;
        Ok(if scale < 0 { -magnitude } else { magnitude })
    }
}

/// Splits a run of ASCII digits off the front of `s`.
fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    s.split_at(s.iter().take_while(|c| c.is_ascii_digit()).count())
}

/// The suffix as (power of ten, power of two).
fn suffix(s: &[u8]) -> Result<(i64, u32), &'static str> {
    Ok(match s {
        b"" => (0, 0),
        b"n" => (-9, 0),
        b"u" => (-6, 0),
        b"m" => (-3, 0),
        b"k" => (3, 0),
        b"M" => (6, 0),
        b"G" => (9, 0),
        b"T" => (12, 0),
        b"P" => (15, 0),
        b"E" => (18, 0), // Exa, not an exponent: Kubernetes reads it so
        b"Ki" => (0, 10),
        b"Mi" => (0, 20),
        b"Gi" => (0, 30),
        b"Ti" => (0, 40),
        b"Pi" => (0, 50),
        b"Ei" => (0, 60),
        [b'e' | b'E', exponent @ ..] => (parse_exponent(exponent)?, 0),
        _ => return Err("unknown suffix"),
    })
}

/// The integer after `e`: an optional sign and at least one digit.
fn parse_exponent(s: &[u8]) -> Result<i64, &'static str> {
    let (negative, digits) = match s {
        [b'-', digits @ ..] => (true, digits),
        [b'+', digits @ ..] => (false, digits),
        digits => (false, digits),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("bad exponent");
    }
    let mut e: i64 = 0;
    for &d in digits {
        e = e.checked_mul(10).and_then(|e| e.checked_add(i64::from(d - b'0'))).ok_or("exponent out of range")?;
    }
    Ok(if negative { -e } else { e })
}

/// A natural number as decimal digits, least significant first. Room for
/// the longest input (MAX_LEN digits) times any i64 scale times 2^60.
struct Digits {
    d: [u8; Digits::CAP],
    len: usize,
}

impl Digits {
    const CAP: usize = MAX_LEN + 2 * 20;

    /// The number whose digits are `int` then `frac` (ASCII, most
    /// significant first), without leading zeros.
    fn new(int: &[u8], frac: &[u8]) -> Option<Digits> {
        let mut n = Digits { d: [0; Digits::CAP], len: 0 };
        for &c in int.iter().chain(frac).rev() {
            *n.d.get_mut(n.len)? = c - b'0';
            n.len += 1;
        }
        n.trim();
        Some(n)
    }

    fn trim(&mut self) {
        while self.len > 0 && self.d[self.len - 1] == 0 {
            self.len -= 1;
        }
    }

    fn is_zero(&self) -> bool {
        self.len == 0
    }

    /// Multiplies in place; None when out of room.
    fn mul(&mut self, factor: u64) -> Option<()> {
        let mut carry: u128 = 0;
        for d in &mut self.d[..self.len] {
            let v = u128::from(*d) * u128::from(factor) + carry;
            *d = (v % 10) as u8;
            carry = v / 10;
        }
        while carry > 0 {
            *self.d.get_mut(self.len)? = (carry % 10) as u8;
            self.len += 1;
            carry /= 10;
        }
        self.trim();
        Some(())
    }

    /// self × 10^pow10 rounded to an integer, up when `up` and down
    /// otherwise; None when that does not fit a u64.
    fn round(&self, pow10: i64, up: bool) -> Option<u64> {
        let (kept, dropped): (&[u8], &[u8]) = if pow10 >= 0 {
            (&self.d[..self.len], &[])
        } else {
            let k = usize::try_from(pow10.unsigned_abs()).unwrap_or(usize::MAX).min(self.len);
            (&self.d[k..self.len], &self.d[..k])
        };
        let mut v: u64 = 0;
        for &d in kept.iter().rev() {
            v = v.checked_mul(10)?.checked_add(u64::from(d))?;
        }
        if pow10 > 0 {
            let zeros = u32::try_from(pow10).ok()?;
            v = v.checked_mul(10u64.checked_pow(zeros)?)?;
        }
        let inexact = dropped.iter().any(|&d| d != 0);
        v.checked_add(u64::from(up && inexact))
    }
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
    use proptest::prelude::*;

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

    /// Values the old f64 parser read one unit high, or otherwise wrong.
    #[test]
    fn reads_exactly_where_floats_did_not() {
        let cases: &[(&str, &str, i64, i64)] = &[
            ("3550m was 3551", "3550m", 1000, 3550),
            ("1900m was 1901", "1900m", 1000, 1900),
            ("3.55 cores", "3.55", 1000, 3550),
            ("1.9 cores", "1.9", 1000, 1900),
            ("a millicore in cores", "0.001", 1000, 1),
            ("0.3 cores", "0.3", 1000, 300),
            ("0.07 cores", "0.07", 1000, 70),
            ("millicores as an exponent", "3550e-3", 1000, 3550),
            ("1.1Gi rounds up once", "1.1Gi", 1, 1_181_116_007),
            ("0.1Ki", "0.1Ki", 1, 103),
            ("the limit, which f64 rounds to 2^62", "4611686018427387903", 1, i64::MAX / 2),
            ("the limit in millicores", "4611686018427387.903", 1000, i64::MAX / 2),
            ("1e-400 underflowed to 0", "1e-400", 1, 1),
            ("more digits than a u128 holds, just over", "0.500000000000000000000000000000000000000000000000000000000001", 1000, 501),
            ("more digits than a u128 holds, exact", "0.500000000000000000000000000000000000000000000000000000000000", 1000, 500),
            ("many significant digits", "123456789.123456789123456789123456789123456789", 1000, 123_456_789_124),
        ];
        for (name, text, scale, want) in cases {
            assert_eq!(parse_quantity(text, *scale), Ok(*want), "{name}: {text}");
        }
    }

    #[test]
    fn every_millicore_value_reads_back_exactly() {
        for v in 1..=20_000i64 {
            let milli = format!("{v}m");
            assert_eq!(parse_quantity(&milli, 1000), Ok(v), "{milli}");
            assert_eq!(parse_quantity(&milli, 1), Ok((v + 999) / 1000), "{milli} at scale 1");
            let cores = format!("{}.{:03}", v / 1000, v % 1000);
            assert_eq!(parse_quantity(&cores, 1000), Ok(v), "{cores}");
            let short = cores.trim_end_matches('0').trim_end_matches('.');
            assert_eq!(parse_quantity(short, 1000), Ok(v), "{short}");
            let bare = format!(".{:03}", v % 1000);
            if v < 1000 {
                assert_eq!(parse_quantity(&bare, 1000), Ok(v), "{bare}");
            }
        }
    }

    #[test]
    fn grammar_corners() {
        let cases: &[(&str, i64, Result<i64, &str>)] = &[
            ("1E", 1, Ok(1_000_000_000_000_000_000)),
            ("1E3", 1, Ok(1000)),
            ("1e3", 1, Ok(1000)),
            ("1E+3", 1, Ok(1000)),
            ("1e03", 1, Ok(1000)),
            ("1e0", 1, Ok(1)),
            ("1e-3", 1000, Ok(1)),
            ("15e-1", 1, Ok(2)),
            ("+1", 1, Ok(1)),
            ("+1.5", 1000, Ok(1500)),
            (".5", 1, Ok(1)),
            (".5", 1000, Ok(500)),
            ("5.", 1, Ok(5)),
            ("5.Gi", 1, Ok(5 << 30)),
            (".5Ki", 1, Ok(512)),
            ("1.e3", 1, Ok(1000)),
            ("0", 1, Ok(0)),
            ("+0", 1, Ok(0)),
            ("-0", 1, Ok(0)),
            ("-0.000Gi", 1000, Ok(0)),
            ("000123", 1, Ok(123)),
            ("0.5", 1, Ok(1)),
            ("1n", 1, Ok(1)),
            ("1u", 1000, Ok(1)),
            ("999n", 1000, Ok(1)),
            ("1000001n", 1000, Ok(2)),
            ("  2Gi\n", 1, Ok(2 << 30)),
            ("1e100", 1, Err("too large")),
            ("1e-100", 1, Ok(1)),
            ("1e-100", 1000, Ok(1)),
            ("0e-100", 1, Ok(0)),
            ("0e100", 1, Ok(0)),
            ("1e99999999999999999999", 1, Err("exponent out of range")),
            ("4611686018427387904", 1, Err("too large")),
            ("4611686018427387.904", 1000, Err("too large")),
            ("4611686018427387.9031", 1000, Err("too large")),
            ("3Ei", 1, Ok(3 << 60)),
            ("4Ei", 1, Err("too large")),
            ("-1", 1, Err("negative")),
            ("-1n", 1000, Err("negative")),
            ("-1e-100", 1, Err("negative")),
            ("1.5", 0, Ok(0)),
            ("1.5", -1, Ok(-1)),
            ("1.5", -1000, Ok(-1500)),
        ];
        for (text, scale, want) in cases {
            let got = parse_quantity(text, *scale).map_err(|e| e.why);
            assert_eq!(got, *want, "{text:?} at scale {scale}");
        }
        let longest = format!("0.{}1", "0".repeat(97));
        assert_eq!(longest.len(), 100);
        assert_eq!(parse_quantity(&longest, 1), Ok(1));
    }

    #[test]
    fn rejects_what_the_grammar_rejects() {
        let too_long = "1".repeat(101);
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            (" \t", "empty"),
            ("Gi", "no number before the suffix"),
            ("m", "no number before the suffix"),
            ("E", "no number before the suffix"),
            ("-Ki", "no number before the suffix"),
            ("e3", "no number before the suffix"),
            ("abc", "not a number"),
            ("nan", "not a number"),
            ("NaN", "not a number"),
            ("inf", "not a number"),
            ("infinity", "not a number"),
            ("-", "not a number"),
            ("+", "not a number"),
            (".", "not a number"),
            ("-.", "not a number"),
            ("+-1", "not a number"),
            ("--1", "not a number"),
            ("1..2", "unknown suffix"),
            ("1.2.3", "unknown suffix"),
            ("1Qi", "unknown suffix"),
            ("1 Gi", "unknown suffix"),
            ("1 2", "unknown suffix"),
            ("1ki", "unknown suffix"),
            ("1K", "unknown suffix"),
            ("1mi", "unknown suffix"),
            ("1gi", "unknown suffix"),
            ("1KiB", "unknown suffix"),
            ("1Ki3", "unknown suffix"),
            ("1µ", "unknown suffix"),
            ("0x10", "unknown suffix"),
            ("1_000", "unknown suffix"),
            ("1,5", "unknown suffix"),
            ("1-", "unknown suffix"),
            ("1e", "bad exponent"),
            ("1E+", "bad exponent"),
            ("1e-", "bad exponent"),
            ("1e1.5", "bad exponent"),
            ("1e3k", "bad exponent"),
            ("1e3Ki", "bad exponent"),
            ("1ee3", "bad exponent"),
            ("1e 3", "bad exponent"),
            ("1e100", "too large"),
            (&too_long, "too long"),
        ];
        for (text, why) in cases {
            let want = QuantityError { text: text.to_string(), why };
            assert_eq!(parse_quantity(text, 1000), Err(want), "{text:?}");
        }
    }

    /// Every suffix, with its multiplier as the fraction numerator / denominator.
    fn suffixes() -> Vec<(String, u128, u128)> {
        let pow10 = |e: i32| if e >= 0 { (10u128.pow(e.unsigned_abs()), 1) } else { (1, 10u128.pow(e.unsigned_abs())) };
        let mut all = Vec::new();
        for (suffix, e) in [("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18)] {
            let (num, den) = pow10(e);
            all.push((suffix.to_string(), num, den));
        }
        for (i, suffix) in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].into_iter().enumerate() {
            all.push((suffix.to_string(), 1 << (10 * (i + 1)), 1));
        }
        for e in -3..=9 {
            let (num, den) = pow10(e);
            all.push((format!("e{e}"), num, den));
            all.push((format!("E{e}"), num, den));
            if e >= 0 {
                all.push((format!("e+{e}"), num, den));
            }
        }
        all
    }

    /// ceil(numerator / denominator) as parse_quantity reports it; None for
    /// a numerator past u128, which is far past the limit.
    fn expected(numerator: Option<u128>, denominator: u128) -> Result<i64, &'static str> {
        match numerator.map(|n| n.div_ceil(denominator)) {
            Some(v) if v <= (i64::MAX / 2) as u128 => Ok(v as i64),
            _ => Err("too large"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn integers_with_every_suffix(n in 0u64..1 << 40, (suffix, num, den) in proptest::sample::select(suffixes()), scale in prop_oneof![Just(1i64), Just(1000)]) {
            let text = format!("{n}{suffix}");
            let want = expected(u128::from(n).checked_mul(num).and_then(|v| v.checked_mul(scale as u128)), den);
            prop_assert_eq!(parse_quantity(&text, scale).map_err(|e| e.why), want, "{}", text);
        }

        #[test]
        fn fractions_with_every_suffix(
            n in 0u64..1 << 40,
            frac in "[0-9]{0,8}",
            leading_zeros in 0usize..3,
            omit_int in any::<bool>(),
            (suffix, num, den) in proptest::sample::select(suffixes()),
            scale in prop_oneof![Just(1i64), Just(1000)],
        ) {
            let omit_int = omit_int && !frac.is_empty();
            let int = if omit_int { 0 } else { n };
            let int_text = if omit_int { String::new() } else { format!("{}{n}", "0".repeat(leading_zeros)) };
            let text = format!("{int_text}.{frac}{suffix}");
            let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().unwrap() };
            let shift = 10u128.pow(frac.len() as u32);
            let numerator = (u128::from(int) * shift + frac_value).checked_mul(num).and_then(|v| v.checked_mul(scale as u128));
            let want = expected(numerator, den * shift);
            prop_assert_eq!(parse_quantity(&text, scale).map_err(|e| e.why), want, "{}", text);
        }

        #[test]
        fn garbage_never_panics(text in "\\PC{0,40}", scale in any::<i64>()) {
            if let Err(e) = parse_quantity(&text, scale) {
                prop_assert_eq!(e.text, text);
            }
        }

        #[test]
        fn near_misses_never_panic_and_stay_in_range(
            text in "[-+. 0-9eEinumkKMGTPi]{0,24}",
            scale in prop_oneof![Just(1i64), Just(1000), any::<i64>()],
        ) {
            match parse_quantity(&text, scale) {
                Ok(v) => {
                    prop_assert!(v.unsigned_abs() <= LIMIT, "{} -> {}", text, v);
                    prop_assert!(scale < 0 || v >= 0, "{} -> {}", text, v);
                }
                Err(e) => prop_assert_eq!(e.text, text),
            }
        }
    }
}
