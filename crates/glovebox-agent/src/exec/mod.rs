//! Commands: spawn, stream, cap, time out, kill, reap.
//!
//! Invariants:
//! - Every command runs in its own session and its own child cgroup, so a timeout or kill
//!   reaches every process it spawned, including ones that left the process group.
//! - At most `max_output_bytes` per stream is kept (and sent): the head live, the last
//!   `output_tail_bytes` (default half the cap) when the command ends, after a marker of the
//!   bytes dropped between them ([`crate::capped`]); the rest is read and counted, never
//!   buffered. Attaching replays what was kept, then follows live.
//! - When a command's main process ends, whatever it left behind gets a short grace to
//!   finish writing, then its cgroup is killed: a finished command leaves no process.
//! - PID 1 reaps every child; exits of unknown (orphaned) pids are discarded.
//! - A `pty` command runs on a pseudo-terminal the agent opens inside the sandbox (its own
//!   devpts instance): the slave is the command's stdio and controlling terminal, the agent
//!   keeps only the master and never holds the slave past the spawn, so the master reads
//!   end (EIO) once the command and everything it left on the terminal are gone.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glovebox_jail::cgroup::KillMethod;
use glovebox_jail::child::ChildSetup;
use glovebox_proto::agent::{
    Command, CommandInfo, ErrorCode, Event, ExecSpec, ExitStatus, PtySize, Reply, Request, Usage,
};
use glovebox_proto::frame::Kind;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, watch};

use crate::capped::Capped;
use crate::conn::{ConnError, Reader, Writer};

mod ops;
mod spares;

/// Finished commands kept for `Attach`/`List` before the oldest are forgotten.
const KEEP_FINISHED: usize = 64;
/// How long leftovers of a finished command may keep writing before they are killed.
const EXIT_GRACE: Duration = Duration::from_millis(200);
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Clone)]
pub struct Exec(Arc<Inner>);

struct Inner {
    cmds: Mutex<HashMap<u64, Arc<Cmd>>>,
    next: AtomicU64,
    reaper: Mutex<Reaper>,
    spare: Mutex<Vec<Spare>>,
    /// Empty command cgroups ready for reuse.
    free_cgroups: Mutex<Vec<PathBuf>>,
    refilling: std::sync::atomic::AtomicBool,
    /// Whether a command has started (spares kept: `SPARES`, else `SPARES_AT_BOOT`).
    busy: std::sync::atomic::AtomicBool,
    /// When the last foreground command's result went out (see `REFILL_QUIET`).
    last_end: Mutex<Instant>,
    /// The spares' zygote (see `zygote`); `None` until first needed, and after it failed.
    zygote: Mutex<Option<crate::zygote::Zygote>>,
    /// Zygotes started so far (a command can kill them; past a bound, spares are forked here).
    zygote_starts: std::sync::atomic::AtomicU32,
    cgroup: Option<(OwnedFd, KillMethod)>,
    seccomp: Arc<seccompiler::BpfProgram>,
    home: String,
}

#[derive(Default)]
struct Reaper {
    waiting: HashMap<i32, oneshot::Sender<rustix::process::WaitStatus>>,
    /// Exits of pids nobody registered yet (a spare spawned on another thread may exit
    /// before it is registered). Orphans land here too, so it is bounded.
    early: HashMap<i32, rustix::process::WaitStatus>,
}

/// Spares kept ready (see `spare`) once a command has run: enough for a burst of commands.
const SPARES: usize = 2;

/// Spares made ready at boot, before any command: one, for the first command. Each process
/// a sandbox keeps is a task on the host, and the kernel's `pivot_root` (every sandbox's
/// create) visits every task on the host: a sandbox nobody runs a command in costs every
/// later create a little less with one spare than with two (docs/benchmarks.md, "Shards made
/// as needed, and fewer tasks per sandbox"). The second comes with the first command's refill.
const SPARES_AT_BOOT: usize = 1;

/// How long a foreground command runs before its spare's replacement is made beside it.
const REFILL_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// How long after a foreground command's result its spare's replacement is made while
/// another spare waits, when the command came after a quiet spell. Made at once, the refill
/// competed with the daemon forwarding the result and the client taking it: an exec `true`
/// after 30–50 ms of quiet took 0.17–0.32 ms longer (p50 of paired differences,
/// docs/benchmarks.md).
const REFILL_QUIET: std::time::Duration = std::time::Duration::from_millis(2);

/// A foreground command that arrives this soon after the previous one's result has its
/// spare replaced at once: back to back, a deferred refill lands in the next command's
/// spawn instead, which measured 0.12 ms slower in two of three runs.
const BACK_TO_BACK: std::time::Duration = std::time::Duration::from_millis(5);

