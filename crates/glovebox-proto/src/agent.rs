//! Messages between the daemon and the agent (PID 1 of a sandbox).
//!
//! One request per connection: the daemon connects to the sandbox's agent socket, sends one
//! [`Request`] as a JSON frame, then the exchange that request defines (see each variant).
//! Every reply ends with either a terminal event or [`Reply::Error`]. Everything the agent
//! says is untrusted input to the daemon (the agent shares its box with hostile code).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Protocol version, checked by `Ping`.
pub const VERSION: u32 = 1;

/// Default cap on each of stdout and stderr kept for one command.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;

/// What to run: an argv vector (no shell) or a shell string for `/bin/sh -c`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Command {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    pub cmd: Command,
    /// Working directory inside the sandbox; default the user's home or `/`.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Added to the sandbox's environment for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Whether stdin frames will follow; otherwise stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Per-command timeout; `None` means only the sandbox lifetime bounds it.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Cap per stream on the output kept and returned.
    #[serde(default = "default_max_output")]
    pub max_output_bytes: u64,
    /// How much of that cap is kept from the end of the output (the marker of the bytes
    /// dropped in between included); `None`: half the cap.
    #[serde(default)]
    pub output_tail_bytes: Option<u64>,
    /// Run as this uid inside the sandbox (default 0, without capabilities).
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    /// Keep running after this connection ends; fetch with `Attach`.
    #[serde(default)]
    pub background: bool,
    /// Session mode (language kernels): output is not kept but streamed, with backpressure,
    /// to the one `Session` connection attached; implies `background` and `stdin`.
    #[serde(default)]
    pub raw: bool,
    /// Run on a new pseudo-terminal of this size: stdin, stdout and stderr are its slave
    /// (all output arrives as `Kind::Stdout`), it is the command's controlling terminal, and
    /// `TERM` defaults to `xterm-256color`. Implies `raw` (and so `background` and `stdin`).
    #[serde(default)]
    pub pty: Option<PtySize>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

impl PtySize {
    /// The largest side accepted (either way); a terminal is at least 1 × 1.
    pub const MAX: u16 = 1000;

    /// Whether both sides are within `1..=MAX`.
    pub fn is_valid(&self) -> bool {
        (1..=Self::MAX).contains(&self.cols) && (1..=Self::MAX).contains(&self.rows)
    }
}

fn default_max_output() -> u64 {
    DEFAULT_MAX_OUTPUT
}

