//! `process.v1.ProcessService`: commands in the sandbox the call's `x-sandbox-id` names.
//!
//! `Start` runs a session-mode command (on a pseudo-terminal when asked) and streams its
//! output as it is read; its process id is the agent's command id, known to `WriteStdin`,
//! `SendSignal` and `ResizeTTY` while the stream is open. Like sandboxd, a `Start` whose
//! client goes away kills its process. `Execute` is the agent's foreground command, its
//! time budget the call's deadline.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use glovebox_proto::agent::Command;
use glovebox_proto::api::{Encoding, ExecRequest, TimeBudget};
use tonic::{Request, Response, Status};

use super::pb;
use super::pb::process_service_server::ProcessService;
use super::{paths, status, Sandboxd, Target};
use crate::agent::Output;
use crate::manager::Sb;
use crate::ops;

pub struct Process(pub Sandboxd);

/// The size of a terminal asked for without one (sandboxd leaves the kernel's default).
const DEFAULT_PTY: (u32, u32) = (80, 24);

fn target_of<T>(req: &Request<T>) -> Result<Target, Status> {
    req.extensions().get::<Target>().cloned().ok_or_else(|| Status::unauthenticated("no sandbox"))
}

/// A command request from a `ProcessConfig`: argv as given, the sandbox's environment under
/// `env_vars`, `cwd` under the sandbox's root.
fn exec_request(sb: &Sb, config: Option<pb::ProcessConfig>, timeout: TimeBudget) -> Result<ExecRequest, Status> {
    let config = config.ok_or_else(|| Status::invalid_argument("config is required"))?;
    if config.command.is_empty() {
        return Err(Status::invalid_argument("command is required"));
    }
    if let Some(k) = config.env_vars.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        return Err(Status::invalid_argument(format!("invalid env var name {k:?}")));
    }
    let root = paths::root(sb);
    let cwd = match config.cwd.as_deref() {
        None | Some("") => root,
        Some(c) => paths::resolve(&root, c).map_err(|_| {
            Status::permission_denied(format!("cwd {c:?}: path traversal outside the sandbox root is forbidden"))
        })?,
    };
    Ok(ExecRequest {
        cmd: Command::Argv(config.command),
        cwd: Some(cwd),
        env: config.env_vars.into_iter().collect::<BTreeMap<_, _>>(),
        stdin: None,
        stdin_base64: None,
        timeout_ms: Some(timeout),
        max_output_bytes: None,
        output_tail_bytes: None,
        encoding: Encoding::Utf8,
        background: true,
    })
}

