//! BMC credentials. They come from files (a password file, or a directory
//! laid out like a mounted Kubernetes Secret) or from the `data` of a Secret
//! the controller fetched; they never come from a command-line value and
//! never appear in `Debug` output, logs or errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A string that must not be shown: `Debug` prints `<redacted>` and there
/// is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that sends it to the BMC.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A BMC account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: Secret,
}

/// A reference to a Kubernetes Secret holding `username` and `password`
/// keys, as Metal3's BareMetalHost `bmc.credentialsName` does. The
/// controller fetches it and calls [`Credentials::from_secret_data`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl Credentials {
    pub fn new(username: impl Into<String>, password: Secret) -> Self {
        Credentials { username: username.into(), password }
    }

    /// A username given directly and a password read from a file holding
    /// only the password (one trailing newline is ignored).
    ///
    /// # Errors
    /// [`Error::CredentialsUnreadable`] when the file cannot be read or is empty.
    pub fn from_password_file(username: impl Into<String>, path: &Path) -> Result<Self> {
        let password = read_value(path)?;
        Ok(Credentials::new(username, Secret(password)))
    }

    /// A directory holding the files `username` and `password`: the layout
    /// of a Kubernetes Secret mounted as a volume.
    ///
    /// # Errors
    /// [`Error::CredentialsUnreadable`] when either file is missing or empty.
    pub fn from_directory(dir: &Path) -> Result<Self> {
        let username = read_value(&dir.join("username"))?;
        let password = read_value(&dir.join("password"))?;
        Ok(Credentials::new(username, Secret(password)))
    }

    /// The decoded `data` of a Kubernetes Secret (`username`, `password`).
    ///
    /// # Errors
    /// [`Error::CredentialsUnreadable`] naming the Secret and the missing or
    /// non-UTF-8 key; values are never echoed.
    pub fn from_secret_data(secret: &SecretRef, data: &BTreeMap<String, Vec<u8>>) -> Result<Self> {
        let path = PathBuf::from(format!("secret {}/{}", secret.namespace, secret.name));
        let key = |name: &str| -> Result<String> {
            let bytes =
                data.get(name).ok_or_else(|| Error::CredentialsUnreadable { path: path.clone(), reason: format!("key {name:?} is missing") })?;
            let value = std::str::from_utf8(bytes)
                .map_err(|_| Error::CredentialsUnreadable { path: path.clone(), reason: format!("key {name:?} is not UTF-8") })?;
            let value = trim_newline(value);
            if value.is_empty() {
                return Err(Error::CredentialsUnreadable { path: path.clone(), reason: format!("key {name:?} is empty") });
            }
            Ok(value.to_owned())
        };
        Ok(Credentials::new(key("username")?, Secret(key("password")?)))
    }
}

fn trim_newline(value: &str) -> &str {
    value.strip_suffix('\n').map(|v| v.strip_suffix('\r').unwrap_or(v)).unwrap_or(value)
}

fn read_value(path: &Path) -> Result<String> {
    let raw = std::fs::read_to_string(path).map_err(|err| Error::CredentialsUnreadable { path: path.to_owned(), reason: err.kind().to_string() })?;
    let value = trim_newline(&raw);
    if value.is_empty() {
        return Err(Error::CredentialsUnreadable { path: path.to_owned(), reason: "file is empty".into() });
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_password() {
        let creds = Credentials::new("admin", Secret::new("hunter2"));
        let shown = format!("{creds:?}");
        assert!(shown.contains("admin"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn password_file_loses_only_its_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("ironclaim-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, " pass word \n").unwrap();
        let creds = Credentials::from_password_file("root", &file).unwrap();
        assert_eq!(creds.password.expose(), " pass word ");
        std::fs::write(dir.join("username"), "root\n").unwrap();
        let creds = Credentials::from_directory(&dir).unwrap();
        assert_eq!(creds.username, "root");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secret_data_without_password_names_the_key_not_the_values() {
        let secret = SecretRef { namespace: "metal".into(), name: "bmc-1".into() };
        let data = BTreeMap::from([("username".to_owned(), b"admin".to_vec())]);
        let err = Credentials::from_secret_data(&secret, &data).unwrap_err();
        let shown = format!("{err}");
        assert!(shown.contains("metal/bmc-1") && shown.contains("\"password\""), "{shown}");
        assert!(!shown.contains("admin"), "{shown}");
    }
}
