//! Errors about files that may hold secrets: a BMC inventory, a kubeconfig.
//!
//! Parsers quote the input to be helpful: a snippet of the lines around a
//! mistake, the value that had the wrong type (`invalid type: string
//! "hunter2"`), the key that was not expected. Any of these can be a
//! password. Here an error says where (line and column) and what is wrong
//! in the words of the format, and never quotes the file: no source line,
//! no value, and a key only when it is one of the words the caller names
//! (the format's own field names).

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use ironclaim_k8s::redact::{quoted_if_known, serde_message as redact_serde_message, value_kind as kind};
use serde::de::DeserializeOwned;
use serde_saphyr::{DefaultMessageFormatter, Error as YamlError, MessageFormatter};

/// What is wrong with a file and where, quoting none of it.
#[derive(Debug)]
pub struct Described {
    /// 1-based line and column, when the parser knows them.
    pub at: Option<(u64, u64)>,
    pub message: String,
}

impl Described {
    /// `FILE:LINE:COLUMN: MESSAGE`, as compilers name a place in a file.
    pub fn at_file(&self, path: &Path) -> String {
        match self.at {
            Some((line, column)) => format!("{}:{line}:{column}: {}", path.display(), self.message),
            None => format!("{}: {}", path.display(), self.message),
        }
    }
}

/// `line L, column C: MESSAGE`.
impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((line, column)) => write!(f, "line {line}, column {column}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Parses YAML; on error, the description of [`describe_yaml`].
pub fn from_yaml<T: DeserializeOwned>(text: &str, words: &[&str]) -> Result<T, Described> {
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options(text, options).map_err(|err| describe_yaml(&err, words))
}

/// Parses JSON; on error, the description of [`describe_json`].
pub fn from_json<T: DeserializeOwned>(text: &str, words: &[&str]) -> Result<T, Described> {
    serde_json::from_str(text).map_err(|err| describe_json(&err, words))
}

/// A YAML error without a snippet and without any value of the input; a
/// key is named only if it is in `words`.
pub fn describe_yaml(err: &YamlError, words: &[&str]) -> Described {
    let mut inner = err;
    while let YamlError::AliasError { error, .. } | YamlError::WithSnippet { error, .. } = inner {
        inner = error;
    }
    Described {
        at: err.location().filter(|l| l.line() > 0).map(|l| (l.line(), l.column())),
        message: Redacting { words }.format_message(inner).into_owned(),
    }
}

/// A JSON error, with the same guarantees as [`describe_yaml`].
pub fn describe_json(err: &serde_json::Error, words: &[&str]) -> Described {
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text);
    let message = match err.classify() {
        // The parser's own messages (`expected value`, `EOF while parsing a
        // string`) quote nothing of the input.
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof | serde_json::error::Category::Io => message.to_string(),
        serde_json::error::Category::Data => redact_serde_message(message, words),
    };
    Described { at: (err.line() > 0).then(|| (err.line() as u64, err.column() as u64)), message }
}

/// Renders serde-saphyr's errors with every value and unexpected key left out.
struct Redacting<'w> {
    words: &'w [&'w str],
}