/// Empty command cgroups kept for reuse.
const FREE_CGROUPS: usize = 4;

/// Bound of `Reaper::early`.
const EARLY_MAX: usize = 1024;

/// A process waiting for its command (see `spare`).
struct Spare {
    id: u64,
    pid: i32,
    job: OwnedFd,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    cgroup_dir: Option<PathBuf>,
    exited: oneshot::Receiver<rustix::process::WaitStatus>,
    /// Its `/proc/PID/stat`, opened when it was made (see `doomed`).
    stat: Option<OwnedFd>,
}

struct Cmd {
    id: u64,
    pid: i32,
    cmd: Command,
    cwd: Option<String>,
    cgroup_dir: Option<PathBuf>,
    st: Mutex<State>,
    version: watch::Sender<u64>,
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    started: Instant,
    /// Session-mode output channel (`ExecSpec::raw`): nothing is kept; readers wait for room.
    raw: Option<Raw>,
    /// The master of a `pty` command's terminal (for its size and foreground group).
    pty: Option<OwnedFd>,
}

/// One chunk of a command's output.
type Chunk = (Kind, Arc<[u8]>);

struct Raw {
    /// Taken by the output readers when the command starts, so the channel closes once the
    /// last of them ends.
    tx: Mutex<Option<tokio::sync::mpsc::Sender<Chunk>>>,
    /// Held by the attached session for as long as it lasts.
    rx: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Chunk>>,
    /// Bumped by a session taking a terminal over from the one attached (see `session`).
    takeover: watch::Sender<u64>,
}

/// How long a new session of a terminal waits for the one it takes over from to let go.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);

/// Chunks buffered for a session with nobody attached before its command blocks on output.
const RAW_BACKLOG: usize = 64;

struct State {
    chunks: Vec<(Kind, Arc<[u8]>)>,
    out: [Capped; 2],
    exit: Option<ExitStatus>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock means a panic elsewhere in this single-purpose process; the state it
    // guards is still consistent for our uses (plain pushes and reads).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cmd {
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    fn push(&self, kind: Kind, bytes: &[u8]) {
        let i = if kind == Kind::Stdout { 0 } else { 1 };
        {
            let mut st = lock(&self.st);
            let keep = st.out[i].push(bytes);
            if keep.is_empty() {
                return;
            }
            st.chunks.push((kind, Arc::from(keep)));
        }
        self.bump();
    }

    fn info(&self) -> CommandInfo {
        let st = lock(&self.st);
        CommandInfo {
            id: self.id,
            pid: self.pid,
            cmd: self.cmd.clone(),
            cwd: self.cwd.clone(),
            running: st.exit.is_none(),
            exit: st.exit.clone(),
            pty: self.pty.is_some(),
        }
    }
}

impl Exec {
    pub fn start(
        cgroup: Option<(OwnedFd, KillMethod)>,
        seccomp: Arc<seccompiler::BpfProgram>,
        home: &str,
        zygote: Option<crate::zygote::Zygote>,
    ) -> std::io::Result<Exec> {
        let zygote_pid = zygote.as_ref().map(|z| z.pid);
        let inner = Arc::new(Inner {
            cmds: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            reaper: Mutex::new(Reaper::default()),
            spare: Mutex::new(Vec::new()),
            free_cgroups: Mutex::new(Vec::new()),
            refilling: std::sync::atomic::AtomicBool::new(false),
            busy: std::sync::atomic::AtomicBool::new(false),
            // The first command follows no other.
            last_end: Mutex::new(Instant::now().checked_sub(BACK_TO_BACK).unwrap_or_else(Instant::now)),
            zygote_starts: std::sync::atomic::AtomicU32::new(u32::from(zygote.is_some())),
            zygote: Mutex::new(zygote),
            cgroup,
            seccomp,
            home: home.to_string(),
        });
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let reap = inner.clone();
        tokio::spawn(async move {
            loop {
                reap_all(&reap);
                if sig.recv().await.is_none() {
                    return;
                }
            }
        });
        let exec = Exec(inner);
        if let Some(pid) = zygote_pid {
            exec.reap_and_forget(pid);
        }
        exec.refill_at_boot();
        Ok(exec)
    }

    fn get(&self, id: u64) -> Option<Arc<Cmd>> {
        lock(&self.0.cmds).get(&id).cloned()
    }

