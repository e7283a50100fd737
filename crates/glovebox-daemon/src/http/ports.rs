//! Exposed ports: `POST /v1/sandboxes/{id}/ports/{port}` and `GET …/ports`, and the
//! pass-through to a server inside a sandbox, reached two ways on the daemon's one listener:
//! - by path, `/v1/sandboxes/{id}/ports/{port}/…`, with the owner's API key, the port's
//!   token or nothing (a public port);
//! - by host name, `Host: P-<id>.<domain>` (any path), with a token that opens the port
//!   (`?gb_token=`, or the path's first segment — both kept in a cookie for a browser's later
//!   requests —, or the `X-Glovebox-Port-Token` header) or nothing (a public port). These
//!   requests carry no API key.
//!
//! The front-ends' own ways of carrying a token map here too: E2B's traffic access token
//! header, Daytona's `X-Daytona-Preview-Token`, and the Vercel SDK's `domain(port)`, which
//! ends the host it was given with `.vercel.run` — so a first path segment
//! `<token>.vercel.run` is a token as well.
//!
//! Invariants: nothing reaches a sandbox's port before its access is checked; the daemon's
//! credentials (the API key it was given, the port token) are taken out of the request
//! before it is passed on; an unknown id and another tenant's sandbox answer alike (404).
//! HTTP/1.1 requests and responses stream through in both directions; an `Upgrade` (e.g.
//! WebSocket) the server accepts becomes a byte splice for as long as both ends keep it.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{ErrorCode, ExposePort, ExposedPort, ExposedPortList};
use hyper_util::rt::TokioIo;

use super::auth::{authorize, drain, presented_key};
use super::error::{ApiError, ApiResult};
use super::extract::{json, Path};
use super::AppState;
use crate::ports::ConnectError;

/// The query parameter and cookie a port token travels in.
const TOKEN_PARAM: &str = "gb_token";
/// The headers a port token travels in: Glovebox's own and Daytona's.
const TOKEN_HEADER: &str = "x-glovebox-port-token";
const DAYTONA_TOKEN_HEADER: &str = "x-daytona-preview-token";
/// What the Vercel SDK appends to the `subdomain` of a route to make `domain(port)`.
const VERCEL_SUFFIX: &str = ".vercel.run";
/// The header E2B's SDKs send a sandbox's traffic access token in (see `Ports::grant`).
const E2B_TRAFFIC_HEADER: &str = "e2b-traffic-access-token";

/// Where a request for a sandbox's port came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `/v1/sandboxes/{id}/ports/{port}/…`
    Path,
    /// `Host: P-<id>.<domain>`
    Host,
}

/// `POST /v1/sandboxes/{id}/ports/{port}`: exposes the port (private unless `public`) and
/// answers where it is reached and its token. An empty body means `{}`.
pub async fn expose(
    State(st): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let req: ExposePort = if body.iter().all(u8::is_ascii_whitespace) {
        ExposePort::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("body: {e}")))?
    };
    check_port(port)?;
    expose_live(&st, &id, port, req.public)?;
    Ok(json(StatusCode::OK, &describe(&st, &headers, &id, port, req.public)))
}

/// Records port `port` of live sandbox `id` as exposed (every front-end's way in).
pub fn expose_live(st: &AppState, id: &str, port: u16, public: bool) -> Result<(), crate::error::Error> {
    change_live(st, id, |ports| ports.expose(id, port, public))
}

/// Changes what the daemon remembers of live sandbox `id`'s ports. The manager forgets a
/// sandbox's ports when it ends; one that ended meanwhile is forgotten here.
pub fn change_live(
    st: &AppState,
    id: &str,
    change: impl FnOnce(&crate::ports::Ports),
) -> Result<(), crate::error::Error> {
    st.manager.get(id)?;
    change(&st.manager.ports);
    if let Err(e) = st.manager.get(id) {
        st.manager.ports.forget(id);
        return Err(e);
    }
    Ok(())
}

/// `GET /v1/sandboxes/{id}/ports`: the ports exposed so far, lowest first.
pub async fn list(State(st): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> ApiResult<Response> {
    st.manager.get(&id)?;
    let ports =
        st.manager.ports.of(&id).into_iter().map(|(port, public)| describe(&st, &headers, &id, port, public)).collect();
    Ok(json(StatusCode::OK, &ExposedPortList { ports }))
}

fn check_port(port: u16) -> ApiResult<()> {
    if port == 0 {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "port must be 1-65535"));
    }
    Ok(())
}

/// Where port `port` of `id` is reached, written with the address the caller reached the
/// daemon at (its `Host`), so the URLs work from where the caller stands.
fn describe(st: &AppState, headers: &HeaderMap, id: &str, port: u16, public: bool) -> ExposedPort {
    let daemon = api_host(headers);
    let ports = &st.manager.ports;
    ExposedPort {
        port,
        public,
        url: format!("http://{}/", ports.host_via(id, port, daemon)),
        path_url: format!("http://{daemon}/v1/sandboxes/{id}/ports/{port}/"),
        token: ports.token(id, port),
    }
}

