//! The `TaskCommandRouter` service: exec (start, output streams, stdin, wait, poll) and the
//! entrypoint's stdio, for the one sandbox the caller's router token names.

use std::sync::Arc;

use futures_util::StreamExt;
use tonic::{Request, Response, Status};

use super::exec::{Fd, ENTRYPOINT};
use super::pb::router as r;
use super::pb::router::task_command_router_server::TaskCommandRouter;
use super::sandboxes::sandbox_of_task;
use super::tokens::RouterGrant;
use super::{status, unsupported, Modal, Stream};
use crate::manager::Sb;
use crate::tenants::Caller;

pub struct Router(pub Modal);

impl Router {
    /// The sandbox of `task_id`, which the request's token must name.
    fn sandbox<T>(&self, req: &Request<T>, task_id: &str) -> Result<Arc<Sb>, Status> {
        let g = req.extensions().get::<RouterGrant>().ok_or_else(|| Status::unauthenticated("no router token"))?;
        let id = sandbox_of_task(task_id);
        if id != g.sandbox {
            return Err(Status::permission_denied(format!(
                "this token is for task {}",
                super::sandboxes::task_id(&g.sandbox)
            )));
        }
        self.0.sandbox(&g.caller, id)
    }
}

fn exit(e: &glovebox_proto::agent::ExitStatus) -> (Option<i32>, Option<i32>) {
    match e.signal {
        Some(s) => (None, Some(s)),
        None => (Some(e.exit_code), None),
    }
}

