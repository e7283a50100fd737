//! [`AgentClient`]: one typed method per agent request. Each call opens its own connection to
//! the agent socket (the protocol's one exchange per connection).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use glovebox_proto::agent::{CommandInfo, Event, ExecSpec, FileInfo, FsEvent, Owner, Reply, Request, Usage};
use glovebox_proto::frame::{Kind, CHUNK};
use glovebox_proto::io::{self, Reader, Writer};
use tokio::time::Instant;

use super::command::{send_stdin, OutputStream, Running, Session, StdinWriter};
use super::{AgentError, END_SLACK, REPLY_TIMEOUT};

/// How a written file is placed besides its data: its mode (default 0644, or the old file's),
/// owner (of it and of the parents made for it; default root) and `user.` extended
/// attributes (full names).
#[derive(Debug, Clone, Default)]
pub struct NewFile {
    pub mode: Option<u32>,
    pub owner: Option<Owner>,
    pub xattrs: BTreeMap<String, String>,
}

impl NewFile {
    pub fn with_mode(mode: Option<u32>) -> NewFile {
        NewFile { mode, ..NewFile::default() }
    }
}

/// A directory watch in the agent; dropping it ends the watch.
pub struct DirWatch {
    r: Reader,
    w: Writer,
}

impl DirWatch {
    /// The changes since the last call (or the start of the watch), and whether some were
    /// dropped (too many, or too many directories).
    pub async fn events(&mut self) -> Result<(Vec<FsEvent>, bool), AgentError> {
        let sync = async {
            self.w.json(&Request::WatchSync).await?;
            Ok::<_, AgentError>(self.r.json::<Reply>().await?)
        };
        match tokio::time::timeout(REPLY_TIMEOUT, sync).await.map_err(|_| NO_ANSWER)?? {
            Reply::FsEvents { events, overflowed } => Ok((events, overflowed)),
            other => Err(unexpected(other)),
        }
    }
}

/// The agent of one sandbox, reached through its socket.
#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
}

const NO_ANSWER: AgentError = AgentError::Timeout("the agent did not answer in time");
const UNEXPECTED: AgentError = AgentError::Unexpected("unexpected reply");

/// A reply that is not the one the exchange expects: the agent's refusal, or a wrong shape.
fn unexpected(r: Reply) -> AgentError {
    match r {
        Reply::Error { code, message } => AgentError::Refused { code, message },
        _ => UNEXPECTED,
    }
}

impl AgentClient {
    pub fn new(socket: impl Into<PathBuf>) -> AgentClient {
        AgentClient { socket: socket.into() }
    }

    async fn open(&self, req: &Request) -> Result<(Reader, Writer), AgentError> {
        let (r, mut w) = io::connect(&self.socket).await?;
        w.json(req).await?;
        Ok((r, w))
    }

    /// One request answered by one reply, all within [`REPLY_TIMEOUT`].
    async fn call(&self, req: &Request) -> Result<Reply, AgentError> {
        let call = async {
            let (mut r, _w) = self.open(req).await?;
            Ok(r.json::<Reply>().await?)
        };
        tokio::time::timeout(REPLY_TIMEOUT, call).await.map_err(|_| NO_ANSWER)?
    }

    /// The agent's protocol version.
    pub async fn ping(&self) -> Result<u32, AgentError> {
        match self.call(&Request::Ping).await? {
            Reply::Pong { version } => Ok(version),
            other => Err(unexpected(other)),
        }
    }

    /// The commands the agent knows of, running or finished and not released.
    pub async fn list(&self) -> Result<Vec<CommandInfo>, AgentError> {
        match self.call(&Request::List).await? {
            Reply::Commands { commands } => Ok(commands),
            other => Err(unexpected(other)),
        }
    }

    /// Sends `signal` to command `id`'s whole process group.
    pub async fn signal(&self, id: u64, signal: i32) -> Result<(), AgentError> {
        self.ok(&Request::Signal { id, signal }).await
    }

    /// Sets terminal command `id`'s window size.
    pub async fn resize(&self, id: u64, cols: u16, rows: u16) -> Result<(), AgentError> {
        self.ok(&Request::Resize { id, cols, rows }).await
    }

    /// Forgets finished command `id` and frees its output.
    pub async fn release(&self, id: u64) -> Result<(), AgentError> {
        self.ok(&Request::Release { id }).await
    }

