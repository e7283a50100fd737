//! A sandbox's agent as the manager reaches it: the client (the `agent` room owns the
//! protocol), writing a file, and how a broken agent connection is reported: as the reason
//! the sandbox is gone, when it is.

use super::{Manager, Sb};
use crate::agent::AgentClient;
use crate::error::{Error, Result};
use glovebox_proto::api::EndReason;

impl Sb {
    /// A client of the sandbox's agent.
    pub fn agent(&self) -> AgentClient {
        AgentClient::new(self.host.agent_socket())
    }
}

impl Manager {
    /// Turns a broken agent connection into the reason the sandbox is gone, when it is.
    pub fn agent_error(&self, id: &str, e: impl std::fmt::Display) -> Error {
        match self.get(id) {
            Err(gone @ Error::Gone { .. }) => gone,
            // The agent died and the watch has not recorded it yet: say why it is gone now,
            // and from now on to every caller (the watch, woken, destroys it).
            Ok(sb) if !sb.host.alive() => Error::Gone {
                id: id.to_string(),
                reason: sb.clock.end(if sb.oom_kills() > 0 { EndReason::Oom } else { EndReason::Error }),
            },
            _ => Error::Agent(e.to_string()),
        }
    }
}

/// Writes `body` to `path` inside the sandbox, through its agent (0644, parents made).
pub(super) async fn write_file(sb: &Sb, path: &str, body: &[u8]) -> Result<()> {
    let fail = |e: crate::agent::AgentError| Error::Agent(format!("write {path}: {e}"));
    let mut up =
        sb.agent().write_file(path.to_string(), crate::agent::NewFile::with_mode(Some(0o644))).await.map_err(fail)?;
    for chunk in body.chunks(64 * 1024) {
        up.send(chunk).await.map_err(fail)?;
    }
    up.finish().await.map_err(fail)?;
    Ok(())
}
