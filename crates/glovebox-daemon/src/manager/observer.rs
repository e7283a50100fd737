//! The seam for reactions to a sandbox's life that are not the manager's own (its record in
//! the store, lifecycle events, metered usage, command records): the manager tells its
//! observers when a sandbox is created, when it ends and before it is killed, and never calls
//! those services itself. Each hook does nothing unless an observer says otherwise.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use glovebox_proto::api::EndReason;

use super::{Manager, Sb};

/// Work an observer defers until the change is visible to everyone (e.g. publishing an
/// event once the sandbox it names is listed).
pub type Announce = Box<dyn FnOnce() + Send>;

/// What an observer still asks of a sandbox's agent before the kill.
pub type LastWords<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

pub trait Observer: Send + Sync {
    /// `sb` was made and is about to be listed: record it. The announcement runs once it is
    /// listed.
    fn created(&self, _sb: &Sb) -> Option<Announce> {
        None
    }
    /// `sb` ended for `reason` (its meter is finished, it is no longer listed, its processes
    /// still run). The announcement runs once the manager has recorded the end itself.
    fn ended(&self, _sb: &Sb, _reason: EndReason, _detail: Option<&str>) -> Option<Announce> {
        None
    }
    /// `sb` ended and its agent still answers: the last moment to ask it something (through
    /// `m`), before its processes are killed. Bounded by the observer.
    fn before_kill<'a>(&'a self, _m: &'a Manager, _sb: &'a Arc<Sb>) -> Option<LastWords<'a>> {
        None
    }
}
