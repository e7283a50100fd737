//! Commands in a sandbox as Modal names them: an `exec` is named by the client (a UUID, also
//! its idempotency key) and is one background agent command; a sandbox's entrypoint (the
//! args of `Sandbox.create`) is one too, under the empty name, and its exit ends the sandbox.
//! Output is read through `ops::attach` (what the agent kept from the start, then live) from
//! a byte offset, so a client that reconnects resumes where it stopped; stdin writes carry
//! their offset too, and a retried write is not applied twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use glovebox_proto::agent::Command;
use glovebox_proto::api::{Encoding, EndReason, ExecRequest, TimeBudget};

use super::pb::api;
use super::pb::api::generic_result::GenericStatus;
use super::{bounded_insert, Modal};
use crate::agent::Output;
use crate::error::{Error, Result};
use crate::manager::{Manager, Sb};
use crate::ops;

/// Output kept per stream of one command (what a reader can read from offset 0).
pub const OUTPUT_CAP: u64 = 64 << 20;
/// Most commands remembered.
const MAX_KEPT: usize = 8192;
/// The name of a sandbox's entrypoint among its commands.
pub const ENTRYPOINT: &str = "";

/// Where a command's stdin stands.
#[derive(Default, Clone, Copy)]
pub struct Stdin {
    pub written: u64,
    pub closed: bool,
}

#[derive(Clone)]
struct Rec {
    /// The agent's command id.
    cmd: u64,
    /// stdin; the lock also orders writes.
    stdin: Arc<tokio::sync::Mutex<Stdin>>,
}

#[derive(Default)]
pub struct Execs {
    /// (sandbox, exec id) → command.
    cmds: Mutex<HashMap<(String, String), (u64, Rec)>>,
    /// How entrypoints ended, by sandbox.
    ended: Mutex<HashMap<String, (u64, api::GenericResult)>>,
}

/// Which of a command's output streams.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fd {
    Stdout,
    Stderr,
}

