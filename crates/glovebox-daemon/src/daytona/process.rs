//! Daytona's toolbox process API over `ops`: `execute` and `code-run` (one command each,
//! stdout and stderr interleaved in `result` as Daytona returns them), sessions (named
//! groups of background commands, their logs read back from the agent's record of each), and the
//! info endpoints.
//!
//! A Daytona session is a long-lived shell (a `cd` in one command holds for the next);
//! here each session command is its own `/bin/sh -c` in the template's working directory,
//! so state does not carry between commands (docs/daytona.md says so).

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use glovebox_proto::api::{Command, Encoding, ExecRequest, ExecResult, TimeBudget};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Daytona, DtError, Tb};
use crate::agent::Output;
use crate::ops;

/// How long a running command's output may be quiet before its logs are answered.
const LOGS_QUIET: std::time::Duration = std::time::Duration::from_millis(200);
/// The most time spent reading a running command's logs.
const LOGS_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// Sessions of one sandbox: session id → its commands (Glovebox command ids, in order).
pub type Sessions = BTreeMap<String, Vec<SessionCommand>>;

#[derive(Clone)]
pub struct SessionCommand {
    id: u64,
    command: String,
}

pub fn routes() -> Router<Daytona> {
    Router::new()
        .route("/process/execute", post(execute))
        .route("/process/code-run", post(code_run))
        .route("/process/session", post(create_session).get(list_sessions))
        .route("/process/session/{session}", get(get_session).delete(delete_session))
        .route("/process/session/{session}/exec", post(session_exec))
        .route("/process/session/{session}/command/{command}", get(get_command))
        .route("/process/session/{session}/command/{command}/logs", get(command_logs))
        .route("/user-home-dir", get(home_dir))
        .route("/work-dir", get(work_dir))
        .route("/version", get(version))
}

fn body<T: for<'de> Deserialize<'de>>(b: &Bytes) -> Result<T, DtError> {
    serde_json::from_slice(b).map_err(|e| DtError::bad(format!("invalid body: {e}")))
}

/// A command request: argv, no shell between us and it.
pub(super) fn request(
    cmd: Vec<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    timeout_s: Option<u64>,
) -> Result<ExecRequest, DtError> {
    let timeout_ms = match timeout_s {
        None | Some(0) => TimeBudget::UNBOUNDED,
        Some(s) => TimeBudget::from_ms(s.saturating_mul(1000))
            .map_err(|_| DtError::bad(format!("timeout must be at most {} seconds", TimeBudget::MAX_MS / 1000)))?,
    };
    Ok(ExecRequest {
        cmd: Command::Argv(cmd),
        cwd: cwd.filter(|c| !c.is_empty()),
        env,
        stdin: None,
        stdin_base64: None,
        timeout_ms: Some(timeout_ms),
        max_output_bytes: None,
        output_tail_bytes: None,
        encoding: Encoding::Utf8,
        background: false,
    })
}

/// `sh -c` running `script` with its stderr joined to its stdout (Daytona's `result` is
/// the combined output, in order); `args` become `$0`, `$1`, ….
fn combined(script: &str, args: Vec<String>) -> Vec<String> {
    let mut v = vec!["/bin/sh".to_string(), "-c".to_string(), format!("exec 2>&1\n{script}")];
    v.extend(args);
    v
}

/// A finished command as Daytona answers one; a command killed by its time budget is a
/// 408, which the SDK raises as its timeout error.
fn finished(r: ExecResult, timeout_s: Option<u64>) -> Result<Response, DtError> {
    if r.timed_out {
        return Err(DtError::daemon(
            StatusCode::REQUEST_TIMEOUT,
            "PROCESS_EXECUTION_TIMEOUT",
            format!("command timed out after {} seconds", timeout_s.unwrap_or(0)),
        ));
    }
    // A signal's death is 128 + the signal already, as a shell reports it.
    Ok(axum::Json(json!({ "exitCode": r.exit_code, "result": r.stdout })).into_response())
}

