//! BMC addresses and system selectors.
//!
//! Accepted forms, as Metal3 and humans write them:
//!
//! - `https://host[:port]` or `http://host[:port]` (the system named apart)
//! - `redfish://host/redfish/v1/Systems/ID` (HTTPS)
//! - `redfish+https://...`, `redfish+http://...`
//! - vendor-prefixed Metal3 schemes such as `idrac-redfish+https://...` or
//!   `ilo5-redfish://...`, which use the same Redfish protocol here.

use url::Url;

use crate::error::{Error, Result};

/// Where a BMC listens, and optionally which system it manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BmcAddress {
    /// `scheme://host:port/`, no path.
    pub endpoint: Url,
    /// The system named by the address path, if it had one.
    pub system: Option<SystemSelector>,
}

/// How a system on a BMC is named.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SystemSelector {
    /// The `Id` property, which is also the last path segment.
    Id(String),
    /// The `UUID` property, compared case-insensitively.
    Uuid(String),
    /// A full resource path such as `/redfish/v1/Systems/1`.
    Path(String),
}

impl std::fmt::Display for SystemSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SystemSelector::Id(id) => write!(f, "Id {id:?}"),
            SystemSelector::Uuid(uuid) => write!(f, "UUID {uuid}"),
            SystemSelector::Path(path) => write!(f, "at {path}"),
        }
    }
}

impl SystemSelector {
    /// Reads a selector: a path when it starts with `/redfish/v1/`, a UUID
    /// when it has the 8-4-4-4-12 hex shape, an Id otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for an empty selector or one with a `/`
    /// that is not a Redfish path.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::InvalidAddress { address: text.into(), reason: "empty system selector".into() });
        }
        if text.starts_with("/redfish/v1/") {
            return Ok(SystemSelector::Path(text.trim_end_matches('/').to_owned()));
        }
        if text.contains('/') {
            return Err(Error::InvalidAddress {
                address: text.into(),
                reason: "a system is an Id, a UUID or a path starting with /redfish/v1/".into(),
            });
        }
        if looks_like_uuid(text) { Ok(SystemSelector::Uuid(text.to_owned())) } else { Ok(SystemSelector::Id(text.to_owned())) }
    }
}

