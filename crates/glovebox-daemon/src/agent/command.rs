//! A command's exchange once started: its output stream, its stdin, and the full-duplex
//! session of a `raw` command (a language kernel).

use glovebox_proto::agent::{Event, ExitStatus, Reply, Request};
use glovebox_proto::frame::Kind;
use glovebox_proto::io::{Reader, Writer};
use tokio::time::Instant;

use super::AgentError;

/// A piece of a command's output, or its end.
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exited(ExitStatus),
}

/// A command's output as the agent sends it: chunks of stdout and stderr, then its exit.
pub struct OutputStream {
    r: Reader,
    /// When the agent must have reported the command's end.
    deadline: Option<Instant>,
}

impl OutputStream {
    pub(super) fn new(r: Reader, deadline: Option<Instant>) -> OutputStream {
        OutputStream { r, deadline }
    }

    /// The next piece of output; `Output::Exited` is the last.
    pub async fn next(&mut self) -> Result<Output, AgentError> {
        match self.deadline {
            Some(d) => tokio::time::timeout_at(d, self.read())
                .await
                .map_err(|_| AgentError::Timeout("the agent did not report the command's end in time"))?,
            None => self.read().await,
        }
    }

    async fn read(&mut self) -> Result<Output, AgentError> {
        match self.r.next().await? {
            None => Err(AgentError::Closed("connection closed before the command ended")),
            Some((Kind::Stdout, b)) => Ok(Output::Stdout(b)),
            Some((Kind::Stderr, b)) => Ok(Output::Stderr(b)),
            Some((Kind::Json, b)) => match serde_json::from_slice::<Event>(&b) {
                Ok(Event::Exited(e)) => Ok(Output::Exited(e)),
                _ => match serde_json::from_slice::<Reply>(&b) {
                    Ok(Reply::Error { code, message }) => Err(AgentError::Refused { code, message }),
                    _ => Err(AgentError::Unexpected("unexpected message in output stream")),
                },
            },
            Some(_) => Err(AgentError::Unexpected("unexpected frame in output stream")),
        }
    }

    /// Reads to the command's end, keeping at most `cap` bytes of each stream (the rest is
    /// read and dropped).
    pub async fn collect(&mut self, cap: u64) -> Result<(ExitStatus, [Vec<u8>; 2]), AgentError> {
        let mut out = [Vec::new(), Vec::new()];
        loop {
            let (i, b) = match self.next().await? {
                Output::Exited(e) => return Ok((e, out)),
                Output::Stdout(b) => (0, b),
                Output::Stderr(b) => (1, b),
            };
            let room = (cap as usize).saturating_sub(out[i].len());
            out[i].extend_from_slice(&b[..b.len().min(room)]);
        }
    }
}

/// The daemon's end of a command's stdin, inside its `Exec` exchange.
pub struct StdinWriter {
    w: Writer,
    id: u64,
}

impl StdinWriter {
    pub(super) fn new(w: Writer, id: u64) -> StdinWriter {
        StdinWriter { w, id }
    }

    /// Writes `data` to the command's stdin, then closes it if `close`.
    pub async fn send(&mut self, data: &[u8], close: bool) -> Result<(), AgentError> {
        send_stdin(&mut self.w, self.id, data, close).await
    }
}

/// Stdin frames, then the message that ends them, flushed.
pub(super) async fn send_stdin(w: &mut Writer, id: u64, data: &[u8], close: bool) -> Result<(), AgentError> {
    w.data(Kind::Stdin, data).await?;
    if close {
        w.json(&Request::CloseStdin { id }).await?;
    } else {
        w.json(&Request::EndStdin).await?;
    }
    Ok(w.flush().await?)
}

/// A command the agent started. Dropping it ends the exchange (a background command goes
/// on; a foreground one keeps running until it ends, its output unread).
pub struct Running {
    pub id: u64,
    pub pid: i32,
    pub output: OutputStream,
    pub stdin: StdinWriter,
}

/// A full-duplex attachment to a `raw` command: its output as it is read, stdin written
/// straight to it. The command goes on when the session is dropped.
pub struct Session {
    r: Reader,
    w: Writer,
}

impl Session {
    pub(super) fn new(r: Reader, w: Writer) -> Session {
        Session { r, w }
    }

    /// Writes to the command's stdin.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), AgentError> {
        self.w.data(Kind::Stdin, data).await?;
        Ok(self.w.flush().await?)
    }

    /// Splits the session into its output and its input, to be used concurrently.
    pub fn split(self) -> (SessionOutput, SessionInput) {
        (SessionOutput { r: self.r }, SessionInput { w: self.w })
    }

    /// The next chunk of output (`Output::Stdout` or `Output::Stderr`); `None` once the
    /// command exited.
    pub async fn read(&mut self) -> Result<Option<Output>, AgentError> {
        loop {
            match self.r.next().await? {
                Some((Kind::Stdout, b)) => return Ok(Some(Output::Stdout(b))),
                Some((Kind::Stderr, b)) => return Ok(Some(Output::Stderr(b))),
                // The only message of a session is the command's exit.
                Some((Kind::Json, _)) | None => return Ok(None),
                Some(_) => {}
            }
        }
    }
}

/// The output half of a [`Session`].
pub struct SessionOutput {
    r: Reader,
}

impl SessionOutput {
    /// The next chunk of output, or `Output::Exited` (the last); `None` when the agent ended
    /// the session without an exit (another session took the command over).
    pub async fn next(&mut self) -> Result<Option<Output>, AgentError> {
        loop {
            match self.r.next().await? {
                Some((Kind::Stdout, b)) => return Ok(Some(Output::Stdout(b))),
                Some((Kind::Stderr, b)) => return Ok(Some(Output::Stderr(b))),
                Some((Kind::Json, b)) => {
                    return match serde_json::from_slice::<Event>(&b) {
                        Ok(Event::Exited(e)) => Ok(Some(Output::Exited(e))),
                        _ => match serde_json::from_slice::<Reply>(&b) {
                            Ok(Reply::Error { code, message }) => Err(AgentError::Refused { code, message }),
                            _ => Err(AgentError::Unexpected("unexpected message in a session")),
                        },
                    }
                }
                None => return Ok(None),
                Some(_) => {}
            }
        }
    }
}

/// The input half of a [`Session`].
pub struct SessionInput {
    w: Writer,
}

impl SessionInput {
    /// Writes to the command's stdin (a terminal's input).
    pub async fn write(&mut self, data: &[u8]) -> Result<(), AgentError> {
        self.w.data(Kind::Stdin, data).await?;
        Ok(self.w.flush().await?)
    }
}