impl ExecSpec {
    pub fn argv<I: IntoIterator<Item = S>, S: Into<String>>(argv: I) -> ExecSpec {
        ExecSpec {
            cmd: Command::Argv(argv.into_iter().map(Into::into).collect()),
            cwd: None,
            env: BTreeMap::new(),
            stdin: false,
            timeout_ms: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT,
            output_tail_bytes: None,
            uid: None,
            gid: None,
            background: false,
            raw: false,
            pty: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Reply: `Reply::Pong`.
    Ping,
    /// Starts a command. Reply: `Event::Started`, then (unless `background`) output frames
    /// (`Kind::Stdout`/`Kind::Stderr`) and `Event::Exited`. While it runs the daemon may send
    /// `Kind::Stdin` frames and a `Request::CloseStdin`-shaped JSON frame to end stdin.
    Exec(ExecSpec),
    /// Streams a command's output from the start (as much as was kept), then live output,
    /// then `Event::Exited`.
    Attach { id: u64 },
    /// Attaches to a `raw` command full duplex: output frames flow out as they are read,
    /// `Kind::Stdin` frames in go to its stdin; ends with `Event::Exited` when it exits.
    /// One attachment at a time: a new `Session` takes the command over from the one
    /// attached before (which ends without an exit event); when this connection closes the
    /// command keeps running.
    Session { id: u64 },
    /// Sets the terminal size of a `pty` command (its foreground process group gets
    /// `SIGWINCH`). Reply: `Reply::Ok`.
    Resize { id: u64, cols: u16, rows: u16 },
    /// Sends a signal to a command's whole process group. Reply: `Reply::Ok`.
    Signal { id: u64, signal: i32 },
    /// Writes stdin to a background command: `Kind::Stdin` frames follow, then `CloseStdin`
    /// or `EndStdin`. Reply: `Reply::Ok` after the last frame.
    Stdin { id: u64 },
    /// Ends a command's stdin (sent inside an `Exec` or `Stdin` exchange, or alone).
    CloseStdin { id: u64 },
    /// Marks the end of a `Stdin` exchange without closing the command's stdin.
    EndStdin,
    /// Reply: `Reply::Commands`.
    List,
    /// Forgets a finished command and frees its output.
    Release { id: u64 },
    /// Reply: `Reply::FileInfo`, then `Kind::Data` frames, then `Reply::Ok`.
    ReadFile { path: String },
    /// `Kind::Data` frames follow, then `EndData`. Reply: `Reply::FileInfo`.
    WriteFile {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        /// Create missing parent directories.
        #[serde(default = "yes")]
        parents: bool,
        /// Owner of the file and of the parent directories this request creates (default:
        /// the agent's, root).
        #[serde(default)]
        owner: Option<Owner>,
        /// Extended attributes of the new file, full names in the `user.` namespace. The
        /// file replaces any old one whole, so an old file's attributes never carry over.
        #[serde(default)]
        xattrs: BTreeMap<String, String>,
    },
    /// Ends the data of a `WriteFile`.
    EndData,
    /// Reply: `Reply::Entries`.
    ListDir {
        path: String,
        #[serde(default = "one")]
        depth: u32,
    },
    /// Reply: `Reply::FileInfo`.
    Stat { path: String },
    /// Reply: `Reply::FileInfo`.
    MakeDir {
        path: String,
        #[serde(default = "yes")]
        parents: bool,
        /// Owner of the directories this request creates (default: the agent's, root).
        #[serde(default)]
        owner: Option<Owner>,
    },
    /// Reply: `Reply::Ok`.
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Reply: `Reply::FileInfo` of the destination.
    Rename { from: String, to: String },
    /// Reply: `Reply::Usage`.
    Usage,
    /// Watches a directory (and, when `recursive`, the directories below it, new ones
    /// included). Reply: `Reply::Ok` once watching. Then each `WatchSync` the daemon sends on
    /// the connection is answered with `Reply::FsEvents`: what happened since the last one,
    /// up to the moment of the sync. The watch ends with the connection.
    WatchDir {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Connects to `127.0.0.1:port` inside the sandbox (where the daemon cannot reach its
    /// loopback from the host: gVisor's network stack is the sentry's). Reply: `Reply::Ok`,
    /// then the connection carries the TCP connection's bytes, unframed, both ways until
    /// either side closes; or `Reply::Error` (`not_found`: nothing listens there).
    ConnectPort { port: u16 },
    /// Asks a `WatchDir` exchange for its events.
    WatchSync,
}

fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Started { id: u64, pid: i32 },
    Exited(ExitStatus),
}

/// How a command ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitStatus {
    pub id: u64,
    /// Exit code; for a signal death, 128 + signal (what a shell reports).
    pub exit_code: i32,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The per-command timeout ran out and the command's processes were killed.
    pub timed_out: bool,
    /// The sandbox's memory limit was hit while the command ran (a process was OOM-killed).
    pub oom_killed: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Bytes the command wrote, including any beyond the cap.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Pong { version: u32 },
    Ok,
    Error { code: ErrorCode, message: String },
    Commands { commands: Vec<CommandInfo> },
    FileInfo(FileInfo),
    Entries { entries: Vec<FileInfo> },
    FsEvents { events: Vec<FsEvent>, overflowed: bool },
    Usage(Usage),
}

/// Machine-readable failure kinds the agent reports; the daemon maps them to HTTP codes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    NotFound,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    NotEmpty,
    PermissionDenied,
    InvalidArgument,
    NoSpace,
    SpawnFailed,
    Protocol,
    Io,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommandInfo {
    pub id: u64,
    pub pid: i32,
    pub cmd: Command,
    pub cwd: Option<String>,
    pub running: bool,
    pub exit: Option<ExitStatus>,
    /// It runs on a pseudo-terminal (`ExecSpec::pty`).
    #[serde(default)]
    pub pty: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileInfo {
    /// Absolute path inside the sandbox.
    pub path: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FileType,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Where a symlink points (not followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A regular file's extended attributes in the `user.` namespace (full names; values
    /// that are not UTF-8 are shown lossily).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// One change seen by a `WatchDir`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FsEvent {
    /// Path relative to the watched directory.
    pub name: String,
    pub op: FsOp,
}

/// What happened to a name. A file the file API writes (a temp file renamed into place)
/// shows as `Create`, `Write`, `Chmod` when it is new and `Write` when it replaces one.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// A uid and gid inside the sandbox.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// Resource usage the agent sees from inside (the daemon reads cgroups for the rest).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
    pub processes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_shapes() {
        let r: Request = serde_json::from_str(r#"{"op":"exec","cmd":["echo","hi"]}"#).unwrap();
        match r {
            Request::Exec(s) => {
                assert_eq!(s.cmd, Command::Argv(vec!["echo".into(), "hi".into()]));
                assert_eq!(s.max_output_bytes, DEFAULT_MAX_OUTPUT);
            }
            other => panic!("parsed as {other:?}"),
        }
        let r: Request = serde_json::from_str(r#"{"op":"exec","cmd":"echo hi"}"#).unwrap();
        assert!(matches!(r, Request::Exec(ExecSpec { cmd: Command::Shell(_), .. })));
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","cmd":"x","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"nope"}"#).is_err());
    }

    #[test]
    fn pty_shapes() {
        let r: Request = serde_json::from_str(r#"{"op":"exec","cmd":["bash"],"pty":{"cols":80,"rows":24}}"#).unwrap();
        assert!(matches!(r, Request::Exec(ExecSpec { pty: Some(PtySize { cols: 80, rows: 24 }), .. })));
        let r: Request = serde_json::from_str(r#"{"op":"resize","id":3,"cols":100,"rows":40}"#).unwrap();
        assert_eq!(r, Request::Resize { id: 3, cols: 100, rows: 40 });
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","cmd":"x","pty":{"cols":-1,"rows":2}}"#).is_err());
        assert!(PtySize { cols: 1, rows: 1000 }.is_valid());
        assert!(!PtySize { cols: 0, rows: 24 }.is_valid());
        assert!(!PtySize { cols: 80, rows: 1001 }.is_valid());
    }
}