#[tonic::async_trait]
impl TaskCommandRouter for Router {
    async fn task_exec_start(
        &self,
        req: Request<r::TaskExecStartRequest>,
    ) -> Result<Response<r::TaskExecStartResponse>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let g = req
            .extensions()
            .get::<RouterGrant>()
            .map(|g| g.caller.clone())
            .unwrap_or_else(|| Caller { tenant: sb.tenant.clone(), admin: false });
        let q = req.into_inner();
        if q.pty_info.is_some() {
            return Err(unsupported("exec with a PTY (pty=True)"));
        }
        if !q.container_id.is_empty() {
            return Err(unsupported("sandbox sidecars (container_id)"));
        }
        // Modal's runtime puts its own tools there (`sb.filesystem` runs them); a Glovebox
        // sandbox has none.
        if q.command_args.first().is_some_and(|a| a.starts_with("/__modal/")) {
            return Err(unsupported(
                "the sandbox filesystem API (sb.filesystem runs Modal's own tools in the sandbox)",
            ));
        }
        if q.exec_id.is_empty() || q.exec_id == ENTRYPOINT {
            return Err(Status::invalid_argument("exec_id is required"));
        }
        if let Some(w) = q.workdir.as_deref().filter(|w| !w.starts_with('/') || w.split('/').any(|c| c == "..")) {
            return Err(Status::invalid_argument(format!("workdir must be absolute, without '..': {w:?}")));
        }
        let mut env = std::collections::BTreeMap::new();
        for id in &q.secret_ids {
            env.extend(self.0.inner.apps.secret(&g, id)?);
        }
        for s in &q.secret_sources {
            match &s.source {
                Some(super::pb::api::secret_source::Source::Env(map)) => env.extend(map.contents.clone()),
                Some(super::pb::api::secret_source::Source::SecretId(id)) => {
                    env.extend(self.0.inner.apps.secret(&g, id)?)
                }
                None => {}
            }
        }
        env.extend(q.env);
        let m = self.0.manager().clone();
        self.0
            .inner
            .execs
            .start(&m, &sb, &q.exec_id, q.command_args, q.workdir, env, q.timeout_secs)
            .await
            .map_err(status)?;
        Ok(Response::new(r::TaskExecStartResponse {}))
    }

    type TaskExecStdioReadStream = Stream<r::TaskExecStdioReadResponse>;

    async fn task_exec_stdio_read(
        &self,
        req: Request<r::TaskExecStdioReadRequest>,
    ) -> Result<Response<Self::TaskExecStdioReadStream>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let q = req.into_inner();
        let fd = match r::TaskExecStdioFileDescriptor::try_from(q.file_descriptor) {
            Ok(r::TaskExecStdioFileDescriptor::Stdout) => Fd::Stdout,
            Ok(r::TaskExecStdioFileDescriptor::Stderr) => Fd::Stderr,
            Err(_) => return Err(Status::invalid_argument("unknown file descriptor")),
        };
        let m = self.0.manager().clone();
        let out = self.0.inner.execs.read(m, sb, &q.exec_id, fd, q.offset).await.map_err(status)?;
        let s = out.map(|i| i.map(|(_, data)| r::TaskExecStdioReadResponse { data }).map_err(status));
        Ok(Response::new(Box::pin(s)))
    }

    async fn task_exec_stdin_write(
        &self,
        req: Request<r::TaskExecStdinWriteRequest>,
    ) -> Result<Response<r::TaskExecStdinWriteResponse>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let q = req.into_inner();
        let m = self.0.manager();
        self.0.inner.execs.write(m, &sb, &q.exec_id, q.offset, &q.data, q.eof).await.map_err(status)?;
        Ok(Response::new(r::TaskExecStdinWriteResponse {}))
    }

    async fn task_exec_stdin_status(
        &self,
        req: Request<r::TaskExecStdinStatusRequest>,
    ) -> Result<Response<r::TaskExecStdinStatusResponse>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let st = self.0.inner.execs.stdin_status(&sb.id, &req.get_ref().exec_id).await.map_err(status)?;
        Ok(Response::new(r::TaskExecStdinStatusResponse { num_bytes_written: st.written, closed: st.closed }))
    }

    async fn task_exec_wait(
        &self,
        req: Request<r::TaskExecWaitRequest>,
    ) -> Result<Response<r::TaskExecWaitResponse>, Status> {
        use r::task_exec_wait_response::ExitStatus as X;
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let m = self.0.manager().clone();
        let e = self.0.inner.execs.wait(m, sb, &req.get_ref().exec_id).await.map_err(status)?;
        let exit_status = match exit(&e) {
            (_, Some(s)) => X::Signal(s),
            (c, None) => X::Code(c.unwrap_or(e.exit_code)),
        };
        Ok(Response::new(r::TaskExecWaitResponse { exit_status: Some(exit_status) }))
    }

    async fn task_exec_poll(
        &self,
        req: Request<r::TaskExecPollRequest>,
    ) -> Result<Response<r::TaskExecPollResponse>, Status> {
        use r::task_exec_poll_response::ExitStatus as X;
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let m = self.0.manager().clone();
        let e = self.0.inner.execs.poll(m, sb, &req.get_ref().exec_id).await.map_err(status)?;
        let exit_status = e.map(|e| match exit(&e) {
            (_, Some(s)) => X::Signal(s),
            (c, None) => X::Code(c.unwrap_or(e.exit_code)),
        });
        Ok(Response::new(r::TaskExecPollResponse { exit_status }))
    }

    type SandboxStdioReadV2Stream = Stream<r::SandboxStdioReadV2Response>;

    /// The entrypoint's output (none, ending at once, for a sandbox created without one).
    async fn sandbox_stdio_read_v2(
        &self,
        req: Request<r::SandboxStdioReadV2Request>,
    ) -> Result<Response<Self::SandboxStdioReadV2Stream>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let q = req.into_inner();
        let fd = match r::SandboxStdioFileDescriptor::try_from(q.file_descriptor) {
            Ok(r::SandboxStdioFileDescriptor::Stdout) => Fd::Stdout,
            Ok(r::SandboxStdioFileDescriptor::Stderr) => Fd::Stderr,
            Err(_) => return Err(Status::invalid_argument("unknown file descriptor")),
        };
        let execs = &self.0.inner.execs;
        if !execs.has(&sb.id, ENTRYPOINT) {
            return Ok(Response::new(Box::pin(futures_util::stream::empty())));
        }
        let m = self.0.manager().clone();
        let out = execs.read(m, sb, ENTRYPOINT, fd, q.offset).await.map_err(status)?;
        let s = out.map(|i| {
            i.map(|(starting_offset, data)| r::SandboxStdioReadV2Response { data, starting_offset }).map_err(status)
        });
        Ok(Response::new(Box::pin(s)))
    }

    async fn sandbox_stdin_write_v2(
        &self,
        req: Request<r::SandboxStdinWriteV2Request>,
    ) -> Result<Response<r::SandboxStdinWriteV2Response>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let q = req.into_inner();
        let execs = &self.0.inner.execs;
        if !execs.has(&sb.id, ENTRYPOINT) {
            return Err(Status::failed_precondition("this sandbox has no entrypoint command to write to"));
        }
        execs.write(self.0.manager(), &sb, ENTRYPOINT, q.offset, &q.data, q.eof).await.map_err(status)?;
        Ok(Response::new(r::SandboxStdinWriteV2Response {}))
    }

    /// Readiness probes are refused at create, so a running sandbox is ready.
    async fn sandbox_wait_until_ready(
        &self,
        req: Request<r::SandboxWaitUntilReadyTcrRequest>,
    ) -> Result<Response<r::SandboxWaitUntilReadyTcrResponse>, Status> {
        let sb = self.sandbox(&req, &req.get_ref().task_id)?;
        let created = sb.created_at.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        Ok(Response::new(r::SandboxWaitUntilReadyTcrResponse { ready_at: created }))
    }
}