impl Execs {
    fn get(&self, sb: &str, exec: &str) -> Option<Rec> {
        self.cmds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(sb.to_string(), exec.to_string()))
            .map(|(_, r)| r.clone())
    }

    fn known(&self, sb: &str, exec: &str) -> Result<Rec> {
        self.get(sb, exec).ok_or_else(|| Error::NotFound { what: "exec", name: exec.to_string() })
    }

    /// Starts `args` in `sb` as exec `exec` (again: nothing happens, it is a retry).
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        &self,
        m: &Arc<Manager>,
        sb: &Arc<Sb>,
        exec: &str,
        args: Vec<String>,
        workdir: Option<String>,
        env: std::collections::BTreeMap<String, String>,
        timeout_s: Option<u32>,
    ) -> Result<()> {
        if self.get(&sb.id, exec).is_some() {
            return Ok(());
        }
        if args.is_empty() {
            return Err(Error::Invalid("an exec needs a command".into()));
        }
        let timeout = match timeout_s.filter(|t| *t > 0) {
            None => TimeBudget::UNBOUNDED,
            Some(t) => TimeBudget::from_ms(u64::from(t) * 1000).map_err(|e| Error::Invalid(format!("timeout: {e}")))?,
        };
        let cwd = workdir.or_else(|| sb.metadata().get(super::sandboxes::WORKDIR_KEY).cloned());
        let req = ExecRequest {
            cmd: Command::Argv(args),
            cwd,
            env,
            stdin: None,
            stdin_base64: None,
            timeout_ms: Some(timeout),
            max_output_bytes: Some(OUTPUT_CAP),
            output_tail_bytes: None,
            encoding: Encoding::Utf8,
            background: true,
        };
        let started = ops::exec_background(m, sb, req).await?;
        let rec = Rec { cmd: started.id, stdin: Arc::default() };
        let mut cmds = self.cmds.lock().unwrap_or_else(|p| p.into_inner());
        bounded_insert(&mut cmds, (sb.id.clone(), exec.to_string()), rec, MAX_KEPT);
        Ok(())
    }

    /// Starts a sandbox's entrypoint; when it exits, its exit is the sandbox's result and the
    /// sandbox ends (as a Modal sandbox ends with its entrypoint).
    pub async fn start_entrypoint(
        &self,
        modal: &Modal,
        sb: &Arc<Sb>,
        args: Vec<String>,
        workdir: Option<String>,
    ) -> Result<()> {
        let m = modal.manager().clone();
        self.start(&m, sb, ENTRYPOINT, args, workdir, Default::default(), None).await?;
        let rec = self.known(&sb.id, ENTRYPOINT)?;
        let (modal, sb) = (modal.clone(), sb.clone());
        tokio::spawn(async move {
            // An error means the sandbox ended first: its own end is its result.
            if let Ok(e) = wait_exit(m.clone(), sb.clone(), rec.cmd).await {
                let r = exit_result(&e);
                {
                    let mut ended = modal.inner.execs.ended.lock().unwrap_or_else(|p| p.into_inner());
                    bounded_insert(&mut ended, sb.id.clone(), r, MAX_KEPT);
                }
                m.destroy(&sb.id, EndReason::Killed).await;
            }
        });
        Ok(())
    }

    /// How sandbox `id`'s entrypoint ended, if it had one that exited.
    pub fn entrypoint_result(&self, id: &str) -> Option<api::GenericResult> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).get(id).map(|(_, r)| r.clone())
    }

    pub fn has(&self, sb: &str, exec: &str) -> bool {
        self.get(sb, exec).is_some()
    }

    /// Output of stream `fd` of exec `exec` from byte `offset`, live until it exits. Each
    /// item is the chunk and the offset it starts at.
    pub async fn read(
        &self,
        m: Arc<Manager>,
        sb: Arc<Sb>,
        exec: &str,
        fd: Fd,
        offset: u64,
    ) -> Result<impl futures_util::Stream<Item = Result<(u64, Vec<u8>)>>> {
        let rec = self.known(&sb.id, exec)?;
        let out = ops::attach(m, sb, rec.cmd).await?;
        let mut pos = 0u64;
        Ok(out.filter_map(move |item| {
            let r = match item {
                Ok(Output::Stdout(b)) if fd == Fd::Stdout => Some(skip(&mut pos, offset, b)),
                Ok(Output::Stderr(b)) if fd == Fd::Stderr => Some(skip(&mut pos, offset, b)),
                Ok(_) => None,
                Err(e) => Some(Some(Err(e))),
            };
            std::future::ready(r.flatten())
        }))
    }

    /// Writes stdin at `offset` (bytes before what was written already are a retry's, and
    /// skipped); `eof` closes it.
    pub async fn write(&self, m: &Manager, sb: &Sb, exec: &str, offset: u64, data: &[u8], eof: bool) -> Result<()> {
        let rec = self.known(&sb.id, exec)?;
        let mut st = rec.stdin.lock().await;
        if st.closed {
            return Ok(());
        }
        if offset > st.written {
            return Err(Error::Invalid(format!("stdin offset {offset} is past the {} bytes written", st.written)));
        }
        let skip = usize::try_from(st.written - offset).unwrap_or(usize::MAX).min(data.len());
        let data = &data[skip..];
        if !data.is_empty() || eof {
            match ops::send_stdin(m, sb, rec.cmd, data, eof).await {
                Ok(()) => {}
                // A command that has exited takes no more input: what it would have read is lost,
                // as with a closed pipe.
                Err(Error::Conflict(_)) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        st.written += data.len() as u64;
        st.closed = eof;
        Ok(())
    }

    pub async fn stdin_status(&self, sb: &str, exec: &str) -> Result<Stdin> {
        Ok(*self.known(sb, exec)?.stdin.lock().await)
    }

    /// The exit of exec `exec`, waiting for it.
    pub async fn wait(&self, m: Arc<Manager>, sb: Arc<Sb>, exec: &str) -> Result<glovebox_proto::agent::ExitStatus> {
        let rec = self.known(&sb.id, exec)?;
        wait_exit(m, sb, rec.cmd).await
    }

    /// The exit of exec `exec` if it has exited.
    pub async fn poll(
        &self,
        m: Arc<Manager>,
        sb: Arc<Sb>,
        exec: &str,
    ) -> Result<Option<glovebox_proto::agent::ExitStatus>> {
        let rec = self.known(&sb.id, exec)?;
        let list = ops::list_commands(&m, &sb).await?;
        match list.commands.iter().find(|c| c.id == rec.cmd) {
            Some(c) if c.running => Ok(None),
            _ => wait_exit(m, sb, rec.cmd).await.map(Some),
        }
    }
}

/// The part of chunk `b` (at stream position `*pos`) from `offset` on; advances `*pos`.
fn skip(pos: &mut u64, offset: u64, b: Vec<u8>) -> Option<Result<(u64, Vec<u8>)>> {
    let start = *pos;
    *pos += b.len() as u64;
    if *pos <= offset {
        return None;
    }
    let cut = usize::try_from(offset.saturating_sub(start)).unwrap_or(0);
    Some(Ok((start + cut as u64, b[cut..].to_vec())))
}

async fn wait_exit(m: Arc<Manager>, sb: Arc<Sb>, id: u64) -> Result<glovebox_proto::agent::ExitStatus> {
    let out = ops::attach(m, sb, id).await?;
    let mut out = std::pin::pin!(out);
    while let Some(item) = out.next().await {
        if let Output::Exited(e) = item? {
            return Ok(e);
        }
    }
    Err(Error::Internal(format!("command {id}: output ended without an exit")))
}

/// An entrypoint's exit as a sandbox's result.
fn exit_result(e: &glovebox_proto::agent::ExitStatus) -> api::GenericResult {
    let status = if e.exit_code == 0 { GenericStatus::Success } else { GenericStatus::Failure };
    let why = match e.signal {
        Some(s) => format!("the entrypoint was killed by signal {s}"),
        None if e.exit_code != 0 => format!("the entrypoint exited with code {}", e.exit_code),
        None => String::new(),
    };
    super::result(status, e.exit_code, &why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_resume_at_their_offset() {
        let mut pos = 0;
        assert!(skip(&mut pos, 5, b"abc".to_vec()).is_none(), "all before the offset");
        let (at, data) = skip(&mut pos, 5, b"defg".to_vec()).unwrap().unwrap();
        assert_eq!((at, data), (5, b"fg".to_vec()));
        let (at, data) = skip(&mut pos, 5, b"hi".to_vec()).unwrap().unwrap();
        assert_eq!((at, data), (7, b"hi".to_vec()));
    }

    #[test]
    fn entrypoint_exits_are_results() {
        let ok = glovebox_proto::agent::ExitStatus { exit_code: 0, ..Default::default() };
        assert_eq!(exit_result(&ok).status, GenericStatus::Success as i32);
        let bad = glovebox_proto::agent::ExitStatus { exit_code: 3, ..Default::default() };
        let r = exit_result(&bad);
        assert_eq!((r.status, r.exitcode), (GenericStatus::Failure as i32, 3));
    }
}