/// The address an API request reached the daemon at (its `Host`).
pub fn api_host(headers: &HeaderMap) -> &str {
    headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1:7171")
}

/// A token carried as the first segment of a preview host's path (`/<token>/…`, or
/// `/<token>.vercel.run/…`), and the path after it (`/` when nothing follows).
fn path_token(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (first, after) = rest.find('/').map_or((rest, ""), |i| (&rest[..i], &rest[i..]));
    let token = first.strip_suffix(VERCEL_SUFFIX).unwrap_or(first);
    crate::ports::looks_like_token(token).then_some((token, if after.is_empty() { "/" } else { after }))
}

/// The sandbox, port and the rest of the path a `/v1/sandboxes/{id}/ports/{port}/…` path
/// names (the rest keeps its leading `/`).
fn port_path(path: &str) -> Option<(&str, u16, &str)> {
    let (id, rest) = path.strip_prefix("/v1/sandboxes/")?.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let slash = rest.find('/')?;
    let port: u16 = rest[..slash].parse().ok().filter(|p| *p != 0)?;
    (!id.is_empty()).then_some((id, port, &rest[slash..]))
}

/// Middleware in front of every route: a request for a preview host or a port path is
/// passed to the sandbox's port (after its access check) and never reaches the routes.
pub async fn intercept(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).or(req.uri().host());
    if let Some((id, port)) = host.and_then(|h| st.manager.ports.parse_host(h)) {
        let rest = path_token(req.uri().path()).map_or(req.uri().path(), |(_, rest)| rest).to_string();
        return pass(st, req, id, port, rest, Route::Host).await.unwrap_or_else(|e| e.into_response());
    }
    if let Some((id, port, rest)) = port_path(req.uri().path()) {
        let (id, rest) = (id.to_string(), rest.to_string());
        return pass(st, req, id, port, rest, Route::Path).await.unwrap_or_else(|e| e.into_response());
    }
    next.run(req).await
}

/// Where a token came with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    Header,
    Query,
    /// The first segment of a preview host's path.
    Path,
    Cookie,
}

/// The tokens a request carries, each with where: the headers, the query, then (host
/// routing) the path's first segment and the cookie.
fn presented_tokens(req: &Request, route: Route) -> Vec<(String, Carrier)> {
    let mut out = Vec::new();
    for name in [TOKEN_HEADER, DAYTONA_TOKEN_HEADER] {
        if let Some(t) = req.headers().get(name).and_then(|v| v.to_str().ok()) {
            out.push((t.trim().to_string(), Carrier::Header));
        }
    }
    if let Some(t) = query_token(req.uri()) {
        out.push((t, Carrier::Query));
    }
    if route == Route::Host {
        if let Some((t, _)) = path_token(req.uri().path()) {
            out.push((t.to_string(), Carrier::Path));
        }
        if let Some((_, t)) = cookies(req.headers()).find(|(k, _)| *k == TOKEN_PARAM) {
            out.push((t.to_string(), Carrier::Cookie));
        }
    }
    out
}

fn query_token(uri: &Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| kv.strip_prefix(TOKEN_PARAM)?.strip_prefix('=')).map(str::to_string)
}

fn cookies(h: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
}

