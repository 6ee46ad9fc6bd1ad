//! serde's error messages without the input's values in them.
//!
//! serde quotes what it could not use: `invalid type: string "hunter2",
//! expected i32`. The field may hold a password, a token, an environment
//! value: an error names where (file, document, field path) and what is
//! wrong, never what the field held.

/// ` `password`` when `key` is one of `words`, else nothing.
pub fn quoted_if_known(key: &str, words: &[&str]) -> String {
    if words.contains(&key) { format!(" `{key}`") } else { String::new() }
}

/// What kind of value serde's `Unexpected` describes (`string "x"` is a
/// `string`), without the value.
pub fn value_kind(unexpected: &str) -> &'static str {
    const KINDS: [&str; 17] = [
        "boolean",
        "integer",
        "floating point",
        "character",
        "string",
        "byte array",
        "unit value",
        "Option value",
        "newtype struct",
        "sequence",
        "map",
        "enum",
        "unit variant",
        "newtype variant",
        "tuple variant",
        "struct variant",
        "null",
    ];
    KINDS.into_iter().find(|k| unexpected.strip_prefix(k).is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))).unwrap_or("a value")
}

/// serde's data-model messages with the values taken out. A message of
/// another shape is replaced whole: it may quote anything.
pub fn serde_message(message: &str, words: &[&str]) -> String {
    // The expected part comes from the target type, never from the input;
    // the last `, expected ` is the one serde wrote, whatever the value held.
    let expected = message.rsplit_once(", expected ").map(|(_, e)| e);
    // A key is only ever shown when it equals one of `words`, so a key that
    // holds "`, " itself is cut short and, not being a word, left out.
    let backticked = |prefix: &str| message.strip_prefix(prefix).and_then(|rest| rest.split_once("`, ")).map(|(key, _)| key);
    let with_expected = |head: String| match expected {
        Some(e) => format!("{head}, expected {e}"),
        None => head,
    };
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            return with_expected(format!("{prefix}{}", value_kind(rest)));
        }
    }
    if message.starts_with("invalid length ") || message.starts_with("missing field `") || message.starts_with("duplicate field `") {
        // A length, or a field name of the target type.
        return message.to_string();
    }
    if message.starts_with("unknown variant `") {
        return with_expected("unknown variant".to_string());
    }
    if let Some(key) = backticked("unknown field `") {
        return with_expected(format!("unknown field{}", quoted_if_known(key, words)));
    }
    "invalid value".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_read_from_the_start_of_the_description() {
        assert_eq!(value_kind("string \"a, expected b\""), "string");
        assert_eq!(value_kind("integer `5`"), "integer");
        assert_eq!(value_kind("floating point `1.5`"), "floating point");
        assert_eq!(value_kind("map"), "map");
        assert_eq!(value_kind("stringly hunter2"), "a value");
    }

    #[test]
    fn a_message_keeps_its_kinds_and_expectations_and_drops_its_values() {
        for (message, want) in [
            ("invalid type: string \"hunter2\", expected i32", "invalid type: string, expected i32"),
            ("invalid value: integer `-7`, expected u16", "invalid value: integer, expected u16"),
            ("unknown variant `hunter2`, expected `a` or `b`", "unknown variant, expected `a` or `b`"),
            ("missing field `name`", "missing field `name`"),
            ("input contains invalid characters near hunter2", "invalid value"),
        ] {
            assert_eq!(serde_message(message, &[]), want);
        }
    }
}