    /// `Request::Exec`: start, then (unless background) stream until exit.
    pub async fn run(&self, mut spec: ExecSpec, mut r: Reader, mut w: Writer) -> Result<(), ConnError> {
        if spec.pty.is_some() {
            spec.raw = true;
        }
        if spec.raw {
            spec.background = true;
            spec.stdin = true;
        }
        let want_stdin = spec.stdin;
        let background = spec.background;
        let started_at = Instant::now();
        let cmd = match self.spawn(spec).await {
            Ok(c) => c,
            Err(SpawnError::Reply(code, msg)) => return w.error(code, msg).await,
        };
        w.json(&Event::Started { id: cmd.id, pid: cmd.pid }).await?;
        if background {
            // Prepare the next command's spare now that this one is on its way.
            self.refill();
            return w.flush().await;
        }
        if want_stdin {
            let c = cmd.clone();
            tokio::spawn(async move {
                let _ = feed_stdin(&c, &mut r, true).await;
            });
        }
        // A short foreground command's replacement spare is made after its result is out:
        // forking and locking down a process beside it competes with it for the CPU and
        // delays its result (another spare is ready for a command arriving meanwhile). A
        // command still running after a moment gets its replacement made meanwhile.
        let this = self.clone();
        let early = tokio::spawn(async move {
            tokio::time::sleep(REFILL_AFTER).await;
            this.refill();
        });
        let r = stream(&cmd, &mut w).await;
        early.abort();
        // Not at once either after a quiet spell while another spare waits: the daemon is
        // still forwarding the result (see `REFILL_QUIET` and `BACK_TO_BACK`).
        let back_to_back = started_at.duration_since(*lock(&self.0.last_end)) < BACK_TO_BACK;
        *lock(&self.0.last_end) = Instant::now();
        if back_to_back || lock(&self.0.spare).is_empty() {
            self.refill();
        } else {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REFILL_QUIET).await;
                this.refill();
            });
        }
        r
    }

    fn new_cmd(&self, id: u64, pid: i32, spec: &ExecSpec, cwd: &str, cgroup_dir: Option<PathBuf>) -> Arc<Cmd> {
        let (version, _) = watch::channel(0u64);
        let (cap, tail) = (spec.max_output_bytes, spec.output_tail_bytes.unwrap_or(spec.max_output_bytes / 2));
        Arc::new(Cmd {
            id,
            pid,
            cmd: spec.cmd.clone(),
            cwd: Some(cwd.to_string()),
            cgroup_dir,
            st: Mutex::new(State {
                chunks: Vec::new(),
                out: [Capped::new(cap, tail), Capped::new(cap, tail)],
                exit: None,
            }),
            version,
            stdin: tokio::sync::Mutex::new(None),
            started: Instant::now(),
            raw: spec.raw.then(|| {
                let (tx, rx) = tokio::sync::mpsc::channel(RAW_BACKLOG);
                Raw { tx: Mutex::new(Some(tx)), rx: tokio::sync::Mutex::new(rx), takeover: watch::channel(0).0 }
            }),
            pty: None,
        })
    }

    /// The command's environment: defaults, then the request's variables.
    fn env_for(&self, spec: &ExecSpec, uid: u32) -> Vec<(String, String)> {
        let mut env: std::collections::BTreeMap<String, String> = [
            ("PATH", PATH),
            ("HOME", self.0.home.as_str()),
            ("LANG", "C.UTF-8"),
            ("USER", if uid == 0 { "root" } else { "user" }),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if spec.pty.is_some() {
            env.insert("TERM".into(), "xterm-256color".into());
        }
        env.extend(spec.env.clone());
        env.into_iter().collect()
    }

    async fn spawn(&self, spec: ExecSpec) -> Result<Arc<Cmd>, SpawnError> {
        let argv: Vec<String> = match &spec.cmd {
            Command::Argv(v) if v.is_empty() || v[0].is_empty() => {
                return Err(SpawnError::Reply(ErrorCode::InvalidArgument, "empty command".into()))
            }
            Command::Argv(v) => v.clone(),
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        };
        if argv.iter().any(|a| a.contains('\0'))
            || spec.env.iter().any(|(k, v)| k.contains(['\0', '=']) || k.is_empty() || v.contains('\0'))
        {
            return Err(SpawnError::Reply(ErrorCode::InvalidArgument, "nul byte or bad name in command or env".into()));
        }
        // A guest's PID 1 runs with this real uid so commands cannot signal it: none may have it.
        if spec.uid == Some(glovebox_jail::guest::AGENT_UID) || spec.gid == Some(glovebox_jail::guest::AGENT_UID) {
            return Err(SpawnError::Reply(ErrorCode::InvalidArgument, "that uid is reserved for the agent".into()));
        }
        self.evict();
        self.0.busy.store(true, Ordering::Relaxed);
        let cwd = spec.cwd.clone().unwrap_or_else(|| self.0.home.clone());
        let uid = spec.uid.unwrap_or(0);
        let env = self.env_for(&spec, uid);
        if let Some(size) = spec.pty {
            if !size.is_valid() {
                return Err(SpawnError::Reply(
                    ErrorCode::InvalidArgument,
                    format!("terminal size must be 1..={} each way", PtySize::MAX),
                ));
            }
        }
        // Spares come with pipes for stdio; a terminal command takes the plain path.
        if uid == 0 && spec.gid.unwrap_or(0) == 0 && spec.pty.is_none() {
            // A spare a command killed may not have died yet: then the next one is tried.
            for _ in 0..SPARES {
                let Some(sp) = self.live_spare() else { break };
                match self.start_on_spare(sp, &argv, &env, &cwd, &spec) {
                    Ok(cmd) => return Ok(cmd),
                    Err(e) => eprintln!("agent: spare unusable: {e}"),
                }
            }
        }
        self.spawn_direct(argv, env, cwd, spec)
    }

    /// Starts a command the plain way (fork, join its cgroup, exec) on this thread.
    fn spawn_direct(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
        spec: ExecSpec,
    ) -> Result<Arc<Cmd>, SpawnError> {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        let (cgroup_dir, procs) = match &self.0.cgroup {
            Some((fd, _)) => {
                let dir = PathBuf::from(format!("/proc/self/fd/{}/cmd-{id}", raw(fd)));
                std::fs::create_dir(&dir)
                    .map_err(|e| SpawnError::Reply(ErrorCode::SpawnFailed, format!("command cgroup: {e}")))?;
                match std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs")) {
                    Ok(f) => (Some(dir), Some(OwnedFd::from(f))),
                    Err(e) => {
                        let _ = std::fs::remove_dir(&dir);
                        return Err(SpawnError::Reply(ErrorCode::SpawnFailed, format!("command cgroup: {e}")));
                    }
                }
            }
            None => (None, None),
        };
        let uid = spec.uid.unwrap_or(0);
        let gid = spec.gid.unwrap_or(uid);
        let setup = Arc::new(ChildSetup {
            cgroup_procs: procs,
            uid,
            gid,
            seccomp: Some(self.0.seccomp.clone()),
            ctty: spec.pty.is_some(),
        });
        let mut c = std::process::Command::new(&argv[0]);
        c.args(&argv[1..]).env_clear().envs(env.iter().map(|(k, v)| (k, v))).current_dir(&cwd);
        let master = match spec.pty {
            Some(size) => {
                let opened = open_pty(size, uid, gid).and_then(|(master, slave)| {
                    c.stdin(Stdio::from(slave.try_clone()?)).stdout(Stdio::from(slave.try_clone()?)).stderr(slave);
                    Ok(master)
                });
                match opened {
                    Ok(m) => Some(m),
                    Err(e) => {
                        if let Some(d) = &cgroup_dir {
                            let _ = std::fs::remove_dir(d);
                        }
                        return Err(SpawnError::Reply(ErrorCode::SpawnFailed, format!("terminal: {e}")));
                    }
                }
            }
            None => {
                c.stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                None
            }
        };
        let spawned = glovebox_jail::child::spawn(&mut c, setup, None);
        // The command holds the slave's copies of the terminal now; the agent keeps none, or
        // the master would never see the terminal's end.
        drop(c);
        let mut child = match spawned {
            Ok(ch) => ch,
            Err(e) => {
                if let Some(d) = &cgroup_dir {
                    let _ = std::fs::remove_dir(d);
                }
                // Like a shell: 127 for a missing program or directory, 126 if not executable.
                let code = match e.kind() {
                    std::io::ErrorKind::NotFound => 127,
                    std::io::ErrorKind::PermissionDenied => 126,
                    _ => return Err(SpawnError::Reply(ErrorCode::SpawnFailed, format!("{}: {e}", argv[0]))),
                };
                let what = if std::path::Path::new(&cwd).is_dir() { argv[0].clone() } else { format!("cwd {cwd}") };
                let cmd = self.new_cmd(id, 0, &spec, &cwd, None);
                let msg = format!("glovebox: {what}: {e}\n");
                cmd.push(Kind::Stderr, msg.as_bytes());
                // A session reads no kept output: the message goes to it, and the channel ends.
                if let Some(tx) = cmd.raw.as_ref().and_then(|r| lock(&r.tx).take()) {
                    let _ = tx.try_send((Kind::Stderr, Arc::from(msg.as_bytes())));
                }
                {
                    let mut st = lock(&cmd.st);
                    end_output(&mut st);
                    let base = status_of_state(&st, id, cmd.started);
                    st.exit = Some(ExitStatus { id, exit_code: code, ..base });
                }
                lock(&self.0.cmds).insert(id, cmd.clone());
                return Ok(cmd);
            }
        };
        let pid = child.id() as i32;
        let (tx, rx) = oneshot::channel();
        // On this (the runtime's) thread, before any await: the reaper cannot have run yet.
        self.register(pid, tx);
        if let Some(master) = master {
            drop(child);
            return self.track_pty(id, pid, master, &spec, &cwd, cgroup_dir, rx);
        }
        let cmd = self.new_cmd(id, pid, &spec, &cwd, cgroup_dir);
        lock(&self.0.cmds).insert(id, cmd.clone());
        let fds = (child.stdout.take(), child.stderr.take(), child.stdin.take());
        drop(child); // never waited through std: the reaper owns exit statuses
        let (Some(o), Some(e)) = (fds.0, fds.1) else {
            return Err(SpawnError::Reply(ErrorCode::SpawnFailed, "no output pipes".into()));
        };
        self.track(&cmd, OwnedFd::from(o), OwnedFd::from(e), fds.2.map(OwnedFd::from), rx, &spec);
        Ok(cmd)
    }

    /// Wires a started terminal command: one reader on the master (all output is stdout),
    /// stdin written to the master, and its supervisor.
    #[allow(clippy::too_many_arguments)]
    fn track_pty(
        &self,
        id: u64,
        pid: i32,
        master: OwnedFd,
        spec: &ExecSpec,
        cwd: &str,
        cgroup_dir: Option<PathBuf>,
        exited: oneshot::Receiver<rustix::process::WaitStatus>,
    ) -> Result<Arc<Cmd>, SpawnError> {
        let copies = (|| Ok::<_, std::io::Error>((master.try_clone()?, master.try_clone()?)))();
        let (out, input) = match copies {
            Ok(c) => c,
            Err(e) => {
                // The command runs already: end it rather than leave it without a terminal end.
                if let Some(p) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
                }
                return Err(SpawnError::Reply(ErrorCode::SpawnFailed, format!("terminal: {e}")));
            }
        };
        let mut cmd = self.new_cmd(id, pid, spec, cwd, cgroup_dir);
        if let Some(c) = Arc::get_mut(&mut cmd) {
            c.pty = Some(master);
        }
        lock(&self.0.cmds).insert(id, cmd.clone());
        let tx = cmd.raw.as_ref().and_then(|r| lock(&r.tx).take());
        let reader = tokio::spawn(async move {
            // A pseudo-terminal master is a pollable stream like a pipe's end (the tokio
            // type only checks for a FIFO in its checked constructor).
            let Ok(mut rx) = pipe::Receiver::from_owned_fd_unchecked(nonblocking(out)) else { return };
            let Some(tx) = tx else { return };
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match rx.read(&mut buf).await {
                    // EIO: every holder of the slave is gone.
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send((Kind::Stdout, Arc::from(&buf[..n]))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        if let Ok(w) = pipe::Sender::from_owned_fd_unchecked(nonblocking(input)) {
            if let Ok(mut g) = cmd.stdin.try_lock() {
                *g = Some(w);
            }
        }
        let timeout = spec.timeout_ms.filter(|t| *t > 0).map(Duration::from_millis);
        let this = self.clone();
        let c = cmd.clone();
        tokio::spawn(async move { this.supervise(c, exited, vec![reader], timeout).await });
        Ok(cmd)
    }

    /// Wires a started command's pipes and its supervisor.
    fn track(
        &self,
        cmd: &Arc<Cmd>,
        stdout: OwnedFd,
        stderr: OwnedFd,
        stdin: Option<OwnedFd>,
        exited: oneshot::Receiver<rustix::process::WaitStatus>,
        spec: &ExecSpec,
    ) {
        let mut readers = Vec::new();
        let raw_tx = cmd.raw.as_ref().and_then(|r| lock(&r.tx).take());
        for (kind, fd) in [(Kind::Stdout, stdout), (Kind::Stderr, stderr)] {
            let c = cmd.clone();
            let raw_tx = raw_tx.clone();
            readers.push(tokio::spawn(async move {
                let Ok(mut rx) = pipe_rx(fd) else { return };
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match rx.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => match &raw_tx {
                            Some(tx) => {
                                if tx.send((kind, Arc::from(&buf[..n]))).await.is_err() {
                                    return;
                                }
                            }
                            None => c.push(kind, &buf[..n]),
                        },
                    }
                }
            }));
        }
        if let Some(fd) = stdin {
            if let Ok(tx) = pipe::Sender::from_owned_fd(nonblocking(fd)) {
                if let Ok(mut g) = cmd.stdin.try_lock() {
                    *g = Some(tx);
                }
            }
        }
        let timeout = spec.timeout_ms.filter(|t| *t > 0).map(Duration::from_millis);
        let this = self.clone();
        let c = cmd.clone();
        tokio::spawn(async move { this.supervise(c, exited, readers, timeout).await });
    }

    async fn supervise(
        &self,
        cmd: Arc<Cmd>,
        exited: oneshot::Receiver<rustix::process::WaitStatus>,
        readers: Vec<tokio::task::JoinHandle<()>>,
        timeout: Option<Duration>,
    ) {
        let mut timed_out = false;
        let mut exited = exited;
        let status = match timeout {
            Some(t) => match tokio::time::timeout(t, &mut exited).await {
                Ok(s) => s.ok(),
                Err(_) => {
                    timed_out = true;
                    self.kill_tree(&cmd).await;
                    exited.await.ok()
                }
            },
            None => exited.await.ok(),
        };
        // Leftovers may hold the pipes open: give them a moment, then end them all.
        let _ = tokio::time::timeout(EXIT_GRACE, futures_join(readers)).await;
        let mut empty = self.tree_empty(&cmd);
        if !empty {
            self.kill_tree(&cmd).await;
            empty = self.tree_empty(&cmd);
        }
        *cmd.stdin.lock().await = None;
        let (exit_code, signal) = match status {
            Some(s) => match (s.exit_status(), s.terminating_signal()) {
                (Some(c), _) => (c, None),
                (None, Some(sig)) => (128 + sig, Some(sig)),
                _ => (255, None),
            },
            None => (255, None),
        };
        {
            let mut st = lock(&cmd.st);
            end_output(&mut st);
            let base = status_of_state(&st, cmd.id, cmd.started);
            st.exit = Some(ExitStatus { exit_code, signal, timed_out, ..base });
        }
        cmd.bump();
        // After the reply: an emptied cgroup is kept for the next spare (rmdir and mkdir of a
        // cgroup cost milliseconds), or removed in the background.
        if let Some(d) = &cmd.cgroup_dir {
            let keep = empty && {
                let mut free = lock(&self.0.free_cgroups);
                free.len() < FREE_CGROUPS && {
                    free.push(d.clone());
                    true
                }
            };
            if !keep {
                let d = d.clone();
                tokio::task::spawn_blocking(move || glovebox_jail::cgroup::remove_tree(&d));
            }
        }
    }

    /// Kills every process of the command (its cgroup, or its process group without one).
    async fn kill_tree(&self, cmd: &Cmd) {
        match (&cmd.cgroup_dir, &self.0.cgroup) {
            (Some(d), Some((_, m))) => {
                let (d, m) = (d.clone(), *m);
                let _ = tokio::task::spawn_blocking(move || glovebox_jail::cgroup::kill_tree(&d, m)).await;
            }
            _ => {
                if let Some(p) = rustix::process::Pid::from_raw(cmd.pid) {
                    let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
                }
            }
        }
    }

    /// Whether the command's cgroup has no process left (without a cgroup: unknown, so no).
    fn tree_empty(&self, cmd: &Cmd) -> bool {
        match &cmd.cgroup_dir {
            Some(d) => std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty()),
            None => false,
        }
    }

    fn evict(&self) {
        let mut cmds = lock(&self.0.cmds);
        let mut done: Vec<u64> = cmds.values().filter(|c| lock(&c.st).exit.is_some()).map(|c| c.id).collect();
        if done.len() <= KEEP_FINISHED {
            return;
        }
        done.sort_unstable();
        for id in &done[..done.len() - KEEP_FINISHED] {
            cmds.remove(id);
        }
    }
}

