//! Running the daemon: API key, agent binary discovery, the front-ends behind one listener,
//! graceful shutdown.

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
/// is passed to it before any route sees it.
pub fn app(state: AppState) -> axum::Router {
    crate::http::router(state.clone())
        .merge(crate::e2b::router(state.clone()))
        .merge(crate::vercel::router(state.clone()))
        .merge(crate::daytona::router(state.clone()))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::http::pass_to_ports))
        .layer(axum::middleware::from_fn_with_state(state, count_responses))
}

/// How long a client may take to send a request's headers (slow clients are cut off).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long shutdown waits for requests in flight.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the API on `listener` until `shutdown` resolves, then lets requests in flight
/// finish (bounded by `SHUTDOWN_GRACE`).
///
/// An HTTP/1.1 server with a header-read timeout, so a client that trickles its headers
/// cannot hold a connection forever; TCP_NODELAY, so small replies are never held back.
pub async fn serve(
    manager: Arc<Manager>,
    listener: tokio::net::TcpListener,
    api_key: String,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let app = app(AppState { manager, api_key: Arc::new(api_key) });
    let (close_tx, close_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of fds and the like: back off instead of spinning.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let reset = ResetOnClose::default();
        let tcp = Conn::new(tcp, reset.clone());
        let svc = app.clone().map_request(move |req: axum::http::Request<hyper::body::Incoming>| {
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut().insert(reset.clone());
            req
        });
        let svc = hyper_util::service::TowerToHyperService::new(svc);
        let mut close = close_rx.clone();
        tokio::spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
            // Upgrades: a WebSocket to a sandbox's exposed port is spliced through.
            let conn = b.serve_connection(TokioIo::new(tcp), svc).with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = close.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(close);
        });
    }
    drop(close_rx);
    let _ = close_tx.send(());
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, close_tx.closed()).await;
    Ok(())
}