#[derive(Deserialize)]
struct Execute {
    command: String,
    cwd: Option<String>,
    envs: Option<BTreeMap<String, String>>,
    timeout: Option<u64>,
}

async fn execute(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: Execute = body(&b)?;
    if req.command.trim().is_empty() {
        return Err(DtError::bad("command must not be empty"));
    }
    let er = request(combined(&req.command, Vec::new()), req.cwd, req.envs.unwrap_or_default(), req.timeout)?;
    let r = ops::exec(&st.app.manager, &tb.sb, er).await?;
    finished(r, req.timeout)
}

#[derive(Deserialize)]
struct CodeRun {
    code: String,
    language: Option<String>,
    argv: Option<Vec<String>>,
    envs: Option<BTreeMap<String, String>>,
    timeout: Option<u64>,
}

/// `code-run`: the code run once by the language's interpreter (`python3 -c`, `node -e`),
/// its arguments after it. Charts are not captured (`artifacts.charts` is empty).
async fn code_run(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: CodeRun = body(&b)?;
    let interp = match req.language.as_deref().unwrap_or("python") {
        "python" => "exec python3 -c \"$0\" \"$@\"",
        "javascript" => "exec node -e \"$0\" \"$@\"",
        "typescript" => return Err(DtError::unsupported("running TypeScript with code_run")),
        other => return Err(DtError::bad(format!("unknown language {other:?} (python, javascript)"))),
    };
    let mut args = vec![req.code];
    args.extend(req.argv.unwrap_or_default());
    let er = request(combined(interp, args), None, req.envs.unwrap_or_default(), req.timeout)?;
    let r = ops::exec(&st.app.manager, &tb.sb, er).await?;
    let timed_out = r.timed_out;
    let resp = finished(r, req.timeout)?;
    if timed_out {
        return Ok(resp);
    }
    // The same answer with Daytona's `artifacts`.
    let (parts, b) = resp.into_parts();
    let bytes = axum::body::to_bytes(b, usize::MAX).await.map_err(|e| DtError::bad(e.to_string()))?;
    let mut v: Value = serde_json::from_slice(&bytes).map_err(|e| DtError::bad(e.to_string()))?;
    v["artifacts"] = json!({ "stdout": v["result"], "charts": [] });
    Ok((parts, axum::Json(v)).into_response())
}

impl Daytona {
    /// Runs `f` on sandbox `id`'s sessions.
    fn with_sessions<T>(&self, id: &str, f: impl FnOnce(&mut Sessions) -> T) -> T {
        let mut all = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        // Forget the sessions of sandboxes that ended (bounded by the live count + this one).
        if all.len() > 2 * self.app.manager.live_count() + 16 {
            all.retain(|id, _| self.app.manager.get(id).is_ok());
        }
        f(all.entry(id.to_string()).or_default())
    }

