//! The daemon in-process: `serve` runs it on a port; `run` without `$GLOVEBOX_URL` starts it
//! with a throwaway key, calls its API in-process like any client would over HTTP, then
//! tears down.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use glovebox_daemon::manager::{Config, Manager};

use crate::client::Client;

/// The manager of `glovebox serve`: it re-adopts the sandboxes a previous daemon on the
/// same data dir left running.
pub fn open_daemon_manager(data_dir: &Path, set: impl FnOnce(&mut Config)) -> Result<Arc<Manager>> {
    open_with(data_dir, |cfg| {
        cfg.adopt = true;
        set(cfg);
    })
}

/// The manager of an embedded one-shot run: it never adopts (its sandboxes end with it),
/// and makes nothing ahead (its one sandbox makes its own namespace, link and shell).
pub fn open_manager(data_dir: &Path, warm_pool: usize) -> Result<Arc<Manager>> {
    open_with(data_dir, |cfg| {
        cfg.warm_pool = warm_pool;
        cfg.link_pool = 0;
        cfg.one_shot = true;
    })
}

fn open_with(data_dir: &Path, set: impl FnOnce(&mut Config)) -> Result<Arc<Manager>> {
    if !rustix_is_root() {
        return Err(anyhow!("glovebox needs root to create sandboxes (namespaces, cgroups, id-mapped mounts)"));
    }
    let agent = glovebox_daemon::server::find_agent()
        .ok_or_else(|| anyhow!("glovebox-agent not found beside this binary (set GLOVEBOX_AGENT)"))?;
    let mut cfg = Config::new(data_dir.to_path_buf(), agent);
    set(&mut cfg);
    Manager::open(cfg).map_err(|e| anyhow!("{e}")).context("start")
}

fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// A running in-process daemon, called without a socket (see `server::Local`).
pub struct Embedded {
    local: glovebox_daemon::server::Local,
    key: String,
    manager: Arc<Manager>,
}

impl Embedded {
    pub async fn start(data_dir: &Path) -> Result<Embedded> {
        // One-shot: a warm pool would only be booted to be thrown away.
        let manager = open_manager(data_dir, 0)?;
        let key = glovebox_daemon::util::random_token(40);
        let local = glovebox_daemon::server::Local::new(manager.clone(), key.clone());
        Ok(Embedded { local, key, manager })
    }

    /// A client of it.
    pub fn client(&self) -> Result<Client> {
        Client::local(self.local.clone(), &self.key)
    }

    /// Destroys its sandboxes and waits for their records; its clients' requests in flight
    /// must have ended (they run on the caller's tasks).
    pub async fn stop(self) {
        self.manager.destroy_all(glovebox_proto::api::EndReason::Killed).await;
        self.manager.records.settle().await;
    }
}
