//! Commands: spawn, stream, cap, time out, kill, reap.
//!
//! Invariants:
//! - Every command runs in its own session and its own child cgroup, so a timeout or kill
//!   reaches every process it spawned, including ones that left the process group.
//! - At most `max_output_bytes` per stream is kept (and sent); the rest is read and counted,
//!   never buffered. Attaching replays what was kept, then follows live.
//! - When a command's main process ends, whatever it left behind gets a short grace to
//!   finish writing, then its cgroup is killed: a finished command leaves no process.
//! - PID 1 reaps every child; exits of unknown (orphaned) pids are discarded.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glovebox_jail::cgroup::KillMethod;
use glovebox_jail::child::ChildSetup;
use glovebox_proto::agent::{Command, CommandInfo, ErrorCode, Event, ExecSpec, ExitStatus, Reply, Request, Usage};
use glovebox_proto::frame::Kind;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, watch};

use crate::conn::{ConnError, Reader, Writer};

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
    cgroup: Option<(OwnedFd, KillMethod)>,
    seccomp: Arc<seccompiler::BpfProgram>,
    home: String,
}

#[derive(Default)]
struct Reaper {
    waiting: HashMap<i32, oneshot::Sender<rustix::process::WaitStatus>>,
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
}

struct State {
    chunks: Vec<(Kind, Arc<[u8]>)>,
    kept: [u64; 2],
    total: [u64; 2],
    cap: u64,
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
            st.total[i] += bytes.len() as u64;
            let room = st.cap.saturating_sub(st.kept[i]) as usize;
            if room == 0 {
                return;
            }
            let keep = &bytes[..bytes.len().min(room)];
            st.kept[i] += keep.len() as u64;
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
        }
    }
}

