//! A manager on the fake backend in a temporary directory, for unit tests (no root).

use std::sync::Arc;
use std::time::{Duration, Instant};

use glovebox_proto::api::{CreateSandbox, EndReason};

use super::{Config, Manager};
use crate::backend::fake::Fake;
use crate::error::Error;

pub(crate) struct Fixture {
    pub m: Arc<Manager>,
    pub fake: Arc<Fake>,
    _tmp: tempfile::TempDir,
}

/// A fresh manager (its data, run and template dirs in a new temporary directory) whose
/// sandboxes run on a fake backend. Must run inside a tokio runtime.
pub(crate) fn fixture() -> Fixture {
    fixture_with(|_| {})
}

/// [`fixture`] with the configuration changed by `tune` first.
pub(crate) fn fixture_with(tune: impl FnOnce(&mut Config)) -> Fixture {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut cfg = Config::new(tmp.path().join("data"), tmp.path().join("no-agent"));
    cfg.run_dir = tmp.path().join("run");
    cfg.shared_templates = None;
    cfg.auto_build = false;
    std::fs::create_dir_all(cfg.run_dir.join("base")).expect("run dir");
    tune(&mut cfg);
    let store = super::open_store(&cfg.data_dir, false).expect("store");
    let fake = Arc::new(Fake::new(&tmp.path().join("sandboxes")));
    let m = Manager::with_backend(cfg, store, fake.clone(), Arc::default(), Arc::default()).expect("manager");
    Fixture { m, fake, _tmp: tmp }
}

/// A create request from its JSON.
pub(crate) fn request(v: serde_json::Value) -> CreateSandbox {
    serde_json::from_value(v).expect("create request")
}

/// Waits (at most `limit`) until sandbox `id` has ended, and returns why.
pub(crate) async fn ended(m: &Manager, id: &str, limit: Duration) -> Option<EndReason> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Err(Error::Gone { reason, .. }) = m.get(id) {
            return Some(reason);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
