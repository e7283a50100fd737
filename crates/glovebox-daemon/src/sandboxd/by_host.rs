//! The router-facing listener (`glovebox serve --router-listen ADDR`, off by default): what
//! agent-sandbox's sandbox-router reaches when it forwards a request for a claim's sandbox
//! to `{name}.{namespace}.svc.{cluster domain}:{X-Sandbox-Port}` — the headless Service the
//! claims controller (crates/glovebox-k8s) points at this node's daemon. docs/scale-out.md
//! has the whole path.
//!
//! The router does not pass on the caller's credentials (both of its implementations drop
//! `Authorization`; the Python one drops every `X-Sandbox-*` header too), so a request here
//! carries nothing but the name it was sent to. Hence:
//! - the sandbox is picked by the `Host` name's first two labels, `{name}.{namespace}`,
//!   matched against the metadata the controller gives the sandboxes it creates
//!   (`agents.x-k8s.io/sandbox-name`, `agents.x-k8s.io/namespace`); `X-Sandbox-*` headers are
//!   ignored (the Go router forwards them, the Python one does not);
//! - no API key is asked for: the caller is trusted by where this listener can be reached
//!   from — a NetworkPolicy admitting only the router's pods (deploy/kubernetes);
//! - only sandboxes of the admin's tenant (the controller's key) are reachable: a tenant
//!   that labels its own sandbox with a claim's name cannot take that claim's traffic;
//! - only sandboxd's REST routes and the python-runtime's are served (`rest::answer`); the
//!   native `/v1` API, the other front-ends, preview hosts and gRPC are not on this
//!   listener at all, so its lack of a key opens nothing else;
//! - a Host that names no sandbox here is a 404 in the front-end's error shape, two matches
//!   a 409 (traffic is never guessed onto one of them); never a 5xx.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::rest::{answer, HttpError};
use super::Target;
use crate::http::AppState;
use crate::manager::Manager;
use crate::tenants::{Caller, DEFAULT_TENANT};

/// The metadata naming a sandbox's claim (set by the claims controller at create).
pub const META_NAME: &str = "agents.x-k8s.io/sandbox-name";
pub const META_NAMESPACE: &str = "agents.x-k8s.io/namespace";

/// The whole surface of the router-facing listener.
pub fn router_app(st: AppState) -> Router {
    Router::new()
        .fallback(handle)
        .layer(axum::middleware::from_fn_with_state(st.clone(), crate::http::count_responses))
        .with_state(st)
}

async fn handle(State(st): State<AppState>, req: Request) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    match target(&st.manager, &host) {
        Ok(t) => answer(st, t, req).await,
        Err(e) => {
            crate::http::drain(req.into_body()).await;
            e.into_response()
        }
    }
}

/// The claim `(name, namespace)` a Host names: `{name}.{namespace}`, optionally followed by
/// `.svc` and a cluster domain, with or without a port. Both must be DNS labels (what the
/// router itself accepts in `X-Sandbox-ID` and `X-Sandbox-Namespace`); an IP address names
/// nothing.
pub fn claim_of(host: &str) -> Option<(String, String)> {
    if host.starts_with('[') {
        return None;
    }
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h).trim_end_matches('.').to_ascii_lowercase();
    let labels: Vec<&str> = name.split('.').collect();
    let (claim, ns) = (labels.first()?, labels.get(1)?);
    if !dns_label(claim) || !dns_label(ns) || labels.get(2).is_some_and(|l| *l != "svc") {
        return None;
    }
    Some((claim.to_string(), ns.to_string()))
}

/// RFC 1123 label: 1–63 of `[a-z0-9-]`, not starting or ending with `-`.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The sandbox a Host names, for a caller standing in for the claim's agent (the sandbox's
/// own tenant, without admin rights). A paused sandbox is resumed, as on the other routes.
fn target(m: &Manager, host: &str) -> Result<Target, HttpError> {
    let Some((name, ns)) = claim_of(host) else {
        return Err(HttpError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!(
                "Host {host:?} names no sandbox: this listener serves agent-sandbox's router, which sends \
                 `{{name}}.{{namespace}}.svc.…` (docs/scale-out.md)"
            ),
        ));
    };
    let found =
        m.live_where(|sb| sb.tenant == DEFAULT_TENANT && sb.has_metadata(&[(META_NAME, &name), (META_NAMESPACE, &ns)]));
    let sb = match <[_; 1]>::try_from(found) {
        Ok([sb]) => sb,
        Err(v) if v.is_empty() => {
            return Err(HttpError::new(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("sandbox {ns}/{name} is not on this node (no live sandbox carries that claim)"),
            ))
        }
        Err(v) => {
            return Err(HttpError::new(
                StatusCode::CONFLICT,
                "FAILED_PRECONDITION",
                format!("{} live sandboxes carry claim {ns}/{name}; refusing to pick one", v.len()),
            ))
        }
    };
    m.wake_for_request(&sb).map_err(HttpError::from)?;
    let caller = Caller { tenant: sb.tenant.clone(), admin: false };
    Ok(Target { sb, caller })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_claim_by_their_first_two_labels() {
        let c = |h: &str| claim_of(h).map(|(a, b)| format!("{b}/{a}"));
        assert_eq!(c("demo.team-a.svc.cluster.local:8888").as_deref(), Some("team-a/demo"));
        assert_eq!(c("demo.team-a.svc.cluster.local").as_deref(), Some("team-a/demo"));
        assert_eq!(c("demo.team-a.svc.corp.internal.:8888").as_deref(), Some("team-a/demo"), "another domain");
        assert_eq!(c("demo.team-a").as_deref(), Some("team-a/demo"));
        assert_eq!(c("Demo.Team-A.SVC.cluster.local").as_deref(), Some("team-a/demo"), "names are case-blind");
        for none in [
            "",
            "demo",
            "demo:8888",
            "10.244.1.7:8888",
            "[fd00::7]:8888",
            "demo.team-a.example.test",
            "-demo.team-a.svc",
            "demo.team_a.svc",
            "demo..svc",
        ] {
            assert_eq!(c(none), None, "{none:?}");
        }
        assert_eq!(c(&format!("{}.ns.svc", "a".repeat(64))), None, "a label is at most 63");
    }
}