/// Checks access, connects inside the sandbox and passes the request through.
async fn pass(
    st: AppState,
    mut req: Request,
    id: String,
    port: u16,
    rest: String,
    route: Route,
) -> ApiResult<Response> {
    let ports = &st.manager.ports;
    let opened = presented_tokens(&req, route).into_iter().find(|(t, _)| ports.opens(&id, port, t));
    let granted = req.headers().get(E2B_TRAFFIC_HEADER).and_then(|v| v.to_str().ok());
    let token_ok = opened.is_some() || granted.is_some_and(|t| ports.is_granted(&id, t.trim()));
    // The path route also takes the owner's API key (taken out before the request goes on).
    let mut by_key = false;
    if route == Route::Path && !token_ok {
        if let Some(k) = presented_key(req.headers()) {
            let Some(caller) = st.manager.tenants.authenticate(k) else {
                drain(req.into_body()).await;
                return Err(ApiError::new(ErrorCode::Unauthorized, "invalid API key"));
            };
            if let Err(e) = authorize(&st.manager, &caller, &id) {
                drain(req.into_body()).await;
                return Err(e.into());
            }
            by_key = true;
        }
    }
    if !(token_ok || by_key || st.manager.ports.is_public(&id, port)) {
        drain(req.into_body()).await;
        let how = match route {
            Route::Path => "send the API key or the port's token (`?gb_token=`)",
            Route::Host => {
                "add `?gb_token=<token>` (from exposing the port), send it in a header, or make the port public"
            }
        };
        return Err(ApiError::new(ErrorCode::Unauthorized, format!("port {port} of sandbox {id} is private: {how}")));
    }
    let sb = st.manager.get(&id)?;
    st.manager.wake_for_request(&sb)?;
    let guard = sb.activity.guard();
    let stream = connect(&st, &sb, port).await?;
    drop(sb);

    // A token from the URL is kept for the browser's later requests to this host (the
    // page's own links carry no token).
    let cookie = opened.filter(|(_, c)| route == Route::Host && matches!(c, Carrier::Query | Carrier::Path));
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let upstream = rewrite(req, &rest, port, route, by_key);

    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ApiError::new(ErrorCode::PortNotListening, format!("port {port}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut resp = sender
        .send_request(upstream)
        .await
        .map_err(|e| ApiError::new(ErrorCode::PortNotListening, format!("port {port} answered no HTTP: {e}")))?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let (Some(client_side), server_side) = (client_side, hyper::upgrade::on(&mut resp)) else {
            return Err(ApiError::new(ErrorCode::PortNotListening, "the server switched protocols unasked"));
        };
        tokio::spawn(async move {
            let _held = guard;
            let (Ok(a), Ok(b)) = (client_side.await, server_side.await) else { return };
            let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    if let Some((t, _)) = cookie {
        let c = format!("{TOKEN_PARAM}={t}; Path=/; HttpOnly; SameSite=Lax");
        if let Ok(v) = HeaderValue::from_str(&c) {
            parts.headers.append(header::SET_COOKIE, v);
        }
    }
    // The sandbox counts as busy while its answer streams.
    let stream = futures_util::StreamExt::map(Body::new(body).into_data_stream(), move |chunk| {
        let _held = &guard;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(stream)))
}

/// A byte stream both ways: a TCP connection, or one relayed by the agent.
trait Duplex: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Duplex for T {}

/// A connection to `127.0.0.1:port` inside `sb`: made in its network namespace for a jailed
/// sandbox; relayed by its agent under gVisor, whose network stack is the sentry's (the
/// namespace's own loopback has nothing listening).
async fn connect(st: &AppState, sb: &crate::manager::Sb, port: u16) -> ApiResult<Box<dyn Duplex>> {
    let id = &sb.id;
    if sb.isolation == glovebox_proto::api::Isolation::Gvisor {
        return match sb.agent().connect_port(port).await {
            Ok(s) => Ok(Box::new(s)),
            Err(crate::agent::AgentError::Refused { message, .. }) => {
                Err(ApiError::new(ErrorCode::PortNotListening, message))
            }
            Err(e) => Err(st.manager.agent_error(id, e).into()),
        };
    }
    let pid = sb.pid;
    let stream = tokio::task::spawn_blocking(move || crate::ports::connect(pid, port))
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("connect: {e}")))?
        .map_err(|e| match e {
            ConnectError::NotListening { .. } => ApiError::new(ErrorCode::PortNotListening, e.to_string()),
            ConnectError::Namespace { .. } => {
                tracing::warn!(sandbox = %id, "port {port}: {e}");
                ApiError::new(ErrorCode::PortNotListening, format!("sandbox {id} cannot be reached"))
            }
        })?;
    let stream = tokio::net::TcpStream::from_std(stream)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("register the connection: {e}")))?;
    Ok(Box::new(stream))
}

/// The request as the server inside gets it: its path is what follows the port (path route),
/// the token is taken out of query, header and cookies, so is the API key that opened it.
fn rewrite(req: Request, rest: &str, port: u16, route: Route, by_key: bool) -> hyper::Request<Body> {
    let (mut parts, body) = req.into_parts();
    let query: Vec<&str> = parts
        .uri
        .query()
        .map(|q| q.split('&').filter(|kv| kv.split('=').next() != Some(TOKEN_PARAM) && !kv.is_empty()).collect())
        .unwrap_or_default();
    let path = if rest.is_empty() { "/" } else { rest };
    let pq = if query.is_empty() { path.to_string() } else { format!("{path}?{}", query.join("&")) };
    parts.uri = pq.parse().unwrap_or_else(|_| Uri::from_static("/"));
    parts.version = axum::http::Version::HTTP_11;
    let h = &mut parts.headers;
    let upgrade = h.contains_key(header::UPGRADE);
    strip_hop_by_hop(h, upgrade);
    h.remove(TOKEN_HEADER);
    h.remove(DAYTONA_TOKEN_HEADER);
    h.remove(E2B_TRAFFIC_HEADER);
    if by_key {
        h.remove(header::AUTHORIZATION);
        h.remove("x-api-key");
    }
    let kept: Vec<String> = cookies(h).filter(|(k, _)| *k != TOKEN_PARAM).map(|(k, v)| format!("{k}={v}")).collect();
    h.remove(header::COOKIE);
    if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
        if !kept.is_empty() {
            h.insert(header::COOKIE, v);
        }
    }
    if route == Route::Path {
        if let Some(orig) = h.get(header::HOST).cloned() {
            h.insert(HeaderName::from_static("x-forwarded-host"), orig);
        }
        if let Ok(v) = HeaderValue::from_str(&format!("localhost:{port}")) {
            h.insert(header::HOST, v);
        }
    }
    hyper::Request::from_parts(parts, body)
}

