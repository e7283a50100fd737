//! The Glovebox daemon as a library: the sandbox manager, the operations that go to a
//! sandbox's agent, and the HTTP API. The `glovebox` binary runs it (`glovebox serve`) or
//! embeds it (`glovebox run` without a daemon).

pub mod agent;
pub mod backend;
pub mod broker;
pub mod builds;
pub mod cgroup_tuning;
pub mod code;
pub mod conn;
pub mod daytona;
pub mod e2b;
pub mod egress;
pub mod error;
pub mod events;
pub mod hibernate;
pub mod http;
pub mod idle;
pub mod kernels;
pub mod manager;
pub mod metrics;
pub mod modal;
pub mod net;
pub mod ops;
pub mod ports;
pub mod sandboxd;
pub mod secrets;
pub mod server;
pub mod slots;
pub mod snapshots;
pub mod store;
pub mod templates;
pub mod tenants;
pub mod usage;
pub mod util;
pub mod vercel;
pub mod volumes;

#[cfg(test)]
mod router_tests;

/// Caps the allocator's arenas for this process (call first thing in `main`, before any
/// thread starts): with one arena per thread the daemon's heap grows with every thread that
/// ever allocated under load, each arena keeping its own free pages.
pub fn limit_malloc_arenas() {
    glovebox_jail::sys::limit_malloc_arenas(2);
}

/// Raises this process's open-file soft limit to its hard limit: the daemon holds three or
/// four fds per sandbox (its pidfd twice, the record's and the death watch's, its uid slot's
/// lock, and its OOM counter once it has run a command) and one per connection, and the
/// usual soft limit of 1,024 would refuse creates from about 330 sandboxes on. Never touches
/// the hard limit. A sandbox's PID 1 lowers both limits to its own bound (65,536), so
/// commands now start with that soft limit where they inherited the daemon's (often 1,024).
pub fn raise_fd_limit() {
    if let Err(e) = glovebox_jail::sys::raise_soft_rlimit(libc::RLIMIT_NOFILE) {
        eprintln!("glovebox: raise the open-file limit: {e}");
    }
}