enum SpawnError {
    Reply(ErrorCode, String),
}

/// Whether process `pid` can no longer take a job: gone, a zombie, exiting, or with a SIGKILL
/// pending. A spare killed by a command (same uid) gets its SIGKILL at once but may wait for a
/// CPU to act on it — milliseconds on a busy machine — and a job written to it meanwhile would
/// be lost with it. The kill is pending from the moment `kill(2)` returns in the killer until
/// the victim starts exiting, and `PF_EXITING` is set from then on, so a kill sent by a command
/// that has ended is always seen (a thread-directed kill leaves a window of a few instructions
/// while the victim itself runs). `stat` is the process's `/proc/PID/stat`, opened ahead: one
/// read regenerates it (a fresh open and read of it costs several times more), and once the
/// process is reaped the read fails instead of reaching another process under the same pid.
fn doomed(stat: &OwnedFd) -> bool {
    let mut buf = [0u8; 1024];
    match rustix::io::pread(stat, &mut buf, 0) {
        Ok(n) => stat_doomed(&buf[..n]),
        Err(_) => true,
    }
}

/// `doomed` on the text of `/proc/PID/stat`; unparsable counts as doomed.
fn stat_doomed(stat: &[u8]) -> bool {
    const PF_EXITING: u64 = 0x4;
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    // After the command name (which may hold anything, `)` included): state is field 3,
    // flags field 9, the pending-signal mask field 31.
    let Some(end) = stat.iter().rposition(|&b| b == b')') else { return true };
    let fields: Vec<&[u8]> = stat[end + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty()).collect();
    let num = |i: usize| fields.get(i).and_then(|f| std::str::from_utf8(f).ok()?.trim().parse::<u64>().ok());
    let (Some(state), Some(flags), Some(pending)) = (fields.first(), num(6), num(28)) else { return true };
    matches!(state, [b'Z' | b'X' | b'x']) || flags & PF_EXITING != 0 || pending & SIGKILL_BIT != 0
}

