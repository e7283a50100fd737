//! Commands as the manager's sandboxes take them: a request made into the agent's spec (the
//! sandbox's environment and its template's defaults), and the template's start command.

use base64::Engine;
use glovebox_proto::agent::{self as ap, ExecSpec};
use glovebox_proto::api::{self, ExecRequest};

use super::{Manager, Sb};
use crate::error::{Error, Result};

impl Sb {
    /// The agent's spec of command request `req` in this sandbox (its environment under the
    /// request's, the template's user and working directory unless the request names them),
    /// and the stdin to send; a request that cannot run is refused here.
    pub fn exec_spec(&self, req: &ExecRequest) -> Result<(ExecSpec, Option<Vec<u8>>)> {
        let stdin = match (&req.stdin, &req.stdin_base64) {
            (Some(_), Some(_)) => return Err(Error::Invalid("give either stdin or stdin_base64, not both".into())),
            (Some(s), None) => Some(s.as_bytes().to_vec()),
            (None, Some(b)) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| Error::Invalid(format!("stdin_base64: {e}")))?,
            ),
            (None, None) => None,
        };
        let max = req.max_output_bytes.unwrap_or(ap::DEFAULT_MAX_OUTPUT);
        if max > 64 << 20 {
            return Err(Error::Invalid("max_output_bytes must be at most 67108864 (64 MiB)".into()));
        }
        if req.output_tail_bytes.is_some_and(|t| t > max) {
            return Err(Error::Invalid(format!("output_tail_bytes must be at most max_output_bytes ({max})")));
        }
        // Its ceiling was checked when the request was read.
        let budget = req.timeout_ms.unwrap_or_default();
        match &req.cmd {
            ap::Command::Argv(v) if v.is_empty() => return Err(Error::Invalid("cmd must not be empty".into())),
            ap::Command::Shell(s) if s.trim().is_empty() => return Err(Error::Invalid("cmd must not be empty".into())),
            _ => {}
        }
        let mut env = self.base_env();
        env.extend(req.env.clone());
        let (workdir, uid, gid) = self.exec_defaults();
        Ok((
            ExecSpec {
                cmd: req.cmd.clone(),
                cwd: req.cwd.clone().or(workdir),
                env,
                // Background commands keep stdin open for `…/stdin` requests.
                stdin: stdin.is_some() || req.background,
                timeout_ms: budget.limit().map(|_| budget.as_ms()),
                max_output_bytes: max,
                output_tail_bytes: req.output_tail_bytes,
                uid,
                gid,
                background: req.background,
                raw: false,
                pty: None,
            },
            stdin,
        ))
    }

    /// The template's default working directory and user for a command that names none.
    pub fn exec_defaults(&self) -> (Option<String>, Option<u32>, Option<u32>) {
        match &self.template_defaults {
            Some(d) => (d.workdir.clone(), d.uid, d.gid),
            None => (None, None, None),
        }
    }
}

impl Manager {
    /// Starts the template's `CMD` in the background of a new sandbox (best effort: a start
    /// command that fails is logged, the sandbox stays usable).
    pub(super) async fn start_template_cmd(&self, sb: &Sb, cmd: Vec<String>) {
        let req = ExecRequest {
            cmd: api::Command::Argv(cmd),
            cwd: None,
            env: Default::default(),
            stdin: None,
            stdin_base64: None,
            timeout_ms: Some(api::TimeBudget::UNBOUNDED),
            max_output_bytes: None,
            output_tail_bytes: None,
            encoding: api::Encoding::Utf8,
            background: true,
        };
        let started = async {
            let (spec, _) = sb.exec_spec(&req)?;
            sb.commands.started();
            sb.agent().exec(&spec).await.map_err(|e| self.agent_error(&sb.id, e))
        };
        if let Err(e) = started.await {
            tracing::warn!(sandbox = %sb.id, "template start command: {e}");
        }
    }
}
