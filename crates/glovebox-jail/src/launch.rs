//! Daemon side: starts the jailer (`<agent> jail`) for one sandbox and waits until its PID 1
//! is up. Blocking; the daemon calls it off its async runtime.
//!
//! A [`Launcher`] keeps one fork server (`<agent> jail` with a socket as stdin,
//! [`crate::jailer::serve_forks`]) and has it fork each jailer: an exec of the agent binary
//! costs 0.6 ms on a 2-core VM, a fork of the small single-threaded server a fraction of it.
//! Without a working server it spawns the jailer directly ([`launch`]).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::JailConfig;
use crate::error::{Ctx, JailError, Result};

pub use crate::config::START_DEADLINE;

/// Starts a sandbox; returns the host pid of its PID 1 (the agent).
///
/// The jailer gets an empty environment and only stdin (config), stdout (status) and
/// stderr (`log`, the sandbox's agent log) — no other daemon fd crosses over.
pub fn launch(agent_exe: &Path, cfg: &JailConfig, log: File) -> Result<libc::pid_t> {
    let body = serde_json::to_vec(cfg).map_err(|e| JailError::Config(e.to_string()))?;
    // argv[0] is what the sandbox sees as PID 1's command line: no host path in it.
    let mut child = Command::new(agent_exe)
        .arg0("glovebox-agent")
        .arg("jail")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .ctx_at("spawn jailer", agent_exe)?;
    let mut stdin = child.stdin.take().ok_or_else(|| JailError::Reported("no stdin pipe".into()))?;
    let written = stdin.write_all(&body);
    drop(stdin);
    let mut out = child.stdout.take().ok_or_else(|| JailError::Reported("no stdout pipe".into()))?;
    let status = read_until_eof(&mut out, START_DEADLINE);
    let _ = child.wait();
    written.ctx("send jail config")?;
    let text = match status {
        Ok(t) => t,
        Err(e) => {
            let _ = child.kill();
            return Err(e);
        }
    };
    parse_status(&text)
}

/// How long a new fork server may take to say it is one.
const SERVER_HELLO_WAIT: Duration = Duration::from_secs(5);

/// Starts jailers through a fork server of its own, falling back to [`launch`].
pub struct Launcher {
    agent_exe: PathBuf,
    server: Mutex<Server>,
}

enum Server {
    /// Started, its hello not read yet (see [`Launcher::new`]).
    Starting(ForkServer),
    Running(ForkServer),
    /// Died or was stopped after it had worked: started again at the next launch.
    Gone,
    /// Did not start (or did not speak the protocol): never tried again, so that a binary
    /// that cannot serve costs each create nothing but the direct spawn.
    Off(String),
}

struct ForkServer {
    /// Our end of the request socket; the server exits when it closes.
    sock: OwnedFd,
    child: Spawned,
}

/// A child process started with `sys::spawn`, reaped at most once (its pid is never
/// signalled once reaped: it may be another process's by then).
struct Spawned {
    pid: libc::pid_t,
    reaped: bool,
}

impl Spawned {
    /// Whether it still runs (reaped here if it has ended).
    fn running(&mut self) -> bool {
        if !self.reaped && !matches!(crate::sys::waitpid(self.pid, libc::WNOHANG), Ok((0, _))) {
            self.reaped = true;
        }
        !self.reaped
    }

    fn kill_and_reap(&mut self) {
        if !self.reaped {
            let _ = crate::sys::kill(self.pid, libc::SIGKILL);
            let _ = crate::sys::waitpid(self.pid, 0);
            self.reaped = true;
        }
    }
}

impl ForkServer {
    fn spawn(agent_exe: &Path) -> Result<ForkServer> {
        ForkServer::start(agent_exe)?.hello()
    }

    /// Starts the process; [`ForkServer::hello`] checks it is a fork server.
    fn start(agent_exe: &Path) -> Result<ForkServer> {
        let (ours, theirs) = crate::sys::seqpacket_pair().ctx("fork server socket")?;
        // The same argv as a one-shot jailer: it becomes every sandbox's PID 1 command line.
        // Spawned, not forked: the daemon's address space is large (see `sys::spawn`).
        let pid = crate::sys::spawn(agent_exe, &["glovebox-agent", "jail"], theirs.as_fd())
            .ctx_at("spawn fork server", agent_exe)?;
        drop(theirs);
        Ok(ForkServer { sock: ours, child: Spawned { pid, reaped: false } })
    }