impl MessageFormatter for Redacting<'_> {
    fn format_message<'a>(&self, err: &'a YamlError) -> Cow<'a, str> {
        match err {
            YamlError::SerdeInvalidType { unexpected, expected, .. } => format!("invalid type: {}, expected {expected}", kind(unexpected)).into(),
            YamlError::SerdeInvalidValue { unexpected, expected, .. } => format!("invalid value: {}, expected {expected}", kind(unexpected)).into(),
            YamlError::SerdeUnknownVariant { expected, .. } => format!("unknown variant, expected one of {}", expected.join(", ")).into(),
            YamlError::SerdeUnknownField { field, expected, .. } => {
                format!("unknown field{}, expected one of {}", quoted_if_known(field, self.words), expected.join(", ")).into()
            }
            YamlError::DuplicateMappingKey { key, .. } => {
                format!("duplicate key{}", key.as_deref().map(|k| quoted_if_known(k, self.words)).unwrap_or_default()).into()
            }
            YamlError::NonFiniteFloat { .. } => "a number that is not finite".into(),
            YamlError::TaggedEnumMismatch { target, .. } => format!("a tag that does not name `{target}`").into(),
            // Free-form messages come from Deserialize implementations and
            // may hold anything they were given.
            YamlError::Message { .. } | YamlError::SerdeVariantId { .. } => "invalid value".into(),
            // The rest carry no text of the input: the parser's messages
            // (`did not find expected ',' or '}'`), limits, positions.
            other => DefaultMessageFormatter.format_message(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Account {
        user: String,
        port: u16,
        #[serde(default)]
        secure: bool,
        #[serde(default)]
        mode: Option<Mode>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Basic,
    }

    const WORDS: &[&str] = &["user", "port", "secure", "mode", "password"];

    #[test]
    fn every_kind_of_yaml_mistake_is_described_without_the_value() {
        for (text, says) in [
            ("user: a\nport: hunter2\n", "line 2, column 7: invalid u16"),
            ("user: a\nport: 1\nsecure: hunter2\n", "line 3, column 9: invalid boolean"),
            ("user: [hunter2]\nport: 1\n", "line 1, column 7: expected string scalar"),
            ("user: a\nport: 1\nmode: hunter2\n", "unknown variant, expected one of basic"),
            ("user: a\nport: 1\nhunter2: x\n", "line 3, column 1: unknown field, expected one of user, port, secure, mode"),
            ("user: a\nport: 1\npassword: hunter2\n", "unknown field `password`"),
            ("user: a\nport: 1\nuser: hunter2\n", "duplicate key `user`"),
            ("user: hunter2\n port: 1\n", "line 2, column 6: mapping values are not allowed in this context"),
            ("user: hunter2\nport: 1\n- x\n", "line 3, column 3: while parsing a block mapping, did not find expected key"),
            ("{user: hunter2, port: 1\n", "unclosed bracket"),
            ("user: &a hunter2\nport: *b\n", "line 2, column 7: alias references unknown anchor"),
            ("user: 'hunter2\nport: 1\n", "line 1, column 7: unclosed quote"),
            ("hunter2\n", "line 1, column 1: expected mapping start"),
        ] {
            let err = from_yaml::<Account>(text, WORDS).expect_err(text).to_string();
            assert!(!err.contains("hunter2"), "{text:?}: {err}");
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn every_kind_of_json_mistake_is_described_without_the_value() {
        for (text, says) in [
            (r#"{"user": "a", "port": "hunter2"}"#, "line 1, column 31: invalid type: string, expected u16"),
            (r#"{"user": "a", "port": 1, "secure": "hunter2"}"#, "invalid type: string, expected a boolean"),
            (r#"{"user": 7, "port": 1}"#, "invalid type: integer, expected a string"),
            (r#"{"user": "a", "port": 1, "mode": "hunter2"}"#, "unknown variant, expected `basic`"),
            (r#"{"user": "a", "port": 1, "hunter2": 1}"#, "unknown field, expected one of `user`"),
            (r#"{"user": "a", "port": 1, "password": "hunter2"}"#, "unknown field `password`, expected"),
            (r#"{"user": "a", "port": 1, "hunter2, expected `x`": 1}"#, "unknown field, expected one of `user`"),
            (r#"{"user": "hunter2", "port": 1, "user": "b"}"#, "duplicate field `user`"),
            (r#"{"user": "hunter2", "port": 1"#, "EOF while parsing an object"),
            (r#"{"user": "hunter2" "port": 1}"#, "line 1, column 20: expected `,` or `}`"),
            (r#""hunter2""#, "invalid type: string, expected struct Account"),
        ] {
            let err = from_json::<Account>(text, WORDS).expect_err(text).to_string();
            assert!(!err.contains("hunter2"), "{text:?}: {err}");
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