impl Exec {
    pub fn start(
        cgroup: Option<(OwnedFd, KillMethod)>,
        seccomp: Arc<seccompiler::BpfProgram>,
        home: &str,
    ) -> std::io::Result<Exec> {
        let inner = Arc::new(Inner {
            cmds: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            reaper: Mutex::new(Reaper::default()),
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
        Ok(Exec(inner))
    }

    fn get(&self, id: u64) -> Option<Arc<Cmd>> {
        lock(&self.0.cmds).get(&id).cloned()
    }

    /// `Request::Exec`: start, then (unless background) stream until exit.
    pub async fn run(&self, spec: ExecSpec, mut r: Reader, mut w: Writer) -> Result<(), ConnError> {
        let want_stdin = spec.stdin;
        let background = spec.background;
        let cmd = match self.spawn(spec) {
            Ok(c) => c,
            Err(SpawnError::Reply(code, msg)) => return w.error(code, msg).await,
        };
        w.json(&Event::Started { id: cmd.id, pid: cmd.pid }).await?;
        if background {
            return w.flush().await;
        }
        if want_stdin {
            let c = cmd.clone();
            tokio::spawn(async move {
                let _ = feed_stdin(&c, &mut r, true).await;
            });
        }
        stream(&cmd, &mut w).await
    }

    fn spawn(&self, spec: ExecSpec) -> Result<Arc<Cmd>, SpawnError> {
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
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        self.evict();
        let cwd = spec.cwd.clone().unwrap_or_else(|| self.0.home.clone());

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
        let setup = Arc::new(ChildSetup {
            cgroup_procs: procs,
            uid,
            gid: spec.gid.unwrap_or(uid),
            seccomp: Some(self.0.seccomp.clone()),
        });
        let mut c = std::process::Command::new(&argv[0]);
        c.args(&argv[1..])
            .env_clear()
            .env("PATH", PATH)
            .env("HOME", &self.0.home)
            .env("LANG", "C.UTF-8")
            .env("USER", if uid == 0 { "root" } else { "user" })
            .envs(&spec.env)
            .current_dir(&cwd)
            .stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned = glovebox_jail::child::spawn(&mut c, setup);
        let (tx, rx) = oneshot::channel();
        let (version, _) = watch::channel(0u64);
        let mk = |pid: i32| {
            Arc::new(Cmd {
                id,
                pid,
                cmd: spec.cmd.clone(),
                cwd: Some(cwd.clone()),
                cgroup_dir: cgroup_dir.clone(),
                st: Mutex::new(State {
                    chunks: Vec::new(),
                    kept: [0, 0],
                    total: [0, 0],
                    cap: spec.max_output_bytes,
                    exit: None,
                }),
                version: version.clone(),
                stdin: tokio::sync::Mutex::new(None),
                started: Instant::now(),
            })
        };
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
                let cmd = mk(0);
                cmd.push(Kind::Stderr, format!("glovebox: {what}: {e}\n").as_bytes());
                let base = status_of(&cmd);
                lock(&cmd.st).exit = Some(ExitStatus { id, exit_code: code, ..base });
                lock(&self.0.cmds).insert(id, cmd.clone());
                return Ok(cmd);
            }
        };
        let pid = child.id() as i32;
        // Registered before any await: the reaper cannot have seen this pid yet.
        lock(&self.0.reaper).waiting.insert(pid, tx);
        let cmd = mk(pid);
        lock(&self.0.cmds).insert(id, cmd.clone());

        let mut readers = Vec::new();
        for (kind, fd) in [
            (Kind::Stdout, child.stdout.take().map(OwnedFd::from)),
            (Kind::Stderr, child.stderr.take().map(OwnedFd::from)),
        ] {
            let Some(fd) = fd else { continue };
            let c = cmd.clone();
            readers.push(tokio::spawn(async move {
                let Ok(mut rx) = pipe_rx(fd) else { return };
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match rx.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => c.push(kind, &buf[..n]),
                    }
                }
            }));
        }
        if let Some(fd) = child.stdin.take().map(OwnedFd::from) {
            if let Ok(tx) = pipe::Sender::from_owned_fd(nonblocking(fd)) {
                if let Ok(mut g) = cmd.stdin.try_lock() {
                    *g = Some(tx);
                }
            }
        }
        drop(child); // never waited through std: the reaper owns exit statuses

        let timeout = spec.timeout_ms.filter(|t| *t > 0).map(Duration::from_millis);
        let this = self.clone();
        let c = cmd.clone();
        tokio::spawn(async move { this.supervise(c, rx, readers, timeout).await });
        Ok(cmd)
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
        if !self.tree_empty(&cmd) {
            self.kill_tree(&cmd).await;
        }
        if let Some(d) = &cmd.cgroup_dir {
            let d = d.clone();
            let _ = tokio::task::spawn_blocking(move || glovebox_jail::cgroup::remove_tree(&d)).await;
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
            let base = status_of_state(&st, cmd.id, cmd.started);
            st.exit = Some(ExitStatus { exit_code, signal, timed_out, ..base });
        }
        cmd.bump();
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

    pub async fn attach(&self, id: u64, w: &mut Writer) -> Result<(), ConnError> {
        match self.get(id) {
            Some(c) => stream(&c, w).await,
            None => w.error(ErrorCode::NotFound, format!("no command {id}")).await,
        }
    }

    pub async fn signal(&self, id: u64, signal: i32, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        if lock(&c.st).exit.is_some() {
            return w.json(&Reply::Ok).await;
        }
        if signal == libc::SIGKILL {
            self.kill_tree(&c).await;
            return w.json(&Reply::Ok).await;
        }
        let Some(sig) = rustix::process::Signal::from_named_raw(signal) else {
            return w.error(ErrorCode::InvalidArgument, format!("bad signal {signal}")).await;
        };
        if let Some(p) = rustix::process::Pid::from_raw(c.pid) {
            let _ = rustix::process::kill_process_group(p, sig);
        }
        w.json(&Reply::Ok).await
    }

    pub async fn stdin(&self, id: u64, r: &mut Reader, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        match feed_stdin(&c, r, false).await {
            Ok(()) => w.json(&Reply::Ok).await,
            Err(e) => w.error(ErrorCode::Io, format!("stdin: {e}")).await,
        }
    }

    pub async fn close_stdin(&self, id: u64, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        *c.stdin.lock().await = None;
        w.json(&Reply::Ok).await
    }

    pub async fn list(&self, w: &mut Writer) -> Result<(), ConnError> {
        let mut commands: Vec<CommandInfo> = lock(&self.0.cmds).values().map(|c| c.info()).collect();
        commands.sort_by_key(|c| c.id);
        w.json(&Reply::Commands { commands }).await
    }

    pub async fn release(&self, id: u64, w: &mut Writer) -> Result<(), ConnError> {
        {
            let mut cmds = lock(&self.0.cmds);
            if cmds.get(&id).is_some_and(|c| lock(&c.st).exit.is_some()) {
                cmds.remove(&id);
            }
        }
        w.json(&Reply::Ok).await
    }

    pub async fn usage(&self, w: &mut Writer) -> Result<(), ConnError> {
        let mut u = Usage::default();
        if let Ok(s) = rustix::fs::statvfs("/") {
            u.disk_total_bytes = s.f_blocks * s.f_frsize;
            u.disk_used_bytes = (s.f_blocks - s.f_bfree) * s.f_frsize;
        }
        if let Ok(rd) = std::fs::read_dir("/proc") {
            u.processes = rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
                .count() as u64;
        }
        w.json(&Reply::Usage(u)).await
    }
}

enum SpawnError {
    Reply(ErrorCode, String),
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

fn status_of(cmd: &Cmd) -> ExitStatus {
    let st = lock(&cmd.st);
    status_of_state(&st, cmd.id, cmd.started)
}

fn status_of_state(st: &State, id: u64, started: Instant) -> ExitStatus {
    ExitStatus {
        id,
        exit_code: 0,
        signal: None,
        timed_out: false,
        oom_killed: false,
        stdout_truncated: st.total[0] > st.kept[0],
        stderr_truncated: st.total[1] > st.kept[1],
        stdout_bytes: st.total[0],
        stderr_bytes: st.total[1],
        duration_ms: started.elapsed().as_millis() as u64,
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
                if let Some(tx) = lock(&inner.reaper).waiting.remove(&pid.as_raw_nonzero().get()) {
                    let _ = tx.send(status);
                }
            }
            _ => return,
        }
    }
}