fn looks_like_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    let lengths = [8, 4, 4, 4, 12];
    groups.len() == lengths.len() && groups.iter().zip(lengths).all(|(group, len)| group.len() == len && group.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Shows an address with any `user:password@` part removed, for errors.
///
/// Everything from the start of the authority (after `://`, or the start
/// when there is none) to the last `@` goes: an address is shown for being
/// wrong, so its shape cannot be trusted (a missing scheme, one slash, a
/// `/` inside the password).
fn redact(address: &str) -> String {
    let Some(at) = address.rfind('@') else { return address.to_owned() };
    let start = address[..at].find("://").map_or(0, |i| i + "://".len());
    format!("{}<redacted>@{}", &address[..start], &address[at + 1..])
}

impl BmcAddress {
    /// Parses an address in any of the accepted forms.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for an unknown scheme, a missing host,
    /// embedded credentials (never accepted: use a credentials file), or a
    /// path other than `/`, `/redfish/v1` or `/redfish/v1/Systems/ID`.
    pub fn parse(address: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidAddress { address: redact(address), reason: reason.into() };
        let (scheme, rest) = address.trim().split_once("://").ok_or_else(|| invalid("missing scheme://"))?;
        let scheme = scheme.to_ascii_lowercase();
        let http_scheme = match scheme.as_str() {
            "http" | "https" => scheme.as_str(),
            s if s.ends_with("redfish") || s.ends_with("redfish+https") => "https",
            s if s.ends_with("redfish+http") => "http",
            _ => return Err(invalid("unsupported scheme (expected https, http, redfish, redfish+https or redfish+http)")),
        };
        let url = Url::parse(&format!("{http_scheme}://{rest}")).map_err(|err| invalid(&err.to_string()))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid("credentials must not be embedded in the address; use a credentials file"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(invalid("missing host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid("a query or fragment is not expected"));
        }
        let path = url.path().trim_end_matches('/');
        let system = match path {
            "" | "/redfish/v1" => None,
            p if p.starts_with("/redfish/v1/Systems/") && p.len() > "/redfish/v1/Systems/".len() => {
                let id = &p["/redfish/v1/Systems/".len()..];
                if id.contains('/') {
                    return Err(invalid("the path must name a system: /redfish/v1/Systems/ID"));
                }
                Some(SystemSelector::Path(p.to_owned()))
            }
            _ => return Err(invalid("the path must be empty or /redfish/v1/Systems/ID")),
        };
        let mut endpoint = url.clone();
        endpoint.set_path("/");
        Ok(BmcAddress { endpoint, system })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metal3_address_names_endpoint_and_system() {
        let addr = BmcAddress::parse("redfish+https://10.0.0.5:8443/redfish/v1/Systems/1").unwrap();
        assert_eq!(addr.endpoint.as_str(), "https://10.0.0.5:8443/");
        assert_eq!(addr.system, Some(SystemSelector::Path("/redfish/v1/Systems/1".into())));
    }

    #[test]
    fn redfish_scheme_without_suffix_means_https_and_plus_http_means_http() {
        assert_eq!(BmcAddress::parse("redfish://bmc/redfish/v1/Systems/x").unwrap().endpoint.scheme(), "https");
        assert_eq!(BmcAddress::parse("redfish+http://bmc:8000").unwrap().endpoint.as_str(), "http://bmc:8000/");
        assert_eq!(BmcAddress::parse("idrac-redfish+https://bmc/").unwrap().endpoint.scheme(), "https");
        assert_eq!(BmcAddress::parse("https://[::1]:8443").unwrap().endpoint.as_str(), "https://[::1]:8443/");
    }

    #[test]
    fn embedded_credentials_are_refused_and_not_echoed() {
        let err = BmcAddress::parse("redfish+https://root:calvin@bmc/redfish/v1/Systems/1").unwrap_err();
        let shown = err.to_string();
        assert!(!shown.contains("calvin") && !shown.contains("root"), "{shown}");
    }

    #[test]
    fn a_password_is_not_echoed_whatever_else_is_wrong_with_the_address() {
        for address in [
            "root:calvin-pw@10.0.0.1",
            "https:/root:calvin-pw@bmc/redfish/v1/Systems/1",
            "https://root:cal/vin-pw@bmc/redfish/v1/Systems/1",
            "https://root:calvin-pw@[::1/x",
            "ftp://root:calvin-pw@bmc",
            "https://root:calvin-pw@bmc:99999",
            " https://root:calvin-pw@@bmc/x?y",
        ] {
            let shown = BmcAddress::parse(address).expect_err(address).to_string();
            assert!(!shown.contains("calvin") && !shown.contains("vin-pw"), "{address}: {shown}");
        }
    }

    #[test]
    fn unknown_scheme_and_foreign_path_are_refused() {
        assert!(BmcAddress::parse("ipmi://bmc").is_err());
        assert!(BmcAddress::parse("https://bmc/redfish/v1/Chassis/1").is_err());
        assert!(BmcAddress::parse("bmc.example").is_err());
    }

    #[test]
    fn selectors_tell_uuid_from_id_from_path() {
        assert_eq!(
            SystemSelector::parse("38947555-7742-3448-3784-823347823834").unwrap(),
            SystemSelector::Uuid("38947555-7742-3448-3784-823347823834".into())
        );
        assert_eq!(SystemSelector::parse("437XR1138R2").unwrap(), SystemSelector::Id("437XR1138R2".into()));
        assert_eq!(SystemSelector::parse("/redfish/v1/Systems/1/").unwrap(), SystemSelector::Path("/redfish/v1/Systems/1".into()));
        assert!(SystemSelector::parse("a/b").is_err());
    }
}