/// A new pseudo-terminal of `size` in the sandbox's devpts: (master, slave), both
/// close-on-exec and neither a controlling terminal of the agent; the slave is handed to
/// `uid`/`gid` (as `grantpt` would) so a command run as another user owns its terminal.
fn open_pty(size: PtySize, uid: u32, gid: u32) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::fs::{FileType, Mode, OFlags};
    use rustix::pty::OpenptFlags;
    // The multiplexer of the sandbox's own devpts, not `/dev/ptmx`: `/dev` is writable by
    // the sandbox's root, so that name could be made to lead anywhere; `/dev/pts` is a mount
    // point nothing in the sandbox can move, and devpts holds no link. Checked anyway.
    let master = rustix::fs::open(
        "/dev/pts/ptmx",
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&master)?;
    let dev = st.st_rdev;
    if FileType::from_raw_mode(st.st_mode) != FileType::CharacterDevice
        || (rustix::fs::major(dev), rustix::fs::minor(dev)) != (5, 2)
    {
        return Err(std::io::Error::other("/dev/pts/ptmx is not the terminal multiplexer"));
    }
    rustix::pty::unlockpt(&master)?;
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    // Opened through the master, not by its /dev/pts path: no name lookup to race.
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags)?;
    if uid != 0 || gid != 0 {
        rustix::fs::fchown(&slave, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))?;
    }
    set_size(&master, size)?;
    Ok((master, slave))
}

