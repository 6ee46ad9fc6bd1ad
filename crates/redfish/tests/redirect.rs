//! Issue 14: the Redfish client must not follow a redirect to another
//! origin with the session token or Basic credentials. BMC `a` logs the
//! client in and redirects every other request to `b`, another origin
//! that records what credentials reach it.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use ironclaim_redfish::{AuthMode, Bmc, BmcAddress, BmcConfig, Credentials, SystemSelector, Timing};
use tokio::sync::Semaphore;

type Seen = Arc<Mutex<Vec<String>>>;

async fn serve(router: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// The other origin: asks for credentials, records the ones that reach
/// it, and answers as a BMC would.
async fn record(State(seen): State<Seen>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let mut got = false;
    for name in ["x-auth-token", "authorization"] {
        if let Some(v) = headers.get(name) {
            seen.lock().unwrap().push(format!("{name}: {} for {uri}", v.to_str().unwrap_or("?")));
            got = true;
        }
    }
    // The service root is open to all, as Redfish has it; the rest asks.
    if !got && uri.path().trim_end_matches('/') != "/redfish/v1" {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let body = match uri.path().trim_end_matches('/') {
        "/redfish/v1" => {
            r#"{"Systems": {"@odata.id": "/redfish/v1/Systems"}, "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}}"#
        }
        "/redfish/v1/Systems" => r#"{"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]}"#,
        _ => r#"{"Id": "1", "PowerState": "On"}"#,
    };
    (StatusCode::OK, [("Content-Type", "application/json")], body).into_response()
}

async fn start(auth: AuthMode) -> (Bmc, Seen) {
    let seen: Seen = Arc::default();
    let b = serve(Router::new().fallback(record).with_state(seen.clone())).await;
    let login = || async {
        (
            StatusCode::CREATED,
            [("X-Auth-Token", "secret-token"), ("Location", "/redfish/v1/SessionService/Sessions/1"), ("Content-Type", "application/json")],
            "{}",
        )
            .into_response()
    };
    let elsewhere = move |request: Request| async move {
        let to = format!("http://127.0.0.1:{b}{}", request.uri().path());
        (StatusCode::TEMPORARY_REDIRECT, [("Location", to)]).into_response()
    };
    let a = serve(Router::new().route("/redfish/v1/SessionService/Sessions", post(login)).fallback(elsewhere)).await;
    let endpoint = BmcAddress::parse(&format!("http://127.0.0.1:{a}")).unwrap().endpoint;
    let dir = ironclaim_testenv::TempDir::new("redirect");
    std::fs::write(dir.join("password"), "hunter2").unwrap();
    let mut config = BmcConfig::new(endpoint, Credentials::from_password_file("admin", &dir.join("password")).unwrap());
    config.auth = auth;
    config.timing = Timing { retries: 0, ..Timing::default() };
    (Bmc::new(config, Arc::new(Semaphore::new(4))).unwrap(), seen)
}

#[tokio::test]
async fn a_redirect_to_another_origin_carries_no_session_token() {
    let (bmc, seen) = start(AuthMode::Auto).await;
    let _ = bmc.power_state(&SystemSelector::Id("1".into())).await;
    assert!(seen.lock().unwrap().is_empty(), "credentials followed the redirect: {:?}", seen.lock().unwrap());
}

#[tokio::test]
async fn a_redirect_to_another_origin_carries_no_basic_credentials() {
    let (bmc, seen) = start(AuthMode::Basic).await;
    let _ = bmc.power_state(&SystemSelector::Id("1".into())).await;
    assert!(seen.lock().unwrap().is_empty(), "credentials followed the redirect: {:?}", seen.lock().unwrap());
}
