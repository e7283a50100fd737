//! The seam for reactions to a sandbox's life that are not the manager's own (its record in
//! the store, lifecycle events, metered usage): the manager tells its observers when a
//! sandbox is created and when it ends, and never calls those services itself.

use glovebox_proto::api::EndReason;

use super::Sb;

/// Work an observer defers until the change is visible to everyone (e.g. publishing an
/// event once the sandbox it names is listed).
pub type Announce = Box<dyn FnOnce() + Send>;

pub trait Observer: Send + Sync {
    /// `sb` was made and is about to be listed: record it. The announcement runs once it is
    /// listed.
    fn created(&self, sb: &Sb) -> Option<Announce>;
    /// `sb` ended for `reason` (its meter is finished, it is no longer listed, its processes
    /// still run). The announcement runs once the manager has recorded the end itself.
    fn ended(&self, sb: &Sb, reason: EndReason, detail: Option<&str>) -> Option<Announce>;
}
