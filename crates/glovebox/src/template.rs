//! `glovebox template …`: build, list, remove templates and collect unused layers. Like
//! `run`, it uses the daemon at `$GLOVEBOX_URL`; without it, the local daemon if one answers
//! at the default address with the data dir's key, else the daemon embedded in this process
//! on the data dir (no daemon to start, no key to set). A build prints one line per step (`Step 2/5 : RUN …`, `(cached)` when its
//! layer is reused) and the step's output; exit code 1 when the build fails, 125 when
//! Glovebox itself fails.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use base64::Engine;
use clap::Subcommand;
use futures_util::StreamExt;
use glovebox_proto::api::{BuildLine, BuildTemplate, Resources, TemplateInfo, TemplateList};
use reqwest::Method;

use crate::client::Client;
use crate::embedded::Embedded;
use crate::units;

#[derive(Subcommand)]
pub enum TemplateCmd {
    /// Build a template from a spec (a Dockerfile subset).
    Build {
        /// The spec file.
        #[arg(short = 'f', long = "file", default_value = "Dockerfile")]
        file: PathBuf,
        /// The template's name.
        #[arg(short = 't', long = "tag")]
        name: String,
        /// Default CPU quota of its sandboxes.
        #[arg(long)]
        cpus: Option<f64>,
        /// Default memory of its sandboxes, e.g. 1G.
        #[arg(long)]
        memory: Option<String>,
        /// Default disk cap of its sandboxes, e.g. 2G.
        #[arg(long)]
        disk: Option<String>,
        /// Rebuild every step.
        #[arg(long)]
        no_cache: bool,
        /// Default isolation of its sandboxes: process or gvisor.
        #[arg(long)]
        isolation: Option<String>,
        /// A value for an ARG of the spec.
        #[arg(long = "build-arg", value_name = "K=V")]
        build_args: Vec<String>,
        /// The directory COPY reads from (sent to the daemon as a tar).
        context: Option<PathBuf>,
    },
    /// List built templates.
    Ls,
    /// Remove a template (refused while sandboxes run from it) and its unused layers.
    Rm { name: String },
    /// Remove every layer no template and no sandbox uses.
    Gc,
}

pub async fn run(c: TemplateCmd) -> Result<i32> {
    let (client, embedded) = connect().await?;
    let r = command(&client, c).await;
    if let Some(e) = embedded {
        e.stop().await;
    }
    r
}

/// The daemon to talk to, and the embedded one to stop afterwards if that is what it is.
async fn connect() -> Result<(Client, Option<Embedded>)> {
    if std::env::var_os("GLOVEBOX_URL").is_some() {
        return Ok((crate::remote()?, None));
    }
    if let Ok(client) = crate::remote() {
        if client.send(client.req(Method::GET, "/healthz")).await.is_ok() {
            return Ok((client, None));
        }
    }
    let data_dir =
        std::env::var_os("GLOVEBOX_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/lib/glovebox".into());
    eprintln!("no daemon answers at 127.0.0.1:7171: working on {} directly", data_dir.display());
    let e = Embedded::start(&data_dir).await?;
    Ok((e.client()?, Some(e)))
}

