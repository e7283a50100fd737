//! Running the daemon: API key, agent binary discovery, the front-ends behind one listener
//! (and the opt-in router-facing listener beside it), graceful shutdown.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::conn::{Conn, ResetOnClose};
use crate::http::{count_responses, AppState};
use crate::manager::Manager;
use crate::util::random_key;

/// The key in `<data>/api-key`, created (0600) with a fresh random key on first start.
/// Returns the key and whether it was just created.
pub fn load_or_create_key(data_dir: &Path) -> std::io::Result<(String, bool)> {
    let path = data_dir.join("api-key");
    match fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => return Ok((k.trim().to_string(), false)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fs::create_dir_all(data_dir)?;
    let key = random_key();
    let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path)?;
    f.write_all(key.as_bytes())?;
    f.write_all(b"\n")?;
    Ok((key, true))
}

/// Where the agent binary is: `$GLOVEBOX_AGENT`, else beside the running executable (also
/// one level up, for test binaries in `target/*/deps`).
pub fn find_agent() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GLOVEBOX_AGENT") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("glovebox-agent"), dir.parent()?.join("glovebox-agent")].into_iter().find(|p| p.is_file())
}

/// The daemon's whole HTTP surface: the native API and the E2B-compatible one, each
/// response counted; a request for a sandbox's exposed port (by preview host or by path)
/// is passed to it before any route sees it, then one carrying `X-Sandbox-ID` goes to the
/// agent-sandbox front-end.
pub fn app(state: AppState) -> axum::Router {
    crate::http::router(state.clone())
        .merge(crate::e2b::router(state.clone()))
        .merge(crate::vercel::router(state.clone()))
        .merge(crate::daytona::router(state.clone()))
        // Requests carrying `X-Sandbox-ID` are agent-sandbox's (sandboxd, python-runtime)…
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::sandboxd::intercept))
        // …unless they are for a sandbox's exposed port, which comes first.
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::http::pass_to_ports))
        .layer(axum::middleware::from_fn_with_state(state, count_responses))
}

/// How long a client may take to send a request's headers (slow clients are cut off).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long shutdown waits for requests in flight.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the API on `listener` (and, when given, the router-facing listener on `router`:
/// `sandboxd::router_app`, nothing else) until `shutdown` resolves, then lets requests in
/// flight finish (bounded by `SHUTDOWN_GRACE`).
///
/// An HTTP/1.1 server with a header-read timeout, so a client that trickles its headers
/// cannot hold a connection forever (and, for connections to `listener` that open with the
/// HTTP/2 preface, the gRPC front-ends over HTTP/2); TCP_NODELAY, so small replies are never
/// held back.
pub async fn serve(
    manager: Arc<Manager>,
    listener: tokio::net::TcpListener,
    router: Option<tokio::net::TcpListener>,
    api_key: String,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AppState { manager, api_key: Arc::new(api_key) };
    let app = app(state.clone());
    let routed = crate::sandboxd::router_app(state.clone());
    let modal = crate::modal::Modal::new(state.clone());
    let sandboxd = crate::sandboxd::Sandboxd::new(state);
    let (close_tx, close_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (accepted, from_router) = tokio::select! {
            r = listener.accept() => (r, false),
            r = accept_if(router.as_ref()) => (r, true),
            _ = &mut shutdown => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of fds and the like: back off instead of spinning.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let mut close = close_rx.clone();
        if from_router {
            tokio::spawn(serve_http1(routed.clone(), tcp, close));
            continue;
        }
        let grpc = (modal.clone(), sandboxd.clone());
        let app = app.clone();
        tokio::spawn(async move {
            // gRPC (the Modal and sandboxd front-ends) opens with the HTTP/2 preface;
            // everything else is HTTP/1.1. A connection that has sent nothing yet when the
            // daemon shuts down has no request in flight: it is closed, not waited for (an
            // HTTP client may open one ahead of a request it then sends on a pooled one).
            let h2 = tokio::select! {
                h2 = starts_with_h2_preface(&tcp) => h2,
                _ = close.changed() => return,
            };
            if h2 {
                serve_grpc(grpc, tcp, close).await;
            } else {
                serve_http1(app, tcp, close).await;
            }
        });
    }
    drop(close_rx);
    drop((modal, sandboxd));
    let _ = close_tx.send(());
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, close_tx.closed()).await;
    Ok(())
}

/// The next connection on `l`; never, without one.
async fn accept_if(
    l: Option<&tokio::net::TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Drives hyper connection `conn` until it ends or `close` says the daemon shuts down; then
/// it finishes the request in flight (the caller bounds that by `SHUTDOWN_GRACE`). A macro:
/// hyper's HTTP/1 (with upgrades) and HTTP/2 connections share no trait for this.
macro_rules! until_closed {
    ($conn:expr, $close:ident) => {{
        let conn = $conn;
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = $close.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
        drop($close);
    }};
}

/// Serves one HTTP/1.1 connection with `app` until it closes or the daemon shuts down (then
/// the request in flight gets `SHUTDOWN_GRACE`).
async fn serve_http1(app: axum::Router, tcp: tokio::net::TcpStream, mut close: tokio::sync::watch::Receiver<()>) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let reset = ResetOnClose::default();
    let tcp = Conn::new(tcp, reset.clone());
    let svc = app.map_request(move |req: axum::http::Request<hyper::body::Incoming>| {
        let mut req = req.map(axum::body::Body::new);
        req.extensions_mut().insert(reset.clone());
        req
    });
    let svc = hyper_util::service::TowerToHyperService::new(svc);
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    // Upgrades: a WebSocket to a sandbox's exposed port is spliced through.
    until_closed!(b.serve_connection(TokioIo::new(tcp), svc).with_upgrades(), close);
}

