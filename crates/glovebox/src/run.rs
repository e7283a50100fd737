//! `glovebox run`: create a sandbox, copy files in, run one command with its output
//! streamed to this terminal, destroy the sandbox, exit with the command's code.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use base64::Engine;
use clap::Args;
use glovebox_proto::api::{self, CreateSandbox, Encoding, ExecRequest, ExecStreamLine, FileInfo};
use reqwest::Method;

use crate::client::Client;
use crate::embedded::Embedded;
use crate::{kv, units, LimitArgs, EXIT_ERROR, EXIT_TIMEOUT};

/// Largest stdin `run` forwards (it is read before the command starts).
const MAX_STDIN: usize = 16 << 20;

#[derive(Args)]
pub struct RunArgs {
    /// Time budget of the command, e.g. 2s, 500ms, 5m (default 60s; 0 = only the sandbox
    /// lifetime bounds it).
    #[arg(long)]
    timeout: Option<String>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    net: crate::NetArgs,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Copy a local file in first: LOCAL[:PATH] (default PATH: /home/user/<name>).
    #[arg(long = "file", value_name = "LOCAL[:PATH]")]
    files: Vec<String>,
    /// Working directory inside the sandbox (default /home/user).
    #[arg(long)]
    cwd: Option<String>,
    /// Data directory for the embedded daemon.
    #[arg(long, default_value = "/var/lib/glovebox", env = "GLOVEBOX_DATA_DIR")]
    data_dir: PathBuf,
    /// Template to start from (`base`, `code-interpreter`, …).
    #[arg(long)]
    template: Option<String>,
    /// Which kernel the command runs on: process (the jail) or gvisor.
    #[arg(long)]
    isolation: Option<String>,
    /// Run this code in a code-interpreter context instead of a command (`-` reads stdin).
    #[arg(long, conflicts_with = "cmd")]
    code: Option<String>,
    /// Language of `--code`: python, javascript or bash.
    #[arg(long, default_value = "python", requires = "code")]
    language: String,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required_unless_present = "code", value_name = "CMD")]
    cmd: Vec<String>,
}

pub async fn run(a: RunArgs) -> Result<i32> {
    let budget = a.timeout.as_deref().map(units::budget).transpose()?.unwrap_or_default();
    let resources = a.limits.resources()?;
    let env = kv(&a.env, "--env")?;
    let files = a.files.iter().map(|f| parse_file_arg(f)).collect::<Result<Vec<_>>>()?;
    let code = match a.code.as_deref() {
        Some("-") => Some(String::from_utf8(read_stdin()?.unwrap_or_default()).context("code on stdin is not UTF-8")?),
        Some(c) => Some(c.to_string()),
        None => None,
    };
    let language: api::Language = serde_json::from_value(serde_json::Value::String(a.language.clone()))
        .map_err(|_| anyhow::anyhow!("--language must be python, javascript, typescript, r, java or bash"))?;
    let stdin = if code.is_some() { None } else { read_stdin()? };

    let (client, embedded) = match std::env::var("GLOVEBOX_URL") {
        Ok(_) => (crate::remote()?, None),
        Err(_) => {
            let e = Embedded::start(&a.data_dir).await?;
            (e.client()?, Some(e))
        }
    };
    // The sandbox outlives the command's budget a little, so the command's own timeout
    // (exit 124) is what ends a runaway, not the sandbox clock.
    let life_s = if budget.limit().is_none() { api::DEFAULT_TIMEOUT_S } else { budget.as_ms().div_ceil(1000) + 30 };
    let req = CreateSandbox {
        template: a.template.clone(),
        timeout_s: Some(life_s.min(api::MAX_TIMEOUT_S)),
        resources,
        env,
        metadata: Default::default(),
        network: a.net.policy()?,
        idle_timeout_s: None,
        on_idle: None,
        volumes: Vec::new(),
        auto_resume: None,
        snapshot: None,
        isolation: crate::parse_isolation(a.isolation.as_deref())?,
    };
    let result = async {
        let sb = client.create(&req).await?;
        let r = async {
            for (local, path) in &files {
                upload(&client, &sb.id, local, path).await?;
            }
            if let Some(code) = &code {
                let req = api::RunCode {
                    code: code.clone(),
                    language: Some(language),
                    context_id: None,
                    timeout_ms: Some(budget),
                    env: Default::default(),
                };
                return code_to_terminal(&client, &sb.id, &req).await;
            }
            let exec = ExecRequest {
                cmd: api::Command::Argv(a.cmd.clone()),
                cwd: a.cwd.clone(),
                env: Default::default(),
                stdin: None,
                stdin_base64: stdin.map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
                timeout_ms: Some(budget),
                max_output_bytes: None,
                output_tail_bytes: None,
                encoding: Encoding::Base64,
                background: false,
            };
            stream_to_terminal(&client, &sb.id, &exec).await
        }
        .await;
        let _ = client.kill(&sb.id).await;
        r
    }
    .await;
    if let Some(e) = embedded {
        e.stop().await;
    }
    result
}

