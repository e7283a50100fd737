//! Live changes to a sandbox's labels (`metadata`) and idle timeout: applied under the
//! record's lock, stored (a restarted daemon re-adopts them), and the idle clock woken so
//! its next check uses the new timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use glovebox_proto::api;

use super::{Manager, Sb};
use crate::error::{Error, Result};
use crate::util::lock;

impl Manager {
    /// Replaces the labels of sandbox `id` when `metadata` is given, and its idle timeout when
    /// `idle_timeout_s` is (0 turns the idle clock off). Nothing changes when either is bad.
    pub fn update(
        &self,
        id: &str,
        metadata: Option<BTreeMap<String, String>>,
        idle_timeout_s: Option<u64>,
    ) -> Result<Arc<Sb>> {
        if idle_timeout_s.is_some_and(|t| t > api::MAX_TIMEOUT_S) {
            return Err(Error::Invalid(format!("idle_timeout_s must be between 0 (off) and {}", api::MAX_TIMEOUT_S)));
        }
        let sb = self.get(id)?;
        {
            let mut m = lock(&sb.mutable);
            if let Some(md) = metadata {
                m.metadata = md;
            }
            if let Some(t) = idle_timeout_s {
                m.idle_timeout = (t > 0).then(|| Duration::from_secs(t));
            }
        }
        if idle_timeout_s.is_some() {
            sb.clock.wake.notify_one();
        }
        if let Err(e) = self.store.set_config(&sb.id, &sb.config()) {
            tracing::error!(sandbox = %sb.id, "store settings: {e}");
        }
        Ok(sb)
    }
}
