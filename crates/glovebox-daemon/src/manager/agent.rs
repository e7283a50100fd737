//! The manager's own calls to a sandbox's agent (one request, one reply; writing a file),
//! and how a broken agent connection is reported: as the reason the sandbox is gone, when
//! it is.

use glovebox_proto::agent::{self as ap, Reply, Request};
use glovebox_proto::io::{Reader, Writer};

use super::{Manager, Sb};
use crate::error::{Error, Result};
use glovebox_proto::api::EndReason;

impl Sb {
    /// A new connection to the sandbox's agent.
    pub async fn connect(&self) -> Result<(Reader, Writer)> {
        glovebox_proto::io::connect(self.host.agent_socket()).await.map_err(|e| Error::Agent(e.to_string()))
    }
}

impl Manager {
    /// One request to a sandbox's agent, answered by one reply.
    pub async fn agent_call(&self, sb: &Sb, req: &Request) -> Result<Reply> {
        let call = async {
            let (mut r, mut w) = sb.connect().await?;
            w.json(req).await?;
            r.json::<Reply>().await.map_err(|e| self.agent_error(&sb.id, e))
        };
        tokio::time::timeout(crate::ops::AGENT_REPLY, call)
            .await
            .map_err(|_| self.agent_error(&sb.id, "the agent did not answer in time"))?
    }

    /// Turns a broken agent connection into the reason the sandbox is gone, when it is.
    pub fn agent_error(&self, id: &str, e: impl std::fmt::Display) -> Error {
        match self.get(id) {
            Err(gone @ Error::Gone { .. }) => gone,
            // The agent died and the watch has not recorded it yet: say why it is gone now.
            Ok(sb) if !sb.host.alive() => Error::Gone {
                id: id.to_string(),
                reason: if sb.oom_kills() > 0 { EndReason::Oom } else { EndReason::Error },
            },
            _ => Error::Agent(e.to_string()),
        }
    }
}

/// Maps an agent `Reply::Error` to the manager's error.
pub fn reply_error(code: ap::ErrorCode, message: String) -> Error {
    Error::File { code, message }
}

/// Writes `body` to `path` inside the sandbox, through its agent (0644, parents made).
pub(super) async fn write_file(sb: &Sb, path: &str, body: &[u8]) -> Result<()> {
    let (mut r, mut w) = sb.connect().await?;
    w.json(&Request::WriteFile { path: path.into(), mode: Some(0o644), parents: true }).await?;
    for chunk in body.chunks(64 * 1024) {
        w.data(glovebox_proto::frame::Kind::Data, chunk).await?;
    }
    w.json(&Request::EndData).await?;
    match r.json::<Reply>().await? {
        Reply::FileInfo(_) => Ok(()),
        other => Err(Error::Agent(format!("write {path}: {other:?}"))),
    }
}
