//! The native HTTP API under `/v1`: every route's handler, the auth and activity
//! middleware, and the mapping from domain errors to responses. Handlers only parse,
//! authorize, call the manager (or the sandbox's agent through `ops` and `code`) and map
//! errors; one `ApiError` gives every failure one status and one stable code.
//!
//! Dependencies point one way: this layer uses the domain modules, none of them uses it.
//! The E2B front-end (`e2b`) shares only the state, the key check and the body
//! drain from here; `server` puts the two front-ends behind one listener.

mod activity;
mod auth;
mod code;
mod commands;
mod error;
mod events;
mod extract;
mod files;
pub mod multipart;
mod ports;
mod pty;
mod sandboxes;
mod secrets;
mod snapshots;
mod templates;
mod tenants;
mod ui;
mod volumes;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{delete, get, post, put};
use axum::Router;
use glovebox_proto::api::ErrorCode;

pub use activity::count_responses;
pub use auth::{authorize, drain, presented_key};
pub use error::ApiError;
pub use ports::{api_host, change_live, expose_live, intercept as pass_to_ports};

use crate::manager::Manager;

/// Largest JSON body accepted (stdin given inline counts here; use the file API for more).
pub const MAX_JSON_BODY: usize = 16 << 20;

#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    pub api_key: Arc<String>,
}

/// The native routes (`/healthz`, `/metrics`, `/v1/…`, the dashboard at `/ui`) with a JSON 404 for anything else.
pub fn router(state: AppState) -> Router {
    state.manager.tenants.set_admin_key(&state.api_key);
    let v1 = Router::new()
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route("/sandboxes/{id}", get(sandboxes::get_one).delete(sandboxes::kill).patch(sandboxes::update))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list))
        .route("/snapshots/{name}", get(snapshots::show).delete(snapshots::delete))
        .route("/sandboxes/{id}/network", put(sandboxes::set_network))
        .route("/sandboxes/{id}/egress", get(sandboxes::egress_log))
        .route("/sandboxes/{id}/exec", post(commands::exec))
        .route("/sandboxes/{id}/commands", get(commands::list))
        .route("/sandboxes/{id}/commands/{cid}", get(commands::result))
        .route("/sandboxes/{id}/commands/{cid}/kill", post(commands::signal))
        .route("/sandboxes/{id}/commands/{cid}/stdin", post(commands::stdin))
        .route("/sandboxes/{id}/pty", post(pty::create))
        .route("/sandboxes/{id}/pty/{cid}/resize", post(pty::resize))
        .route("/sandboxes/{id}/pty/{cid}/ws", get(pty::attach))
        .route(
            "/sandboxes/{id}/files",
            get(files::download).put(files::upload).delete(files::remove).layer(DefaultBodyLimit::disable()),
        )
        .route("/sandboxes/{id}/code", post(code::run_code))
        .route("/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route("/sandboxes/{id}/usage", get(tenants::sandbox_usage))
        .route("/usage", get(tenants::usage_report))
        .route("/keys", post(tenants::create_key).get(tenants::list_keys))
        .route("/keys/{kid}", delete(tenants::revoke_key))
        .route("/tenants/{tenant}/quota", get(tenants::get_quota).put(tenants::set_quota))
        .route("/sandboxes/{id}/contexts", post(code::create_context).get(code::list_contexts))
        .route("/sandboxes/{id}/contexts/{cid}", delete(code::remove_context))
        .route("/sandboxes/{id}/contexts/{cid}/restart", post(code::restart_context))
        .route("/sandboxes/{id}/files/list", get(files::list_dir))
        .route("/sandboxes/{id}/files/stat", get(files::stat))
        .route("/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/sandboxes/{id}/files/rename", post(files::rename))
        .route("/secrets", get(secrets::list).post(secrets::create))
        .route("/secrets/{name}", get(secrets::show).put(secrets::put).delete(secrets::delete))
        .route("/sandboxes/{id}/keepalive", post(sandboxes::keepalive))
        .route("/sandboxes/{id}/events", get(events::of_sandbox))
        .route("/sandboxes/{id}/ports", get(ports::list))
        .route("/sandboxes/{id}/ports/{port}", post(ports::expose))
        .route("/events", get(events::all))
        .route("/templates", post(templates::build).get(templates::list))
        .route("/templates/gc", post(templates::gc))
        .route("/templates/{name}", get(templates::get_one).delete(templates::delete))
        .route("/volumes", get(volumes::list).post(volumes::create))
        .route("/volumes/gc", post(volumes::gc))
        .route("/volumes/{name}", get(volumes::show).delete(volumes::delete))
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .route_layer(middleware::from_fn_with_state(state.clone(), activity::track))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::auth));
    let prom = Router::new()
        .route("/metrics", get(tenants::prometheus))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(prom)
        .merge(ui::router())
        .nest("/v1", v1)
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Test files (`tests.rs`, `*_tests.rs`) may reach anywhere, like test modules.
    fn is_test_file(p: &Path) -> bool {
        let stem = p.file_stem().unwrap_or_default().to_string_lossy();
        stem == "tests" || stem.ends_with("_tests")
    }

    /// Every `.rs` file under `dir` but test files, with its path relative to `src/`.
    fn sources(dir: &Path, src: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                sources(&p, src, out);
            } else if p.extension().is_some_and(|x| x == "rs") && !is_test_file(&p) {
                let rel = p.strip_prefix(src).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }

    /// Dependencies point down: no domain module uses the front-ends (`http`, `e2b`,
    /// `server`) or axum, and this layer does not use the E2B front-end (the compiler keeps
    /// `e2b` out of this module's private rooms).
    #[test]
    fn only_front_ends_see_http() {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &src, &mut files);
        assert!(files.len() > 20, "read the daemon's sources");
        let front_end = |f: &str| {
            f.starts_with("http/")
                || f.starts_with("e2b/")
                || f.starts_with("vercel/")
                || f.starts_with("daytona/")
                || f.starts_with("modal/")
                || f.starts_with("sandboxd/")
                || f == "server.rs"
        };
        let mut wrong = Vec::new();
        for (file, text) in &files {
            // Test modules at the end of a file do not count.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            if !front_end(file) {
                for used in [
                    "crate::http",
                    "crate::e2b",
                    "crate::vercel",
                    "crate::daytona",
                    "crate::modal",
                    "crate::sandboxd",
                    "crate::server",
                    "axum::",
                ] {
                    if code.contains(used) {
                        wrong.push(format!("{file} uses {used}"));
                    }
                }
            }
            if file.starts_with("http/") && code.contains("crate::e2b") {
                wrong.push(format!("{file} uses the E2B front-end"));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
