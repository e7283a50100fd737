//! Wire types shared by the daemon, the agent and the clients. No I/O lives here.

pub mod agent;
pub mod api;
pub mod frame;
#[cfg(feature = "tokio")]
pub mod io;
pub mod policy;