/// The call's deadline (`grpc-timeout`: digits and a unit, H M S m u n).
fn deadline(h: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = h.get("grpc-timeout")?.to_str().ok()?;
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A process id on the wire: the agent's command id (an `int32` there).
fn process_id(id: u64) -> Option<i32> {
    i32::try_from(id).ok()
}

/// Removes an open process when its `Start` stream ends, killing it if it had not exited (the
/// client went away: sandboxd ties a process to its stream).
struct Open {
    d: Sandboxd,
    sb: Arc<Sb>,
    id: u64,
    exited: bool,
    _busy: crate::idle::Guard,
    /// The session's input half: the agent ends a session whose input closes.
    _input: crate::agent::SessionInput,
}

impl Drop for Open {
    fn drop(&mut self) {
        crate::util::lock(&self.d.inner.open).remove(&(self.sb.id.clone(), self.id));
        if !self.exited {
            let (m, sb, id) = (self.d.manager().clone(), self.sb.clone(), self.id);
            tokio::spawn(async move {
                let _ = ops::signal(&m, &sb, id, libc::SIGKILL).await;
            });
        }
    }
}

type Stream<T> = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send + 'static>>;

impl Process {
    /// The sandbox and agent command of an open process (one a `Start` stream has open), and
    /// whether it runs on a terminal.
    fn open(&self, t: &Target, pid: i32) -> Result<(u64, bool), Status> {
        let id = u64::try_from(pid).map_err(|_| Status::not_found(format!("process {pid} not found")))?;
        match crate::util::lock(&self.0.inner.open).get(&(t.sb.id.clone(), id)) {
            Some(pty) => Ok((id, *pty)),
            None => Err(Status::not_found(format!(
                "process {pid} not found (processes are known while their Start stream is open)"
            ))),
        }
    }
}

#[tonic::async_trait]
impl ProcessService for Process {
    type StartStream = Stream<pb::StartResponse>;

    async fn start(&self, req: Request<pb::StartRequest>) -> Result<Response<Self::StartStream>, Status> {
        use pb::start_response::Event;
        let t = target_of(&req)?;
        let q = req.into_inner();
        let m = self.0.manager().clone();
        // An interactive program: only the stream (and the sandbox's lifetime) bounds it.
        let exec = exec_request(&t.sb, q.config, TimeBudget::UNBOUNDED)?;
        let pty = match q.pty {
            None => None,
            // sandboxd sets a size only when both sides are given.
            Some(p) if p.cols == 0 || p.rows == 0 => Some(ops::pty_size(DEFAULT_PTY.0, DEFAULT_PTY.1).map_err(status)?),
            Some(p) => Some(ops::pty_size(p.cols, p.rows).map_err(status)?),
        };
        let (started, session) = ops::start_session(&m, &t.sb, &exec, pty).await.map_err(status)?;
        let Some(pid) = process_id(started.id) else {
            let _ = ops::signal(&m, &t.sb, started.id, libc::SIGKILL).await;
            return Err(Status::resource_exhausted("this sandbox has run more commands than process ids can number"));
        };
        crate::util::lock(&self.0.inner.open).insert((t.sb.id.clone(), started.id), pty.is_some());
        let (output, input) = session.split();
        let open = Open {
            d: self.0.clone(),
            sb: t.sb.clone(),
            id: started.id,
            exited: false,
            _busy: t.sb.activity.guard(),
            _input: input,
        };
        let init = pb::StartResponse { event: Some(Event::Init(pb::InitEvent { process_id: pid })) };
        let rest = futures_util::stream::unfold(Some((output, open)), move |st| {
            let m = m.clone();
            async move {
                let (mut output, mut open) = st?;
                let item =
                    match output.next().await.map_err(ops::failed(&m, &open.sb, crate::agent::Op::Output(open.id))) {
                        Ok(Some(Output::Stdout(b))) => Ok(Event::Stdout(b)),
                        Ok(Some(Output::Stderr(b))) => Ok(Event::Stderr(b)),
                        Ok(Some(Output::Exited(e))) => {
                            open.exited = true;
                            Ok(Event::Exit(pb::ExitEvent { exit_code: e.exit_code }))
                        }
                        // Another session took the program over (the native API's terminal attach).
                        Ok(None) => Err(Status::aborted("another client attached to this process")),
                        Err(e) => Err(status(e)),
                    };
                let go_on = matches!(item, Ok(Event::Stdout(_) | Event::Stderr(_)));
                let item = item.map(|e| pb::StartResponse { event: Some(e) });
                Some((item, go_on.then_some((output, open))))
            }
        });
        let s = futures_util::stream::once(std::future::ready(Ok(init))).chain(rest);
        Ok(Response::new(Box::pin(s)))
    }

    async fn execute(&self, req: Request<pb::ExecuteRequest>) -> Result<Response<pb::ExecuteResponse>, Status> {
        let t = target_of(&req)?;
        // The call's deadline is the command's time budget (past it the caller has gone);
        // without one, the daemon's default command timeout.
        let budget = match deadline(req.metadata()) {
            Some(d) => {
                let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).clamp(1, TimeBudget::MAX_MS);
                TimeBudget::from_ms(ms).map_err(|e| Status::invalid_argument(format!("deadline: {e}")))?
            }
            None => TimeBudget::default(),
        };
        let mut exec = exec_request(&t.sb, req.into_inner().config, budget)?;
        exec.background = false;
        // Output is bytes on the wire: have it unaltered.
        exec.encoding = Encoding::Base64;
        let _busy = t.sb.activity.guard();
        let r = ops::exec(self.0.manager(), &t.sb, exec).await.map_err(status)?;
        if r.timed_out {
            return Err(Status::deadline_exceeded(format!(
                "the command ran past its time budget ({} ms)",
                r.duration_ms
            )));
        }
        let raw = |s: &str| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| Status::internal(format!("output: {e}")))
        };
        Ok(Response::new(pb::ExecuteResponse {
            exit_code: r.exit_code,
            stdout: raw(&r.stdout)?,
            stderr: raw(&r.stderr)?,
        }))
    }

    async fn write_stdin(
        &self,
        req: Request<pb::WriteStdinRequest>,
    ) -> Result<Response<pb::WriteStdinResponse>, Status> {
        use pb::write_stdin_request::Payload;
        let t = target_of(&req)?;
        let q = req.into_inner();
        let (id, pty) = self.open(&t, q.process_id)?;
        let m = self.0.manager();
        match q.payload {
            Some(Payload::Input(b)) if !b.is_empty() => ops::send_stdin(m, &t.sb, id, &b, false).await,
            Some(Payload::Input(_)) | None => Ok(()),
            // A terminal's end of input is the EOF character, as typed.
            Some(Payload::Eof(())) if pty => ops::send_stdin(m, &t.sb, id, b"\x04", false).await,
            Some(Payload::Eof(())) => ops::send_stdin(m, &t.sb, id, b"", true).await,
        }
        .map_err(status)?;
        Ok(Response::new(pb::WriteStdinResponse {}))
    }

    async fn send_signal(
        &self,
        req: Request<pb::SendSignalRequest>,
    ) -> Result<Response<pb::SendSignalResponse>, Status> {
        let t = target_of(&req)?;
        let q = req.into_inner();
        let (id, _) = self.open(&t, q.process_id)?;
        let sig = match pb::Signal::try_from(q.signal) {
            Ok(pb::Signal::Sigint) => libc::SIGINT,
            Ok(pb::Signal::Sigterm) => libc::SIGTERM,
            Ok(pb::Signal::Sigkill) => libc::SIGKILL,
            Ok(pb::Signal::Unspecified) | Err(_) => {
                return Err(Status::invalid_argument(format!("unsupported or unspecified signal {}", q.signal)))
            }
        };
        ops::signal(self.0.manager(), &t.sb, id, sig).await.map_err(status)?;
        Ok(Response::new(pb::SendSignalResponse {}))
    }

    async fn resize_tty(&self, req: Request<pb::ResizeTtyRequest>) -> Result<Response<pb::ResizeTtyResponse>, Status> {
        let t = target_of(&req)?;
        let q = req.into_inner();
        let (id, pty) = self.open(&t, q.process_id)?;
        if !pty {
            return Err(Status::failed_precondition(format!(
                "process {} has no terminal (start it with a pty)",
                q.process_id
            )));
        }
        ops::pty_resize(self.0.manager(), &t.sb, id, q.cols, q.rows).await.map_err(status)?;
        Ok(Response::new(pb::ResizeTtyResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_read() {
        let mut h = tonic::metadata::MetadataMap::new();
        assert_eq!(deadline(&h), None);
        h.insert("grpc-timeout", "59999m".parse().unwrap());
        assert_eq!(deadline(&h), Some(Duration::from_millis(59999)));
        h.insert("grpc-timeout", "2S".parse().unwrap());
        assert_eq!(deadline(&h), Some(Duration::from_secs(2)));
        h.insert("grpc-timeout", "1H".parse().unwrap());
        assert_eq!(deadline(&h), Some(Duration::from_secs(3600)));
        h.insert("grpc-timeout", "5x".parse().unwrap());
        assert_eq!(deadline(&h), None);
        h.insert("grpc-timeout", "S".parse().unwrap());
        assert_eq!(deadline(&h), None);
    }

    #[test]
    fn process_ids_fit_the_wire() {
        assert_eq!(process_id(7), Some(7));
        assert_eq!(process_id(u64::from(u32::MAX)), None);
    }
}
