//! The code interpreter's operations on a sandbox: creating contexts, running cells (whole
//! or streamed), with the metrics they count. The kernels themselves are in `kernels`.

use std::sync::Arc;
use std::time::Duration;

use glovebox_proto::api::{CodeError, CodeStreamLine, Language};

use crate::error::{Error, Result};
use crate::kernels::{Host, Kernel, Target};
use crate::manager::{Manager, Sb};

/// A sandbox as its kernels see it.
struct InSandbox<'a> {
    m: &'a Manager,
    sb: &'a Sb,
}

impl Host for InSandbox<'_> {
    fn target(&self) -> Target<'_> {
        self.sb.target()
    }
    fn base_env(&self) -> std::collections::BTreeMap<String, String> {
        self.sb.base_env()
    }
    fn broken(&self, e: String) -> Error {
        self.m.agent_error(&self.sb.id, e)
    }
    fn oom_killed(&self) -> bool {
        self.sb.oom_kills() > 0
    }
}

/// Starts a new context of `language` in the sandbox (working directory `cwd`, else the
/// home) and registers it; an agent that died meanwhile is reported as the sandbox's end.
pub async fn create_context(m: &Manager, sb: &Sb, language: Language, cwd: Option<String>) -> Result<Arc<Kernel>> {
    let id = format!("ctx-{}", crate::util::random_token(12));
    let k = Arc::new(Kernel::new(id, language, cwd, sb.preload.as_deref()));
    k.ensure(&sb.target()).await.map_err(|e| match e {
        Error::Agent(msg) => m.agent_error(&sb.id, msg),
        e => e,
    })?;
    sb.kernels.insert(k.clone());
    Ok(k)
}

fn context_for(sb: &Sb, req: &glovebox_proto::api::RunCode) -> Result<Arc<Kernel>> {
    match &req.context_id {
        Some(id) => sb.kernels.get(id).ok_or_else(|| Error::NotFound { what: "context", name: id.clone() }),
        None => Ok(sb.kernels.default_for(req.language.unwrap_or_default(), sb.preload.as_deref())),
    }
}

/// How long a cell may run. An unbounded budget (`0`) gets the longest a sandbox may be
/// given at once: the sandbox's own end comes first unless its lifetime was extended.
fn cell_timeout(req: &glovebox_proto::api::RunCode) -> Duration {
    req.timeout_ms.unwrap_or_default().limit().unwrap_or(Duration::from_secs(glovebox_proto::api::MAX_TIMEOUT_S))
}

/// Runs a cell and collects everything into an `Execution`.
pub async fn run_code(
    m: &Manager,
    sb: &Sb,
    req: glovebox_proto::api::RunCode,
) -> Result<glovebox_proto::api::Execution> {
    let k = context_for(sb, &req)?;
    let timeout = cell_timeout(&req);
    let t = std::time::Instant::now();
    let mut ex = glovebox_proto::api::Execution::default();
    let end = k
        .run(&InSandbox { m, sb }, &req.code, &req.env, timeout, |line| match line {
            CodeStreamLine::Stdout { text } => ex.logs.stdout.push(text),
            CodeStreamLine::Stderr { text } => ex.logs.stderr.push(text),
            CodeStreamLine::Result(r) => ex.results.push(r),
            CodeStreamLine::Error(e) => ex.error = Some(e),
            CodeStreamLine::End { .. } => {}
        })
        .await?;
    ex.execution_count = end.execution_count;
    ex.context_restarted = end.context_restarted;
    crate::metrics::Metrics::inc(&m.metrics.cells);
    if ex.error.is_some() {
        crate::metrics::Metrics::inc(&m.metrics.cell_errors);
    }
    m.metrics.code_latency.observe(t.elapsed());
    Ok(ex)
}

/// The NDJSON stream of a cell: its events as they happen, then `end`.
pub fn run_code_stream(
    m: Arc<Manager>,
    sb: Arc<Sb>,
    req: glovebox_proto::api::RunCode,
) -> Result<impl futures_util::Stream<Item = std::result::Result<bytes::Bytes, std::io::Error>>> {
    let k = context_for(&sb, &req)?;
    let timeout = cell_timeout(&req);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<CodeStreamLine>();
    tokio::spawn(async move {
        let tx2 = tx.clone();
        let host = InSandbox { m: &m, sb: &sb };
        let end = k.run(&host, &req.code, &req.env, timeout, move |l| {
            let _ = tx2.send(l);
        });
        // A client that goes away (its own timeout, a dropped connection) stops its cell: the
        // wait ends and the kernel is interrupted, so the context is free for the next cell.
        let end = tokio::select! {
            end = end => end,
            _ = tx.closed() => {
                k.interrupt(&sb.target()).await;
                return;
            }
        };
        let last = match end {
            Ok(e) => CodeStreamLine::End { execution_count: e.execution_count, context_restarted: e.context_restarted },
            Err(e) => CodeStreamLine::Error(CodeError {
                name: "GloveboxError".into(),
                value: e.into_detail().message,
                traceback: String::new(),
            }),
        };
        let _ = tx.send(last);
    });
    use futures_util::StreamExt;
    Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(|l| {
        let mut v = serde_json::to_vec(&l).unwrap_or_default();
        v.push(b'\n');
        Ok(bytes::Bytes::from(v))
    }))
}