    fn session(&self, id: &str, session: &str) -> Result<Vec<SessionCommand>, DtError> {
        self.with_sessions(id, |s| s.get(session).cloned()).ok_or_else(|| {
            DtError::daemon(StatusCode::NOT_FOUND, "SESSION_NOT_FOUND", format!("session {session} not found"))
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSession {
    session_id: String,
}

async fn create_session(State(st): State<Daytona>, tb: Tb, b: Bytes) -> Result<Response, DtError> {
    let req: NewSession = body(&b)?;
    if req.session_id.is_empty() {
        return Err(DtError::bad("sessionId must not be empty"));
    }
    let made = st.with_sessions(&tb.sb.id, |s| {
        if s.contains_key(&req.session_id) {
            return false;
        }
        s.insert(req.session_id.clone(), Vec::new());
        true
    });
    if !made {
        return Err(DtError::new(StatusCode::CONFLICT, format!("session {} already exists", req.session_id)));
    }
    Ok(StatusCode::CREATED.into_response())
}

/// The commands of a session with their exit codes (none while running).
async fn commands_view(st: &Daytona, tb: &Tb, cmds: &[SessionCommand]) -> Result<Vec<Value>, DtError> {
    let live = ops::list_commands(&st.app.manager, &tb.sb).await?;
    let exits: HashMap<u64, Option<i32>> = live.commands.iter().map(|c| (c.id, c.exit_code)).collect();
    Ok(cmds
        .iter()
        .map(|c| {
            json!({
                "id": c.id.to_string(),
                "command": c.command,
                "exitCode": exits.get(&c.id).copied().flatten(),
            })
        })
        .collect())
}

async fn get_session(
    State(st): State<Daytona>,
    tb: Tb,
    Path(p): Path<HashMap<String, String>>,
) -> Result<Response, DtError> {
    let name = p.get("session").cloned().unwrap_or_default();
    let cmds = st.session(&tb.sb.id, &name)?;
    let commands = commands_view(&st, &tb, &cmds).await?;
    Ok(axum::Json(json!({ "sessionId": name, "commands": commands })).into_response())
}

async fn list_sessions(State(st): State<Daytona>, tb: Tb) -> Result<Response, DtError> {
    let all = st.with_sessions(&tb.sb.id, |s| s.clone());
    let mut out = Vec::new();
    for (name, cmds) in &all {
        out.push(json!({ "sessionId": name, "commands": commands_view(&st, &tb, cmds).await? }));
    }
    Ok(axum::Json(out).into_response())
}

/// Deletes a session and kills its commands still running.
async fn delete_session(
    State(st): State<Daytona>,
    tb: Tb,
    Path(p): Path<HashMap<String, String>>,
) -> Result<Response, DtError> {
    let name = p.get("session").cloned().unwrap_or_default();
    let cmds = st.session(&tb.sb.id, &name)?;
    let live = ops::list_commands(&st.app.manager, &tb.sb).await?;
    for c in live.commands.iter().filter(|c| c.running && cmds.iter().any(|s| s.id == c.id)) {
        ops::signal(&st.app.manager, &tb.sb, c.id, 9).await?;
    }
    st.with_sessions(&tb.sb.id, |s| s.remove(&name));
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionExec {
    command: String,
    run_async: Option<bool>,
    #[serde(rename = "async")]
    is_async: Option<bool>,
}

/// Runs a command in a session: in the background (answered at once with its id) when
/// asked `runAsync`, else to its end (answered with its output).
async fn session_exec(
    State(st): State<Daytona>,
    tb: Tb,
    Path(p): Path<HashMap<String, String>>,
    b: Bytes,
) -> Result<Response, DtError> {
    let name = p.get("session").cloned().unwrap_or_default();
    st.session(&tb.sb.id, &name)?;
    let req: SessionExec = body(&b)?;
    if req.command.trim().is_empty() {
        return Err(DtError::bad("command must not be empty"));
    }
    let mut er = request(vec!["/bin/sh".into(), "-c".into(), req.command.clone()], None, BTreeMap::new(), None)?;
    er.background = true;
    let started = ops::exec_background(&st.app.manager, &tb.sb, er).await?;
    let id = started.id;
    st.with_sessions(&tb.sb.id, |s| {
        s.entry(name.clone()).or_default().push(SessionCommand { id, command: req.command.clone() })
    });
    if req.run_async == Some(true) || req.is_async == Some(true) {
        return Ok((StatusCode::ACCEPTED, axum::Json(json!({ "cmdId": id.to_string() }))).into_response());
    }
    let l = read_logs(&st, &tb, id, true).await?;
    Ok(axum::Json(json!({
        "cmdId": id.to_string(),
        "exitCode": l.exit,
        "output": text(&l.both),
        "stdout": text(&l.stdout),
        "stderr": text(&l.stderr),
    }))
    .into_response())
}

/// The session command named in the path.
fn command_in(st: &Daytona, tb: &Tb, p: &HashMap<String, String>) -> Result<SessionCommand, DtError> {
    let name = p.get("session").map_or("", String::as_str);
    let cmd = p.get("command").map_or("", String::as_str);
    st.session(&tb.sb.id, name)?.into_iter().find(|c| c.id.to_string() == cmd).ok_or_else(|| {
        DtError::daemon(
            StatusCode::NOT_FOUND,
            "PROCESS_NOT_FOUND",
            format!("command {cmd} not found in session {name}"),
        )
    })
}

async fn get_command(
    State(st): State<Daytona>,
    tb: Tb,
    Path(p): Path<HashMap<String, String>>,
) -> Result<Response, DtError> {
    let c = command_in(&st, &tb, &p)?;
    let v = commands_view(&st, &tb, std::slice::from_ref(&c)).await?;
    Ok(axum::Json(v.into_iter().next().unwrap_or(Value::Null)).into_response())
}

/// What a session command printed: stdout, stderr, both in the order they came, and its
/// exit code once it ended.
struct Logs {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    both: Vec<u8>,
    exit: Option<i32>,
}

/// Reads command `id`'s output from its start: to its end when `to_end`, else until it has
/// been quiet for `LOGS_QUIET` (or `LOGS_MAX` in all).
async fn read_logs(st: &Daytona, tb: &Tb, id: u64, to_end: bool) -> Result<Logs, DtError> {
    let stream = ops::attach(st.app.manager.clone(), tb.sb.clone(), id).await?;
    let mut stream = std::pin::pin!(stream);
    let mut logs = Logs { stdout: Vec::new(), stderr: Vec::new(), both: Vec::new(), exit: None };
    let until = tokio::time::Instant::now() + LOGS_MAX;
    loop {
        let item = if to_end {
            stream.next().await
        } else {
            let wait = (tokio::time::Instant::now() + LOGS_QUIET).min(until);
            match tokio::time::timeout_at(wait, stream.next()).await {
                Ok(item) => item,
                Err(_) => break,
            }
        };
        match item.transpose()? {
            Some(Output::Stdout(d)) => {
                logs.both.extend_from_slice(&d);
                logs.stdout.extend(d);
            }
            Some(Output::Stderr(d)) => {
                logs.both.extend_from_slice(&d);
                logs.stderr.extend(d);
            }
            Some(Output::Exited(e)) => {
                logs.exit = Some(e.exit_code);
                break;
            }
            None => break,
        }
    }
    Ok(logs)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A command's logs: what it printed so far (all of it once it ended); following logs
/// live is not served.
async fn command_logs(
    State(st): State<Daytona>,
    tb: Tb,
    Path(p): Path<HashMap<String, String>>,
) -> Result<Response, DtError> {
    let c = command_in(&st, &tb, &p)?;
    let l = read_logs(&st, &tb, c.id, false).await?;
    Ok(axum::Json(json!({ "output": text(&l.both), "stdout": text(&l.stdout), "stderr": text(&l.stderr) }))
        .into_response())
}

/// What a one-line shell command prints (trimmed), for the info endpoints.
async fn ask(st: &Daytona, tb: &Tb, script: &str) -> Result<String, DtError> {
    let r = ops::exec(&st.app.manager, &tb.sb, request(combined(script, Vec::new()), None, BTreeMap::new(), Some(10))?)
        .await?;
    if r.exit_code != 0 {
        return Err(DtError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{script}: {}", r.stdout.trim())));
    }
    Ok(r.stdout.trim().to_string())
}

async fn home_dir(State(st): State<Daytona>, tb: Tb) -> Result<Response, DtError> {
    Ok(axum::Json(json!({ "dir": ask(&st, &tb, "printf %s \"$HOME\"").await? })).into_response())
}

async fn work_dir(State(st): State<Daytona>, tb: Tb) -> Result<Response, DtError> {
    Ok(axum::Json(json!({ "dir": ask(&st, &tb, "pwd").await? })).into_response())
}

async fn version(_tb: Tb) -> Response {
    axum::Json(json!({ "version": concat!("glovebox-", env!("CARGO_PKG_VERSION")) })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_output_wraps_the_script() {
        let v = combined("echo hi", vec!["a".into()]);
        assert_eq!(v[0], "/bin/sh");
        assert_eq!(v[2], "exec 2>&1\necho hi");
        assert_eq!(v[3], "a");
        assert!(request(vec!["x".into()], None, BTreeMap::new(), Some(u64::MAX)).is_err());
    }
}