    fn hello(self) -> Result<ForkServer> {
        let server = self;
        // An agent binary that does not know the protocol would read the socket as a config
        // pipe and hang every jail sent to it: it must say it is a fork server first.
        let mut hello = [0u8; 64];
        let said =
            crate::sys::poll_in(server.sock.as_raw_fd(), SERVER_HELLO_WAIT.as_millis() as i32).and_then(|ready| {
                match ready {
                    true => crate::sys::recv_with_fds(server.sock.as_raw_fd(), &mut hello).map(|r| r.len),
                    false => Ok(0),
                }
            });
        match said {
            Ok(n) if &hello[..n] == crate::jailer::SERVER_READY => Ok(server),
            Ok(_) => {
                server.stop();
                Err(JailError::Reported("the agent binary did not start as a fork server".into()))
            }
            Err(e) => {
                server.stop();
                Err(JailError::sys("fork server hello", e))
            }
        }
    }

    fn stop(mut self) {
        drop(self.sock);
        // It exits at EOF; a kill covers one that cannot.
        self.child.kill_and_reap();
    }
}

impl Launcher {
    /// Starts the fork server now; if it cannot start, every launch spawns its jailer.
    /// Does not wait for it to be ready (its exec and start take a few milliseconds that the
    /// caller's own start-up can overlap): the first [`Launcher::server`] or launch does.
    pub fn new(agent_exe: &Path) -> Launcher {
        let server = match ForkServer::start(agent_exe) {
            Ok(s) => Server::Starting(s),
            Err(e) => Server::Off(e.to_string()),
        };
        Launcher { agent_exe: agent_exe.to_path_buf(), server: Mutex::new(server) }
    }

    /// The fork server's pid, or why there is none (waiting for a starting one's hello).
    pub fn server(&self) -> std::result::Result<u32, String> {
        match &*self.lock() {
            Server::Running(s) => Ok(s.child.pid as u32),
            // Not seen here: `lock` has read its hello.
            Server::Starting(_) => Err("starting".into()),
            Server::Gone => Err("stopped; started again at the next launch".into()),
            Server::Off(why) => Err(why.clone()),
        }
    }

    /// The server's state, a started one's hello read first.
    fn lock(&self) -> std::sync::MutexGuard<'_, Server> {
        let mut g = self.server.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*g, Server::Starting(_)) {
            if let Server::Starting(s) = std::mem::replace(&mut *g, Server::Gone) {
                *g = match s.hello() {
                    Ok(s) => Server::Running(s),
                    Err(e) => Server::Off(e.to_string()),
                };
            }
        }
        g
    }

    /// Starts a sandbox; returns the host pid of its PID 1 (the agent). Same contract as
    /// [`launch`].
    pub fn launch(&self, cfg: &JailConfig, log: File) -> Result<libc::pid_t> {
        let body = serde_json::to_vec(cfg).map_err(|e| JailError::Config(e.to_string()))?;
        let (status_r, status_w) = crate::sys::pipe().ctx("status pipe")?;
        if !self.request(&body, &status_w, &log) {
            return launch(&self.agent_exe, cfg, log);
        }
        // Ours must go for the read below to see EOF once the jailer's processes are done.
        drop(status_w);
        drop(log);
        // On a timeout the caller kills the sandbox's cgroups: A and PID 1 are in them, and so
        // is the jailer on v1; on v2 it is not (it clones A into the cgroup), and its alarm
        // ends it 5 s after this deadline (`jailer::run`).
        let text = read_until_eof(&mut File::from(status_r), START_DEADLINE)?;
        parse_status(&text)
    }

    /// Hands one jail to the fork server, restarting it if it is gone. False when no server
    /// can take it (the caller spawns the jailer itself).
    fn request(&self, body: &[u8], status: &OwnedFd, log: &File) -> bool {
        let mut server = self.lock();
        for _ in 0..2 {
            // A server that died cannot replace the children that wait for requests: a
            // request could wait on the socket for nobody. A new one gets a new socket.
            if let Server::Running(s) = &mut *server {
                if !s.child.running() {
                    if let Server::Running(old) = std::mem::replace(&mut *server, Server::Gone) {
                        old.stop();
                    }
                }
            }
            if let Server::Gone = &*server {
                *server = match ForkServer::spawn(&self.agent_exe) {
                    Ok(s) => Server::Running(s),
                    Err(e) => Server::Off(e.to_string()),
                };
            }
            let Server::Running(s) = &*server else { return false };
            if crate::sys::send_with_fds(s.sock.as_fd(), body, &[status.as_fd(), log.as_fd()]).is_ok() {
                return true;
            }
            if let Server::Running(old) = std::mem::replace(&mut *server, Server::Gone) {
                old.stop();
            }
        }
        false
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let mut g = self.server.lock().unwrap_or_else(|p| p.into_inner());
        if let Server::Running(s) | Server::Starting(s) = std::mem::replace(&mut *g, Server::Gone) {
            s.stop();
        }
    }
}

