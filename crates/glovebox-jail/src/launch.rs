//! Daemon side: starts the jailer (`<agent> jail`) for one sandbox and waits until its PID 1
//! is up. Blocking; the daemon calls it off its async runtime.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::JailConfig;
use crate::error::{Ctx, JailError, Result};

/// How long a jail may take to come up before the launch counts as failed.
pub const START_DEADLINE: Duration = Duration::from_secs(10);

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

fn read_until_eof(f: &mut impl ReadFd, deadline: Duration) -> Result<String> {
    let end = Instant::now() + deadline;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(JailError::Timeout(deadline.as_millis() as u64));
        }
        let mut pfd = libc::pollfd { fd: f.raw(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(JailError::sys("poll jailer status", e));
        }
        if r == 0 {
            continue;
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

trait ReadFd: Read {
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
}