/// The native API called in this process, without a socket: what an embedded daemon's own
/// client (`glovebox run` with no daemon) uses. The native routes with the same
/// authentication and middleware as [`serve`]'s; not the other front-ends (E2B, Vercel,
/// Daytona, sandboxd, exposed ports), which no embedded client calls and whose routes take
/// as long again to build, nor what only a connection gives (a reset instead of an orderly
/// close, HTTP/2 for the gRPC front-ends).
#[derive(Clone)]
pub struct Local(axum::Router);

impl Local {
    pub fn new(manager: Arc<Manager>, api_key: String) -> Local {
        let state = AppState { manager, api_key: Arc::new(api_key) };
        Local(crate::http::router(state.clone()).layer(axum::middleware::from_fn_with_state(state, count_responses)))
    }

    /// Answers one request; the response's body streams as its handler produces it.
    pub async fn call<B>(&self, req: axum::http::Request<B>) -> axum::http::Response<axum::body::BodyDataStream>
    where
        B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        use tower::ServiceExt;
        let resp = match self.0.clone().oneshot(req.map(axum::body::Body::new)).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        resp.map(axum::body::Body::into_data_stream)
    }
}

/// The client preface every HTTP/2 prior-knowledge connection opens with (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the connection's first bytes are the HTTP/2 preface, read without consuming
/// them. Anything else (or a client silent for `HEADER_READ_TIMEOUT`) is left to HTTP/1.1.
async fn starts_with_h2_preface(tcp: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 24];
    let deadline = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
    loop {
        let n = match tokio::time::timeout_at(deadline, tcp.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != H2_PREFACE[..n] {
            return false;
        }
        if n == H2_PREFACE.len() {
            return true;
        }
        // A prefix of the preface so far: wait for the rest (peek would return at once).
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Serves one HTTP/2 connection with the gRPC front-ends (sandboxd's `ProcessService`, by
/// its path; the Modal ones) until it closes or the daemon shuts down (then in-flight calls
/// get `SHUTDOWN_GRACE`).
async fn serve_grpc(
    (modal, sandboxd): (crate::modal::Modal, crate::sandboxd::Sandboxd),
    tcp: tokio::net::TcpStream,
    mut close: tokio::sync::watch::Receiver<()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let svc = hyper::service::service_fn(move |req: axum::http::Request<hyper::body::Incoming>| {
        let (modal, sandboxd) = (modal.clone(), sandboxd.clone());
        async move {
            let r = if crate::sandboxd::Sandboxd::serves(req.uri().path()) {
                sandboxd.route(req).await
            } else {
                modal.route(req).await
            };
            Ok::<_, std::convert::Infallible>(r)
        }
    });
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        // The client's windows are 64 MiB; stdin and context files come in large messages.
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .keep_alive_interval(std::time::Duration::from_secs(30));
    until_closed!(b.serve_connection(TokioIo::new(tcp), svc), close);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn first_bytes(chunks: &[&[u8]]) -> bool {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
        let writer = tokio::spawn(async move {
            for ch in chunks {
                c.write_all(&ch).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            c
        });
        let r = starts_with_h2_preface(&s).await;
        drop(writer.await);
        r
    }

    #[tokio::test]
    async fn the_h2_preface_is_told_from_http1() {
        assert!(first_bytes(&[H2_PREFACE, b"\0\0\0\x04"]).await);
        assert!(first_bytes(&[b"PRI * HTT", b"P/2.0\r\n\r\nSM\r\n\r\n"]).await, "in pieces");
        assert!(!first_bytes(&[b"GET /healthz HTTP/1.1\r\n\r\n"]).await);
        assert!(!first_bytes(&[b"POST /v1/sandboxes HTTP/1.1\r\n"]).await, "P, then not the preface");
        assert!(!first_bytes(&[b"PRI * HTTP/1.1\r\n"]).await);
    }

    /// A client that opened a connection and sent nothing on it (an HTTP client's spare,
    /// opened while its request went out on a pooled one) has nothing in flight: shutdown
    /// closes it at once instead of waiting `SHUTDOWN_GRACE` for it.
    #[tokio::test]
    async fn shutdown_does_not_wait_for_a_silent_connection() {
        use tokio::io::AsyncReadExt;
        let f = crate::manager::testing::fixture();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(f.m.clone(), l, None, "k".into(), async move {
            let _ = rx.await;
        }));
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        // An answered request on another connection, kept open (idle keep-alive).
        let mut used = tokio::net::TcpStream::connect(addr).await.unwrap();
        used.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 512];
        let n = used.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        let t = std::time::Instant::now();
        tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(3), served)
            .await
            .expect("shutdown waited for idle connections")
            .unwrap()
            .unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(3));
        // Both were closed by the daemon.
        assert_eq!(idle.read(&mut buf).await.unwrap(), 0, "the silent connection is closed");
        assert_eq!(used.read(&mut buf).await.unwrap(), 0, "the idle keep-alive connection is closed");
    }
}