/// Interprets the jailer's status lines (any order: two processes write them).
fn parse_status(text: &str) -> Result<libc::pid_t> {
    let mut pid = None;
    let mut ready = false;
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("error: ") {
            return Err(JailError::Reported(e.to_string()));
        } else if let Some(p) = line.strip_prefix("pid ") {
            pid = p.trim().parse::<libc::pid_t>().ok();
        } else if line == "ready" {
            ready = true;
        }
    }
    match (pid, ready) {
        (Some(p), true) if p > 1 => Ok(p),
        _ => Err(JailError::Reported(format!("incomplete start: {:?}", text.trim()))),
    }
}

pub(crate) fn read_until_eof(f: &mut impl ReadFd, deadline: Duration) -> Result<String> {
    let end = Instant::now() + deadline;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(JailError::Timeout(deadline.as_millis() as u64));
        }
        match crate::sys::poll_in(f.raw(), left.as_millis().min(i32::MAX as u128) as i32) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(JailError::sys("poll jailer status", e)),
        }
        let n = f.read(&mut chunk).ctx("read jailer status")?;
        if n == 0 {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        if buf.len() < 64 * 1024 {
            buf.extend_from_slice(&chunk[..n]);
        }
    }
}

pub(crate) trait ReadFd: Read {
    fn raw(&self) -> i32;
}
impl<T: Read + AsRawFd> ReadFd for T {
    fn raw(&self) -> i32 {
        self.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_in_any_order() {
        assert_eq!(parse_status("ready\npid 42\n").unwrap(), 42);
        assert_eq!(parse_status("pid 42\nready\n").unwrap(), 42);
        assert!(parse_status("pid 42\n").is_err());
        assert!(parse_status("pid 42\nerror: mount overlay /x: EPERM\nready\n").is_err());
        assert!(parse_status("").is_err());
        assert!(parse_status("pid 1\nready\n").is_err());
    }

    #[test]
    fn a_binary_that_exits_is_not_taken_for_a_fork_server() {
        let l = Launcher::new(Path::new("/bin/true"));
        let why = l.server().expect_err("true is no fork server");
        assert!(why.contains("did not start as a fork server"), "{why}");
        // Off for good: asking again does not start it again.
        assert_eq!(l.server().unwrap_err(), why);
    }

    #[test]
    fn a_silent_binary_is_given_up_on_and_does_not_outlive_the_attempt() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = dir.path().join("silent");
        std::fs::write(&script, format!("#!/bin/sh\necho $$ > {}\nexec sleep 30\n", pidfile.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let t = Instant::now();
        let l = Launcher::new(&script);
        assert!(l.server().is_err(), "a silent process is no fork server");
        assert!(t.elapsed() >= SERVER_HELLO_WAIT, "it was waited for: {:?}", t.elapsed());
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        assert!(!Path::new(&format!("/proc/{}", pid.trim())).exists(), "the silent process {pid} was left running");
    }
}