fn set_size(master: &OwnedFd, size: PtySize) -> std::io::Result<()> {
    let ws = rustix::termios::Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    Ok(rustix::termios::tcsetwinsize(master, ws)?)
}

fn raw(fd: &OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

fn nonblocking(fd: OwnedFd) -> OwnedFd {
    if let Ok(fl) = rustix::fs::fcntl_getfl(fd.as_fd()) {
        let _ = rustix::fs::fcntl_setfl(fd.as_fd(), fl | rustix::fs::OFlags::NONBLOCK);
    }
    fd
}

fn pipe_rx(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(nonblocking(fd))
}

async fn futures_join(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

fn status_of_state(st: &State, id: u64, started: Instant) -> ExitStatus {
    ExitStatus {
        id,
        exit_code: 0,
        signal: None,
        timed_out: false,
        oom_killed: false,
        stdout_truncated: st.out[0].total() > st.out[0].kept(),
        stderr_truncated: st.out[1].total() > st.out[1].kept(),
        stdout_bytes: st.out[0].total(),
        stderr_bytes: st.out[1].total(),
        duration_ms: started.elapsed().as_millis() as u64,
    }
}

/// Appends each stream's end (its tail, after the marker if bytes were dropped) to the kept
/// output; in the same critical section as the exit status, so every reader sees the tail
/// before `Exited`.
fn end_output(st: &mut State) {
    for (i, kind) in [(0, Kind::Stdout), (1, Kind::Stderr)] {
        let end = st.out[i].finish();
        if !end.is_empty() {
            st.chunks.push((kind, Arc::from(end)));
        }
    }
}

/// Streams a command's kept output from the start, then live, then its exit.
async fn stream(cmd: &Cmd, w: &mut Writer) -> Result<(), ConnError> {
    let mut rx = cmd.version.subscribe();
    let mut sent = 0usize;
    loop {
        let (chunks, exit) = {
            let st = lock(&cmd.st);
            (st.chunks[sent..].to_vec(), st.exit.clone())
        };
        sent += chunks.len();
        for (k, b) in chunks {
            w.data(k, &b).await?;
        }
        if let Some(e) = exit {
            w.json(&Event::Exited(e)).await?;
            return w.flush().await;
        }
        if rx.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Copies stdin frames from the connection into the command until it is closed or ended.
/// `inline` = inside the Exec exchange (the connection ending closes stdin too).
async fn feed_stdin(cmd: &Cmd, r: &mut Reader, inline: bool) -> Result<(), ConnError> {
    loop {
        match r.next().await? {
            None => {
                if inline {
                    *cmd.stdin.lock().await = None;
                }
                return Ok(());
            }
            Some((Kind::Stdin, bytes)) => {
                let mut g = cmd.stdin.lock().await;
                if let Some(tx) = g.as_mut() {
                    if tx.write_all(&bytes).await.is_err() {
                        // The command closed its stdin (or exited): drop the rest.
                        *g = None;
                    }
                }
            }
            Some((Kind::Json, body)) => match serde_json::from_slice::<Request>(&body) {
                Ok(Request::CloseStdin { .. }) => {
                    *cmd.stdin.lock().await = None;
                    return Ok(());
                }
                Ok(Request::EndStdin) => return Ok(()),
                _ => return Ok(()),
            },
            Some(_) => return Ok(()),
        }
    }
}

fn reap_all(inner: &Inner) {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => {
                let pid = pid.as_raw_nonzero().get();
                let mut r = lock(&inner.reaper);
                match r.waiting.remove(&pid) {
                    Some(tx) => {
                        let _ = tx.send(status);
                    }
                    None => {
                        if r.early.len() >= EARLY_MAX {
                            r.early.clear();
                        }
                        r.early.insert(pid, status);
                    }
                }
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc/PID/stat` line with the given state, flags and pending signals.
    fn stat(comm: &str, state: char, flags: u64, pending: u64) -> Vec<u8> {
        let mut f: Vec<String> = vec![state.to_string(), "1".into(), "7".into(), "7".into(), "0".into(), "-1".into()];
        f.push(flags.to_string());
        f.extend((10..31).map(|i| i.to_string()));
        f.push(pending.to_string());
        f.extend((32..53).map(|_| "0".to_string()));
        format!("7 ({comm}) {}\n", f.join(" ")).into_bytes()
    }

    #[test]
    fn a_waiting_spare_is_fit_and_a_killed_or_exiting_one_is_not() {
        assert!(!stat_doomed(&stat("glovebox-agent", 'S', 0x40_0100, 0)));
        assert!(!stat_doomed(&stat("glovebox-agent", 'R', 0x40_0100, 1 << (libc::SIGTERM - 1))));
        assert!(stat_doomed(&stat("glovebox-agent", 'S', 0x40_0100, 1 << (libc::SIGKILL - 1))));
        assert!(stat_doomed(&stat("glovebox-agent", 'R', 0x40_0104, 0)));
        assert!(stat_doomed(&stat("glovebox-agent", 'Z', 0x40_0100, 0)));
        assert!(stat_doomed(&stat("glovebox-agent", 'X', 0, 0)));
        // A name made to look like other fields changes nothing.
        assert!(!stat_doomed(&stat("a) Z 1 1 1 0 -1 4 (b", 'S', 0, 0)));
        assert!(stat_doomed(b"7 (truncated) S 1 7"));
        assert!(stat_doomed(b"garbage"));
    }

    #[test]
    fn live_processes_are_read_from_proc() {
        let open = |pid: u32| OwnedFd::from(std::fs::File::open(format!("/proc/{pid}/stat")).unwrap());
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let stat = open(child.id());
        assert!(
            !doomed(&stat),
            "{}",
            String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/stat", child.id())).unwrap())
        );
        assert!(!doomed(&stat), "a second read sees the same");
        child.kill().unwrap();
        // Killed and not reaped yet: a zombie, or still exiting, or with its kill pending.
        // Between the kernel taking SIGKILL off the pending set and marking the task exiting
        // there is a window of a few instructions where the stat shows none of the three; a
        // loaded machine can stop the task right there, so allow it to move on (bounded).
        let t0 = std::time::Instant::now();
        while !doomed(&stat) && t0.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(doomed(&stat));
        child.wait().unwrap();
        assert!(doomed(&stat), "a reaped process is gone");
        assert!(!doomed(&open(std::process::id())));
    }
}