async fn command(client: &Client, c: TemplateCmd) -> Result<i32> {
    match c {
        TemplateCmd::Build { file, name, cpus, memory, disk, no_cache, build_args, context, isolation } => {
            let dockerfile = std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
            let context_tar_base64 = match &context {
                Some(dir) => Some(base64::engine::general_purpose::STANDARD.encode(tar_dir(dir)?)),
                None => None,
            };
            let req = BuildTemplate {
                name,
                dockerfile,
                build_args: crate::kv(&build_args, "--build-arg")?,
                no_cache,
                resources: Resources {
                    cpus,
                    memory_mb: memory.as_deref().map(units::size_mb).transpose()?,
                    disk_mb: disk.as_deref().map(units::size_mb).transpose()?,
                    pids: None,
                },
                context_tar_base64,
                isolation: crate::parse_isolation(isolation.as_deref())?,
            };
            build(client, &req).await
        }
        TemplateCmd::Ls => {
            let l: TemplateList = client.json(client.req(Method::GET, "/v1/templates")).await?;
            println!("{:<24} {:<28} {:>7} {:>10} {:>9}  CREATED", "NAME", "BASE", "LAYERS", "SIZE", "SANDBOXES");
            for t in l.templates {
                println!(
                    "{:<24} {:<28} {:>7} {:>9}M {:>9}  {}",
                    t.name,
                    t.base,
                    t.layers.len(),
                    t.size_bytes >> 20,
                    t.sandboxes,
                    t.created_at
                );
            }
            Ok(0)
        }
        TemplateCmd::Rm { name } => {
            let v: serde_json::Value =
                client.json(client.req(Method::DELETE, &format!("/v1/templates/{name}"))).await?;
            println!("removed {name} ({} MiB of layers freed)", v["freed_bytes"].as_u64().unwrap_or(0) >> 20);
            Ok(0)
        }
        TemplateCmd::Gc => {
            let v: serde_json::Value = client.json(client.req(Method::POST, "/v1/templates/gc")).await?;
            println!("freed {} MiB", v["freed_bytes"].as_u64().unwrap_or(0) >> 20);
            Ok(0)
        }
    }
}

/// Streams a build, printing progress; 0 when the template was saved, 1 when it failed.
async fn build(client: &Client, req: &BuildTemplate) -> Result<i32> {
    let resp = client
        .send(client.req(Method::POST, "/v1/templates").header("accept", "application/x-ndjson").json(req))
        .await?;
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    // Not locked across the stream: an embedded daemon in this process logs to stderr too.
    let mut err = std::io::stderr();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.context("reading the build log")?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let l: BuildLine = serde_json::from_slice(&line).context("bad build log line from the daemon")?;
            match l {
                BuildLine::Base { message } => writeln!(err, "FROM: {message}")?,
                BuildLine::Step { step, total, instruction, cached, .. } => {
                    writeln!(err, "Step {step}/{total} : {instruction}{}", if cached { " (cached)" } else { "" })?
                }
                BuildLine::Output { data, .. } => {
                    err.write_all(data.as_bytes())?;
                    err.flush()?;
                }
                BuildLine::Done { template, seconds } => {
                    print_done(&template, seconds);
                    return Ok(0);
                }
                BuildLine::Error { step, line, exit_code, message, output_tail } => {
                    let at = match (step, line) {
                        (Some(s), Some(l)) if s > 0 => format!(" at step {s} (line {l})"),
                        (Some(s), _) if s > 0 => format!(" at step {s}"),
                        _ => String::new(),
                    };
                    let code = exit_code.map(|c| format!(", exit code {c}")).unwrap_or_default();
                    writeln!(err, "glovebox: build failed{at}{code}: {message}")?;
                    if !output_tail.is_empty() {
                        writeln!(err, "--- last output ---\n{output_tail}")?;
                    }
                    return Ok(1);
                }
            }
        }
    }
    bail!("the daemon ended the build log before the build finished")
}

fn print_done(t: &TemplateInfo, seconds: f64) {
    println!(
        "built template {} ({} layer{}, {} MiB) in {seconds:.1} s",
        t.name,
        t.layers.len(),
        if t.layers.len() == 1 { "" } else { "s" },
        t.size_bytes >> 20
    );
}

/// The context directory as a tar (symlinks stored as links, never followed).
fn tar_dir(dir: &std::path::Path) -> Result<Vec<u8>> {
    if !dir.is_dir() {
        bail!("build context {} is not a directory", dir.display());
    }
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir).with_context(|| format!("pack the build context {}", dir.display()))?;
    let v = b.into_inner().context("pack the build context")?;
    if v.len() > 12 << 20 {
        bail!("the build context is {} MiB; at most 12 MiB is accepted", v.len() >> 20);
    }
    Ok(v)
}