/// Takes out the headers that describe one connection, not the message; `keep_upgrade`
/// keeps `Connection: upgrade` and `Upgrade` for a protocol switch.
fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    for name in ["keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding"] {
        h.remove(name);
    }
    if !keep_upgrade {
        h.remove(header::CONNECTION);
        h.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_paths() {
        assert_eq!(port_path("/v1/sandboxes/abc/ports/8000/"), Some(("abc", 8000, "/")));
        assert_eq!(port_path("/v1/sandboxes/abc/ports/8000/a/b?c"), Some(("abc", 8000, "/a/b?c")));
        assert_eq!(port_path("/v1/sandboxes/abc/ports/8000"), None, "expose, not pass-through");
        assert_eq!(port_path("/v1/sandboxes/abc/ports"), None);
        assert_eq!(port_path("/v1/sandboxes/abc/ports/0/"), None);
        assert_eq!(port_path("/v1/sandboxes/abc/ports/x/"), None);
        assert_eq!(port_path("/v1/sandboxes/abc/files/8000/"), None);
    }

    #[test]
    fn tokens_and_keys_are_taken_out() {
        let req = Request::builder()
            .uri("/v1/sandboxes/a/ports/80/x?gb_token=t&q=1")
            .header("authorization", "Bearer k")
            .header("x-glovebox-port-token", "t")
            .header("cookie", "a=1; gb_token=t; b=2")
            .header("host", "127.0.0.1:7171")
            .header("connection", "keep-alive")
            .body(Body::empty())
            .unwrap();
        let out = rewrite(req, "/x", 80, Route::Path, true);
        assert_eq!(out.uri(), "/x?q=1");
        let h = out.headers();
        assert!(h.get("authorization").is_none() && h.get(TOKEN_HEADER).is_none());
        assert!(h.get("connection").is_none());
        assert_eq!(h.get("cookie").unwrap(), "a=1; b=2");
        assert_eq!(h.get("host").unwrap(), "localhost:80");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "127.0.0.1:7171");
    }

    #[test]
    fn a_token_may_lead_the_path() {
        let t = format!("gbp_{}", "0a".repeat(32));
        assert_eq!(path_token(&format!("/{t}/api/x")), Some((t.as_str(), "/api/x")));
        assert_eq!(path_token(&format!("/{t}.vercel.run/api/x")), Some((t.as_str(), "/api/x")));
        assert_eq!(path_token(&format!("/{t}.vercel.run")), Some((t.as_str(), "/")));
        assert_eq!(path_token(&format!("/{t}/")), Some((t.as_str(), "/")));
        let signed = format!("gbs_1700000000_{}_{}", "c".repeat(16), "b".repeat(64));
        assert_eq!(path_token(&format!("/{signed}/a")), Some((signed.as_str(), "/a")));
        for other in [
            "/".to_string(),
            "/api/x".to_string(),
            format!("/api/{t}"),
            format!("/{t}x/a"),
            format!("/{t}.vercel.app/a"),
            format!("/{}/a", t.to_uppercase()),
            format!("/x{t}"),
        ] {
            assert_eq!(path_token(&other), None, "{other}");
        }
    }

    #[test]
    fn tokens_are_found_where_each_front_end_puts_them() {
        let t = format!("gbp_{}", "0a".repeat(32));
        let req = Request::builder()
            .uri(format!("/{t}.vercel.run/x?gb_token=q"))
            .header("x-daytona-preview-token", "d")
            .header("cookie", "gb_token=c")
            .body(Body::empty())
            .unwrap();
        let found = presented_tokens(&req, Route::Host);
        let want = [("d", Carrier::Header), ("q", Carrier::Query), (t.as_str(), Carrier::Path), ("c", Carrier::Cookie)];
        assert_eq!(found.iter().map(|(t, c)| (t.as_str(), *c)).collect::<Vec<_>>(), want);
        let by_path = presented_tokens(&req, Route::Path);
        assert_eq!(by_path.len(), 2, "the path route takes no path segment or cookie");
        let out = rewrite(req, "/x", 80, Route::Host, false);
        assert_eq!(out.uri(), "/x");
        assert!(out.headers().get("x-daytona-preview-token").is_none() && out.headers().get("cookie").is_none());
    }
}
