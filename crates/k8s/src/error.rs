//! Errors of converting one Kubernetes object into the core's model.

use ironclaim_core::quantity::QuantityError;
use thiserror::Error;

pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

/// A field of one object that cannot be converted. `path` is the field's
/// path inside the object, as `kubectl explain` spells it
/// (`spec.containers[0].resources.requests.cpu`).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error("{path}: invalid quantity {text:?}: {why}")]
    Quantity { path: String, text: String, why: String },
    #[error("{path}: invalid duration {text:?}: {why}")]
    Duration { path: String, text: String, why: String },
    #[error("{path}: unknown {what} {value:?}")]
    UnknownValue { path: String, what: &'static str, value: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: required")]
    Missing { path: String },
}

impl ConvertError {
    pub fn path(&self) -> &str {
        match self {
            ConvertError::Quantity { path, .. }
            | ConvertError::Duration { path, .. }
            | ConvertError::UnknownValue { path, .. }
            | ConvertError::Invalid { path, .. }
            | ConvertError::Missing { path } => path,
        }
    }

    /// The error's kind, for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ConvertError::Quantity { .. } => "invalid_quantity",
            ConvertError::Duration { .. } => "invalid_duration",
            ConvertError::UnknownValue { .. } => "unknown_value",
            ConvertError::Invalid { .. } => "invalid_value",
            ConvertError::Missing { .. } => "missing_field",
        }
    }

    pub(crate) fn quantity(path: String, err: QuantityError) -> Self {
        ConvertError::Quantity { path, text: err.text, why: err.why.to_string() }
    }

    pub(crate) fn invalid(path: String, message: impl Into<String>) -> Self {
        ConvertError::Invalid { path, message: message.into() }
    }
}