    pub async fn usage(&self) -> Result<Usage, AgentError> {
        match self.call(&Request::Usage).await? {
            Reply::Usage(u) => Ok(u),
            other => Err(unexpected(other)),
        }
    }

    pub async fn stat(&self, path: String) -> Result<FileInfo, AgentError> {
        self.file_info(&Request::Stat { path }).await
    }

    pub async fn list_dir(&self, path: String, depth: u32) -> Result<Vec<FileInfo>, AgentError> {
        match self.call(&Request::ListDir { path, depth }).await? {
            Reply::Entries { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Makes a directory (and its missing parents), the new ones owned by `owner`.
    pub async fn make_dir(&self, path: String, parents: bool, owner: Option<Owner>) -> Result<FileInfo, AgentError> {
        self.file_info(&Request::MakeDir { path, parents, owner }).await
    }

    pub async fn remove(&self, path: String, recursive: bool) -> Result<(), AgentError> {
        self.ok(&Request::Remove { path, recursive }).await
    }

    /// Starts watching a directory (and those below it when `recursive`).
    pub async fn watch_dir(&self, path: String, recursive: bool) -> Result<DirWatch, AgentError> {
        let start = async {
            let (mut r, w) = self.open(&Request::WatchDir { path, recursive }).await?;
            let reply = r.json::<Reply>().await?;
            Ok::<_, AgentError>((r, w, reply))
        };
        match tokio::time::timeout(REPLY_TIMEOUT, start).await.map_err(|_| NO_ANSWER)?? {
            (r, w, Reply::Ok) => Ok(DirWatch { r, w }),
            (_, _, other) => Err(unexpected(other)),
        }
    }

    /// A connection to `127.0.0.1:port` inside the sandbox, relayed by the agent (see
    /// `Request::ConnectPort`): the stream carries the port's bytes once this returns.
    pub async fn connect_port(&self, port: u16) -> Result<glovebox_proto::io::RawStream, AgentError> {
        let start = async {
            let (mut r, w) = self.open(&Request::ConnectPort { port }).await?;
            let reply = r.json::<Reply>().await?;
            Ok::<_, AgentError>((r, w, reply))
        };
        match tokio::time::timeout(REPLY_TIMEOUT, start).await.map_err(|_| NO_ANSWER)?? {
            (r, w, Reply::Ok) => Ok(glovebox_proto::io::into_raw(r, w)),
            (_, _, other) => Err(unexpected(other)),
        }
    }

    /// Renames `from` to `to`; the destination's info.
    pub async fn rename(&self, from: String, to: String) -> Result<FileInfo, AgentError> {
        self.file_info(&Request::Rename { from, to }).await
    }

    async fn ok(&self, req: &Request) -> Result<(), AgentError> {
        match self.call(req).await? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn file_info(&self, req: &Request) -> Result<FileInfo, AgentError> {
        match self.call(req).await? {
            Reply::FileInfo(i) => Ok(i),
            other => Err(unexpected(other)),
        }
    }

    /// Opens a file for reading: its info, then its contents.
    pub async fn read_file(&self, path: String) -> Result<(FileInfo, FileReader), AgentError> {
        let (mut r, w) = self.open(&Request::ReadFile { path }).await?;
        match r.json::<Reply>().await? {
            Reply::FileInfo(info) => {
                let size = info.size;
                Ok((info, FileReader { r, _w: w, size, got: 0, done: false }))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Opens a file for writing (missing parents made); its contents follow through the
    /// returned [`Upload`].
    pub async fn write_file(&self, path: String, new: NewFile) -> Result<Upload, AgentError> {
        let NewFile { mode, owner, xattrs } = new;
        let (r, w) = self.open(&Request::WriteFile { path, mode, parents: true, owner, xattrs }).await?;
        Ok(Upload { r, w })
    }

    /// Starts a command; returns once the agent said it started (within [`REPLY_TIMEOUT`]).
    /// Its output stream must report its end within its own timeout and [`END_SLACK`].
    pub async fn exec(&self, spec: &ExecSpec) -> Result<Running, AgentError> {
        let started = async {
            let (mut r, w) = self.open(&Request::Exec(spec.clone())).await?;
            let first = r.json::<serde_json::Value>().await?;
            Ok::<_, AgentError>((r, w, first))
        };
        let (r, w, first) = tokio::time::timeout(REPLY_TIMEOUT, started)
            .await
            .map_err(|_| AgentError::Timeout("the agent did not start the command in time"))??;
        let (id, pid) = match serde_json::from_value::<Event>(first.clone()) {
            Ok(Event::Started { id, pid }) => (id, pid),
            _ => {
                return Err(match serde_json::from_value::<Reply>(first) {
                    Ok(Reply::Error { code, message }) => AgentError::Refused { code, message },
                    _ => AgentError::Unexpected("unexpected reply to exec"),
                })
            }
        };
        let deadline = spec.timeout_ms.map(|t| Instant::now() + Duration::from_millis(t) + END_SLACK);
        Ok(Running { id, pid, output: OutputStream::new(r, deadline), stdin: StdinWriter::new(w, id) })
    }

    /// Follows command `id`: what was kept of its output from the start, then live output,
    /// then its exit. No deadline: a command may run as long as its sandbox lives.
    pub async fn attach(&self, id: u64) -> Result<OutputStream, AgentError> {
        let (r, mut w) = self.open(&Request::Attach { id }).await?;
        w.flush().await?;
        Ok(OutputStream::new(r, None))
    }

    /// Attaches full duplex to `raw` command `id`.
    pub async fn session(&self, id: u64) -> Result<Session, AgentError> {
        let (r, w) = self.open(&Request::Session { id }).await?;
        Ok(Session::new(r, w))
    }

    /// Writes `data` to background command `id`'s stdin, then closes it if `close`.
    pub async fn stdin(&self, id: u64, data: &[u8], close: bool) -> Result<(), AgentError> {
        let (mut r, mut w) = self.open(&Request::Stdin { id }).await?;
        // On a write error the agent has already answered (e.g. no such command): read that.
        let sent = send_stdin(&mut w, id, data, close).await;
        let reply = tokio::time::timeout(REPLY_TIMEOUT, r.json::<Reply>()).await.map_err(|_| NO_ANSWER)?;
        match (sent, reply) {
            (Err(e), Err(_)) => Err(e),
            (_, Err(e)) => Err(e.into()),
            (_, Ok(Reply::Ok)) => Ok(()),
            (_, Ok(other)) => Err(unexpected(other)),
        }
    }
}

/// A file's contents as the agent sends them, cut at the size it announced.
pub struct FileReader {
    r: Reader,
    _w: Writer,
    size: u64,
    got: u64,
    done: bool,
}

impl FileReader {
    /// The next chunk; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, AgentError> {
        if self.done {
            return Ok(None);
        }
        let item = match self.r.next().await {
            Ok(Some((Kind::Data, mut b))) => {
                self.got += b.len() as u64;
                if self.got > self.size {
                    // The file grew while being read: stop at the announced length.
                    b.truncate(b.len() - (self.got - self.size) as usize);
                    self.got = self.size;
                    self.done = true;
                }
                return Ok(Some(b));
            }
            Ok(Some((Kind::Json, b))) => match serde_json::from_slice::<Reply>(&b) {
                Ok(Reply::Ok) if self.got == self.size => Ok(None),
                _ => Err(AgentError::Unexpected("file changed or failed while downloading")),
            },
            _ => Err(AgentError::Closed("download interrupted")),
        };
        self.done = true;
        item
    }
}

/// A file being written: its contents go in chunks, then [`Upload::finish`].
pub struct Upload {
    r: Reader,
    w: Writer,
}

impl Upload {
    /// Sends a piece of the contents. If the agent stopped reading, its reply says why
    /// (e.g. the disk is full).
    pub async fn send(&mut self, data: &[u8]) -> Result<(), AgentError> {
        for piece in data.chunks(CHUNK) {
            if let Err(e) = self.w.data(Kind::Data, piece).await {
                return match self.r.json::<Reply>().await {
                    Ok(Reply::Error { code, message }) => Err(AgentError::Refused { code, message }),
                    _ => Err(e.into()),
                };
            }
        }
        Ok(())
    }

    /// Ends the contents; the written file's info.
    pub async fn finish(mut self) -> Result<FileInfo, AgentError> {
        self.w.json(&Request::EndData).await?;
        self.w.flush().await?;
        match self.r.json::<Reply>().await? {
            Reply::FileInfo(i) => Ok(i),
            other => Err(unexpected(other)),
        }
    }
}
