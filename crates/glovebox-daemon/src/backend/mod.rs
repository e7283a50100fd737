//! Where sandboxes run: the [`Backend`] trait the manager boots, watches and ends sandboxes
//! through, whatever the isolation tier. The process jail ([`jail::Jail`]) is the first
//! implementation; a gVisor or microVM tier plugs in here with the same agent inside.
//!
//! Invariants:
//! - A backend only makes and removes host state; it never speaks the agent protocol (the
//!   agent's socket is handed to the manager) and never touches a path inside a sandbox.
//! - [`Backend::boot`] fails closed: an error leaves nothing of the sandbox behind.
//! - An [`Instance`] dropped without [`Instance::kill`] and [`Instance::release`] leaves the
//!   sandbox running (a restart re-adopts it); only its host-wide claim on its slot goes.

pub mod gvisor;
pub mod jail;
mod jailed;
pub(crate) mod made_ahead;
mod skel;
mod zygotes;

#[cfg(test)]
pub(crate) mod fake;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use glovebox_jail::cgroup::Stats;
use glovebox_proto::api::Limits;

use crate::error::Result;

/// What a sandbox is booted from, the same for every tier.
#[derive(Debug, Clone)]
pub struct Spec {
    pub limits: Limits,
    /// Read-only layers, top-most first (the base below them is the backend's).
    pub layers: Vec<PathBuf>,
    /// The bottom layer: `None` for the host's /usr under the backend's own skeleton, else a
    /// whole-root skeleton (Debian, OCI images).
    pub root_skel: Option<PathBuf>,
    /// A host directory for the writable layer (template builds), else a capped tmpfs.
    pub upper: Option<PathBuf>,
    /// Made ahead of requests (a warm sandbox): it yields the CPU to requests while booting.
    pub background: bool,
    /// Its policy needs a network link: a namespace linked ahead is used if one is ready.
    pub link: bool,
    /// Volumes bound into its root (host mounts the manager holds for it).
    pub volumes: Vec<glovebox_jail::config::Volume>,
    /// Which kernel its processes run on.
    pub isolation: glovebox_proto::api::Isolation,
    /// Its python kernel from the zygote of this tenant and template (`Config::code_zygote`),
    /// where the backend can: the modules it preloads, and whose zygote.
    pub zygote: Option<ZygoteWant>,
}

/// Which zygote a sandbox's python kernel comes from: one per tenant and template, never
/// shared (the zygote runs the template's code and holds every capability over the user
/// namespaces of the sandboxes it seeds).
#[derive(Clone, Debug, PartialEq)]
pub struct ZygoteWant {
    pub tenant: String,
    pub preload: String,
}

/// One running sandbox as its backend holds it.
pub trait Instance: Send + Sync {
    fn id(&self) -> &str;
    /// The host pid of the sandbox's PID 1 (its agent).
    fn pid(&self) -> i32;
    /// The sandbox's host-wide slot: it names its network link and addresses.
    fn slot(&self) -> u32;
    /// Whether it was started in a network namespace linked ahead for its slot (veth pair,
    /// addresses, route, deny-all rules): attaching it only replaces its rules, and its
    /// [`Instance::release`] removes them.
    fn linked_ahead(&self) -> bool;
    /// Its private run directory on the host (the sandbox cannot reach it).
    fn dir(&self) -> &Path;
    /// Where its agent listens: the channel every exec, file and code request goes through.
    fn agent_socket(&self) -> &Path;
    /// Whether its agent still runs.
    fn alive(&self) -> bool;
    /// A descriptor that becomes readable when the agent exits (the manager's death watch).
    fn exit_fd(&self) -> Option<OwnedFd>;
    fn stats(&self) -> Option<Stats>;
    fn cpu_usage_usec(&self) -> Option<u64>;
    fn oom_kills(&self) -> u64;
    /// The python kernel its backend forked into it from its template's zygote, until the
    /// sandbox's first python kernel takes it (`kernels::Target::forked`).
    fn forked_kernel(&self) -> Option<&std::sync::Mutex<Option<crate::kernels::Forked>>> {
        None
    }
    /// Applies new resource limits (a warm sandbox handed out with other limits than its boot's).
    fn set_limits(&self, limits: &Limits) -> Result<()>;
    /// Lowest (`true`) or normal CPU weight.
    fn set_background(&self, background: bool) -> Result<()>;
    /// Stops every process of the sandbox where it stands (pause); its memory stays.
    fn freeze(&self) -> Result<()>;
    /// Lets a frozen sandbox run again (resume); a no-op on one not frozen.
    fn thaw(&self) -> Result<()>;
    /// Where the host reads the sandbox's writable layer (for a snapshot), and the first host
    /// uid of its range (its files' owners are shifted by it); `None` where the tier cannot
    /// show it. The tree is the sandbox's: walk it without following anything in it.
    fn writable_layer(&self) -> Option<WritableLayer>;
    /// Kills everything in the sandbox (frozen or not) and waits (bounded) for it to be gone; false when it
    /// was not seen gone, and [`Instance::release`] must end the rest. Blocking.
    fn kill(&self) -> bool;
    /// Removes what a killed sandbox leaves on the host. Blocking.
    fn release(&self, gone: bool) -> std::result::Result<(), String>;
}

/// A sandbox's writable layer as the host reaches it: `path` holds `root/` and `usr/`
/// (and `etc/` for a flat root), each an overlay upper (or a flat root's own tree).
#[derive(Debug, Clone)]
pub struct WritableLayer {
    pub path: PathBuf,
    pub uid_base: u32,
}

/// A sandbox a previous daemon left, as found on the host.
#[derive(Debug, Clone)]
pub struct Orphan {
    pub id: String,
    pub dir: PathBuf,
    /// Its slot as its directory records it.
    pub slot: Option<u32>,
}

/// What a previous daemon recorded of a sandbox it handed out, to take it over by.
pub struct Recorded<'a> {
    pub id: &'a str,
    pub pid: i32,
    pub pid_start: u64,
    pub slot: u32,
    pub dir: &'a Path,
}

/// An isolation tier.
pub trait Backend: Send + Sync {
    /// Boots a sandbox whose agent is ready to answer. Blocking.
    fn boot(&self, spec: &Spec) -> Result<Box<dyn Instance>>;
    /// Takes over a sandbox a previous daemon left, when every piece of it is intact; the
    /// error says which is not.
    fn reopen(&self, rec: &Recorded<'_>) -> std::result::Result<Box<dyn Instance>, String>;
    /// Sandboxes on the host whose owner is gone (nobody holds their slot).
    fn orphans(&self) -> Vec<Orphan>;
    /// Kills and removes an orphan nobody adopted.
    fn clean(&self, orphan: &Orphan);
    /// Removes leftovers of interrupted creates and teardowns (host resources no sandbox
    /// directory names).
    fn sweep(&self);
    /// Removes the base root trees no process and no sandbox uses (those kept for the next
    /// processes aside).
    fn reap_stale_bases(&self);
    /// Starts making ahead what boots need (after reconciliation).
    fn start(&self);
    /// Stops making things ahead and removes what was made, waiting (bounded) for what is
    /// being made (shutdown). Blocking.
    fn close(&self);
    /// Lets go of what only this process's sandboxes need (its hold on its skeleton), once
    /// none is left.
    fn release_own_state(&self);
}
