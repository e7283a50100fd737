//! The daemon's side of the agent protocol: the one place that connects to a sandbox's agent
//! socket, frames requests, reads replies and output, and bounds how long it waits.
//!
//! The rest of the daemon calls typed methods of [`AgentClient`] and never builds a
//! `Request` or a frame. The client sits below the manager and the HTTP layer: it is given a
//! socket path, not a sandbox, and fails with [`AgentError`]. What a failure means to the
//! daemon is decided here too ([`AgentError::into_error`]); whether a broken connection means
//! the sandbox ended is asked of the caller, which knows the sandbox.
//!
//! The agent is untrusted (it shares its box with hostile code): a reply of the wrong shape is
//! an error, never a crash, and output beyond a caller's cap is dropped even if sent.

mod client;
mod command;
mod error;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use client::{AgentClient, DirWatch, FileReader, NewFile, Upload};
pub use command::{Output, OutputStream, Running, Session, SessionInput, SessionOutput, StdinWriter};
pub use error::{AgentError, Op};

/// How long the daemon waits for any single reply of an agent (a hung or hostile agent must
/// not hang API requests).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// How long past a command's own timeout the daemon waits for the agent's verdict.
pub const END_SLACK: Duration = Duration::from_secs(10);
