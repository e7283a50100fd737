//! Running the daemon: API key, agent binary discovery, the listener, graceful shutdown.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::api::{router, AppState};
use crate::manager::Manager;
use crate::util::random_token;

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
    let key = format!("gb_{}", random_token(40));
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

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    manager: Arc<Manager>,
    listener: tokio::net::TcpListener,
    api_key: String,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let app = router(AppState { manager, api_key: Arc::new(api_key) });
    // Small request/response exchanges: never let Nagle hold a reply back.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