fn parse_file_arg(s: &str) -> Result<(PathBuf, String)> {
    let (local, path) = match s.split_once(':') {
        Some((l, p)) if !p.is_empty() => (PathBuf::from(l), p.to_string()),
        _ => {
            let l = PathBuf::from(s);
            let name = l.file_name().context("--file needs a file name")?.to_string_lossy().into_owned();
            (l, format!("/home/user/{name}"))
        }
    };
    if !local.is_file() {
        bail!("--file {}: not a readable file", local.display());
    }
    Ok((local, path))
}

fn read_stdin() -> Result<Option<Vec<u8>>> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(None);
    }
    let mut buf = Vec::new();
    let n = stdin.by_ref().take(MAX_STDIN as u64 + 1).read_to_end(&mut buf).context("read stdin")?;
    if n > MAX_STDIN {
        bail!("stdin is larger than {} MiB; pass data with --file instead", MAX_STDIN >> 20);
    }
    Ok(Some(buf))
}

pub async fn upload(client: &Client, id: &str, local: &Path, path: &str) -> Result<FileInfo> {
    let f = tokio::fs::File::open(local).await.with_context(|| format!("open {}", local.display()))?;
    let len = f.metadata().await?.len();
    let body = reqwest::Body::wrap_stream(tokio_util_stream(f));
    let rb = client
        .req(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", path)])
        .header("content-length", len)
        .body(body);
    client.json(rb).await.with_context(|| format!("upload {} to {path}", local.display()))
}

fn tokio_util_stream(
    f: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    futures_util::stream::unfold(f, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
}

/// Streams a command's output to stdout/stderr; returns the exit code to exit with.
pub async fn stream_to_terminal(client: &Client, id: &str, req: &ExecRequest) -> Result<i32> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut code = EXIT_ERROR;
    client
        .exec_stream(id, req, |line| {
            match line {
                ExecStreamLine::Started { .. } => {}
                ExecStreamLine::Stdout { data } => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&b64.decode(data).context("bad output encoding")?)?;
                    o.flush()?;
                }
                ExecStreamLine::Stderr { data } => {
                    let mut e = std::io::stderr().lock();
                    e.write_all(&b64.decode(data).context("bad output encoding")?)?;
                    e.flush()?;
                }
                ExecStreamLine::Exited(r) => {
                    if r.stdout_truncated {
                        eprintln!(
                            "glovebox: stdout truncated: {} bytes written, first and last parts kept",
                            r.stdout_bytes
                        );
                    }
                    if r.stderr_truncated {
                        eprintln!(
                            "glovebox: stderr truncated: {} bytes written, first and last parts kept",
                            r.stderr_bytes
                        );
                    }
                    if r.oom_killed {
                        eprintln!("glovebox: the sandbox ran out of memory (a process was killed)");
                    }
                    code = if r.timed_out {
                        eprintln!("glovebox: command timed out after {} ms", r.duration_ms);
                        EXIT_TIMEOUT
                    } else {
                        r.exit_code
                    };
                }
                ExecStreamLine::Error { error } => {
                    bail!("{} ({})", error.message, error.code);
                }
            }
            Ok(())
        })
        .await?;
    Ok(code)
}

/// Runs a cell and prints it like a notebook would: output as it comes, then results
/// (text/plain; other MIME types summarised), the error's traceback on stderr.
/// Exit code: 0, 1 on an error in the code, 124 on timeout.
pub async fn code_to_terminal(client: &Client, id: &str, req: &api::RunCode) -> Result<i32> {
    use futures_util::StreamExt;
    let resp = client
        .send(
            client
                .req(Method::POST, &format!("/v1/sandboxes/{id}/code"))
                .header("accept", "application/x-ndjson")
                .json(req),
        )
        .await?;
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut code = 0;
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.context("reading the cell's output")?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let l: api::CodeStreamLine = serde_json::from_slice(&line).context("bad stream line from the daemon")?;
            match l {
                api::CodeStreamLine::Stdout { text } => {
                    print!("{text}");
                    std::io::stdout().flush()?;
                }
                api::CodeStreamLine::Stderr { text } => eprint!("{text}"),
                api::CodeStreamLine::Result(r) => {
                    let mut others: Vec<&str> =
                        r.data.keys().map(String::as_str).filter(|k| *k != "text/plain").collect();
                    others.sort_unstable();
                    if let Some(t) = r.data.get("text/plain").and_then(|v| v.as_str()) {
                        if r.is_main_result || others.is_empty() {
                            println!("{t}");
                        }
                    }
                    if !others.is_empty() {
                        eprintln!("glovebox: result with {}", others.join(", "));
                    }
                }
                api::CodeStreamLine::Error(e) => {
                    if e.traceback.trim().is_empty() {
                        eprintln!("{}: {}", e.name, e.value);
                    } else {
                        eprintln!("{}", e.traceback.trim_end());
                    }
                    code = if e.name == "TimeoutError" { EXIT_TIMEOUT } else { 1 };
                    if e.name == "GloveboxError" {
                        code = EXIT_ERROR;
                    }
                }
                api::CodeStreamLine::End { context_restarted, .. } => {
                    if context_restarted {
                        eprintln!("glovebox: the context was restarted (its state is lost)");
                    }
                }
            }
        }
    }
    Ok(code)
}
