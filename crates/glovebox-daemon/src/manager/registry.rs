//! The sandbox registry: the live sandboxes by id, and the recently ended ones with why they
//! ended (so later calls answer "gone, because …" instead of a bare "not found").

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use glovebox_proto::api::{self, EndReason, Sandbox};

use super::{Manager, Sb};
use crate::error::{Error, Result};
use crate::util::lock;

/// How many ended sandboxes are remembered (to answer "gone, because …").
const GONE_MEMORY: usize = 10_000;

/// Ended sandboxes' reasons, the oldest forgotten first.
#[derive(Default)]
struct Gone {
    reasons: HashMap<String, EndReason>,
    order: VecDeque<String>,
}

#[derive(Default)]
pub struct Registry {
    live: RwLock<HashMap<String, Arc<Sb>>>,
    gone: Mutex<Gone>,
}

impl Registry {
    pub(crate) fn insert(&self, sb: Arc<Sb>) {
        self.live.write().unwrap_or_else(|p| p.into_inner()).insert(sb.id.clone(), sb);
    }

    /// Unlists a sandbox and remembers why it ended, in one step (the list held meanwhile): a
    /// request never finds it neither live nor gone (it would be told "not found", or an agent
    /// error mapped as one, while the destroy is under way). The caller ends it.
    pub(crate) fn retire(&self, id: &str, reason: EndReason) -> Option<Arc<Sb>> {
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        let sb = live.remove(id)?;
        self.remember(id, reason);
        Some(sb)
    }

    /// Unlists every sandbox.
    pub(crate) fn drain(&self) -> Vec<Arc<Sb>> {
        self.live.write().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, sb)| sb).collect()
    }

    pub(crate) fn live(&self, id: &str) -> Option<Arc<Sb>> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.live.read().unwrap_or_else(|p| p.into_inner()).contains_key(id)
    }

    /// Every live sandbox.
    pub(crate) fn all(&self) -> Vec<Arc<Sb>> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    pub(crate) fn ids(&self) -> Vec<String> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    pub(crate) fn count(&self) -> usize {
        self.live.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Remembers why `id` ended.
    pub(crate) fn remember(&self, id: &str, reason: EndReason) {
        let mut g = lock(&self.gone);
        if g.reasons.insert(id.to_string(), reason).is_none() {
            g.order.push_back(id.to_string());
        }
        while g.order.len() > GONE_MEMORY {
            if let Some(old) = g.order.pop_front() {
                g.reasons.remove(&old);
            }
        }
    }

    /// Why `id` ended, if it is remembered.
    pub(crate) fn gone(&self, id: &str) -> Option<EndReason> {
        lock(&self.gone).reasons.get(id).copied()
    }
}

impl Manager {
    /// The live sandbox, or why it is not.
    pub fn get(&self, id: &str) -> Result<Arc<Sb>> {
        if let Some(sb) = self.registry.live(id) {
            return match sb.clock.ended.get() {
                Some(&reason) => Err(Error::Gone { id: id.to_string(), reason }),
                None => Ok(sb),
            };
        }
        if let Some(reason) = self.registry.gone(id) {
            return Err(Error::Gone { id: id.to_string(), reason });
        }
        match self.store.end_reason(id) {
            Ok(Some(reason)) => Err(Error::Gone { id: id.to_string(), reason }),
            _ => Err(Error::SandboxNotFound(id.to_string())),
        }
    }

    /// What a request on sandbox `id` that failed answers: that the sandbox is gone if it was
    /// destroyed meanwhile (what the request was using went with it), else `e`.
    pub(crate) fn unless_gone(&self, id: &str, e: Error) -> Error {
        self.get(id).err().unwrap_or(e)
    }

    pub fn list(&self) -> Vec<Sandbox> {
        self.list_for(&crate::tenants::Caller::admin())
    }

    /// The live sandboxes `caller` may see.
    pub fn list_for(&self, caller: &crate::tenants::Caller) -> Vec<Sandbox> {
        let mut v: Vec<Sandbox> = self
            .registry
            .all()
            .iter()
            .filter(|s| caller.may_access(&s.tenant) && s.clock.ended.get().is_none())
            .map(|s| s.view())
            .collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// The live sandboxes `keep` says yes to.
    pub fn live_where(&self, keep: impl Fn(&Sb) -> bool) -> Vec<Arc<Sb>> {
        self.registry.all().into_iter().filter(|s| keep(s)).collect()
    }

    /// The tenant owning sandbox `id` (live or recently ended), if it is known.
    pub fn owner_of(&self, id: &str) -> Option<String> {
        if let Some(sb) = self.registry.live(id) {
            return Some(sb.tenant.clone());
        }
        self.tenants
            .ended_owner(id)
            .or_else(|| self.ended_usage.get(id).map(|u| u.tenant))
            .or_else(|| self.store.sandbox(id).ok().flatten().and_then(|r| r.config.tenant))
    }

    /// Metered use of a sandbox, live or ended.
    pub fn usage_of(&self, id: &str) -> Option<api::SandboxUsage> {
        if let Some(sb) = self.registry.live(id) {
            return Some(sb.usage());
        }
        self.ended_usage.get(id)
    }

    /// Usage totals per tenant (all tenants when `tenant` is None), live sandboxes included.
    pub fn usage_report(&self, tenant: Option<&str>) -> Vec<api::TenantUsage> {
        let live: Vec<api::SandboxUsage> = self.registry.all().iter().map(|s| s.usage()).collect();
        self.ended_usage.report(tenant, &live)
    }

    /// The defaults (so the layers) of every live sandbox's built template.
    pub fn live_template_defaults(&self) -> Vec<Arc<crate::templates::TemplateMeta>> {
        self.registry.all().iter().filter_map(|s| s.template_defaults.clone()).collect()
    }

    pub fn live_count(&self) -> usize {
        self.registry.count()
    }
}
