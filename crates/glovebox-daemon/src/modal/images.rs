//! Images: each Modal image layer (a base image id plus Dockerfile commands, which the client
//! computes) is one Glovebox template, `modal-<hash>`, built by the template builder into the
//! layer store. The hash covers the translated spec (whose `FROM` names the parent's
//! template), its build arguments and context files, so an image asked for again is the
//! same template: `ImageGetOrCreate` answers at once with the built result (the client's
//! cache hit) and no step runs; a changed image reuses its unchanged steps' layers.
//!
//! `Image.debian_slim()` is the host's own `/usr` (Debian, with its python3), as Glovebox's
//! `base` template is: its Python series must be the host's, and Modal's set-up steps
//! (compilers from apt, a pip/uv upgrade) are not run — the host has them or not. It adds
//! `python` and `pip` commands and lets pip install into `/usr/local` (PEP 668 lifted).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use glovebox_proto::api::{BuildLine, BuildTemplate};
use sha2::Digest;
use tonic::{Request, Response, Status};

use super::pb::api;
use super::pb::api::generic_result::GenericStatus;
use super::{bounded_insert, caller_of, result, unsupported, Modal, Stream};
use crate::tenants::Caller;

/// Template names of Modal images start with this.
pub const PREFIX: &str = "modal-";
/// Most builds whose logs are kept.
const MAX_KEPT: usize = 256;
/// Longest one `ImageJoinStreaming` stream stays open (the client joins again after).
const MAX_JOIN_S: f32 = 55.0;

/// The steps `Image.debian_slim()` adds on Modal that the host's `/usr` stands for.
const DEBIAN_SLIM_SETUP: &[&str] = &[
    "RUN apt-get update",
    "RUN apt-get install -y gcc gfortran build-essential",
    "RUN echo 'debconf debconf/frontend select Noninteractive' | debconf-set-selections",
];

/// What `debian_slim` is here: the host's /usr, with `python`/`pip` and pip allowed to
/// install into /usr/local.
const HOST_PYTHON_BASE: &str = "FROM host
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN mkdir -p /usr/local/bin && ln -sf /usr/bin/python3 /usr/local/bin/python && printf '#!/bin/sh\\nexec python3 -m pip \"$@\"\\n' > /usr/local/bin/pip && chmod 755 /usr/local/bin/pip
";

/// One build: its log lines and, once it ended, its result.
struct Build {
    template: String,
    lines: Mutex<Vec<String>>,
    result: Mutex<Option<api::GenericResult>>,
    /// Bumped on every change.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Build {
    fn push(&self, line: String) {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        self.changed.send_modify(|n| *n += 1);
    }

    fn finish(&self, r: api::GenericResult) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.changed.send_modify(|n| *n += 1);
    }

    fn result(&self) -> Option<api::GenericResult> {
        self.result.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Default)]
pub struct Images {
    /// Image id → its latest build.
    builds: Mutex<HashMap<String, (u64, Arc<Build>)>>,
}

/// An image's translation: the Glovebox spec, its arguments and context.
#[derive(Debug, PartialEq)]
pub struct Spec {
    pub dockerfile: String,
    pub build_args: BTreeMap<String, String>,
    /// Context files (path inside the context, contents).
    pub context: Vec<(String, Vec<u8>)>,
    /// Whether the image is the host's /usr underneath (apt has nothing to work on).
    pub host_based: bool,
}

/// The template of image `id` (`im-<hash>` → `modal-<hash>`).
pub fn template_of(id: &str) -> Option<String> {
    let h = id.strip_prefix("im-")?;
    (h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("{PREFIX}{h}"))
}

/// The image id of a spec: a digest of everything that makes its template.
pub fn image_id(s: &Spec) -> String {
    let mut h = sha2::Sha256::new();
    h.update(b"glovebox-modal-image-v1\0");
    h.update(s.dockerfile.as_bytes());
    for (k, v) in &s.build_args {
        h.update(format!("\0{k}={v}").as_bytes());
    }
    for (p, d) in &s.context {
        h.update(format!("\0{p}\0{}\0", d.len()).as_bytes());
        h.update(d);
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("im-{}", &hex[..24])
}

/// Translates one Modal image layer. `parent` is the template of its `base` image (and
/// whether that one is host-based); `host_has_python(series)` says whether the host has
/// `/usr/bin/python<series>`.
pub fn translate(
    img: &api::Image,
    parent: Option<(&str, bool)>,
    secrets: BTreeMap<String, String>,
    host_has_python: &dyn Fn(&str) -> bool,
) -> Result<Spec, Status> {
    if img.build_function.is_some() || !img.build_function_def.is_empty() {
        return Err(unsupported("Image.run_function (build functions)"));
    }
    if img.gpu_config.as_ref().is_some_and(|g| g.count > 0 || !g.gpu_type.is_empty()) {
        return Err(unsupported("GPUs in image builds"));
    }
    if img.image_registry_config.as_ref().is_some_and(|r| !r.secret_id.is_empty()) {
        return Err(unsupported("private registries"));
    }
    if !img.volume_mounts.is_empty() {
        return Err(unsupported("Modal Volumes in image builds"));
    }
    if !img.context_mount_id.is_empty() {
        return Err(unsupported("local files in images (add_local_file, add_local_dir with copy=True)"));
    }
    let mut lines = img.dockerfile_commands.iter().map(|l| l.trim()).filter(|l| !l.is_empty());
    let from = lines.next().ok_or_else(|| Status::invalid_argument("an image needs Dockerfile commands"))?;
    let from = from
        .strip_prefix("FROM ")
        .or_else(|| from.strip_prefix("from "))
        .map(str::trim)
        .ok_or_else(|| Status::invalid_argument(format!("an image's first command must be FROM, got {from:?}")))?;
    let mut out = String::new();
    let mut debian_slim = false;
    let host_based;
    if from == "base" {
        let (t, host) = parent.ok_or_else(|| Status::invalid_argument("FROM base without a base image"))?;
        out.push_str(&format!("FROM {t}\n"));
        host_based = host;
    } else if let Some(series) = python_slim(from) {
        if !host_has_python(&series) {
            return Err(unsupported(&format!(
                "Image.debian_slim(python_version={series:?}) on this host: debian_slim is the host's own /usr and it has no python{series}; use the host's Python series"
            )));
        }
        out.push_str(HOST_PYTHON_BASE);
        debian_slim = true;
        host_based = true;
    } else {
        out.push_str(&format!("FROM {from}\n"));
        host_based = from == "host";
    }
    // Secrets are the build steps' environment: build arguments, never saved in the image.
    for k in secrets.keys() {
        out.push_str(&format!("ARG {k}\n"));
    }
    let mut build_args = secrets;
    for (k, v) in &img.build_args {
        build_args.insert(k.clone(), v.clone());
    }
    for l in lines {
        let word = l.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
        if debian_slim && (DEBIAN_SLIM_SETUP.contains(&l) || l.starts_with("RUN pip install --upgrade ")) {
            continue;
        }
        match word.as_str() {
            // Modal's CMD/ENTRYPOINT are a sandbox's default command; a Glovebox template's
            // CMD would start in every sandbox, so they are left out.
            "CMD" | "ENTRYPOINT" => continue,
            "RUN" if host_based && l.contains("apt-get") => {
                return Err(unsupported(
                    "apt-get (Image.apt_install) on Image.debian_slim, which is the host's own /usr here; install the packages on the host, or build from Image.from_registry(\"debian:bookworm-slim\")",
                ))
            }
            _ => {}
        }
        out.push_str(l);
        out.push('\n');
    }
    let mut context = Vec::new();
    for f in &img.context_files {
        let p = f.filename.trim_start_matches('/').to_string();
        if p.is_empty() || p.split('/').any(|c| c == "..") {
            return Err(Status::invalid_argument(format!("bad context file name {:?}", f.filename)));
        }
        context.push((p, f.data.clone()));
    }
    context.sort();
    Ok(Spec { dockerfile: out, build_args, context, host_based })
}

/// The Python series of Modal's debian_slim base (`python:3.11.12-slim-bookworm` → 3.11).
fn python_slim(from: &str) -> Option<String> {
    let rest = from.strip_prefix("python:")?;
    let (ver, tail) = rest.split_once("-slim")?;
    if !(tail.is_empty() || tail.starts_with('-')) {
        return None;
    }
    let mut parts = ver.split('.');
    let (a, b) = (parts.next()?, parts.next()?);
    (a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit())).then(|| format!("{a}.{b}"))
}

fn host_has_python(series: &str) -> bool {
    std::path::Path::new(&format!("/usr/bin/python{series}")).exists()
}

fn context_tar(files: &[(String, Vec<u8>)]) -> Result<Option<String>, Status> {
    use base64::Engine;
    if files.is_empty() {
        return Ok(None);
    }
    let mut b = tar::Builder::new(Vec::new());
    for (p, d) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(d.len() as u64);
        h.set_mtime(1);
        b.append_data(&mut h, p, &d[..]).map_err(|e| Status::invalid_argument(format!("context file {p}: {e}")))?;
    }
    let data = b.into_inner().map_err(|e| Status::invalid_argument(format!("context: {e}")))?;
    Ok(Some(base64::engine::general_purpose::STANDARD.encode(data)))
}

fn built(image_id: &str) -> api::ImageGetOrCreateResponse {
    api::ImageGetOrCreateResponse {
        image_id: image_id.to_string(),
        result: Some(result(GenericStatus::Success, 0, "")),
        metadata: Some(metadata()),
    }
}

fn metadata() -> api::ImageMetadata {
    api::ImageMetadata { image_builder_version: Some(super::apps::IMAGE_BUILDER_VERSION.into()), ..Default::default() }
}

impl Modal {
    /// The template a sandbox of image `id` starts from (`base` when none is given).
    pub(super) fn image_template(&self, _caller: &Caller, id: &str) -> Result<String, Status> {
        if id.is_empty() {
            return Ok("base".into());
        }
        let t = template_of(id).ok_or_else(|| Status::not_found(format!("image {id} not found")))?;
        match self.manager().template(&t) {
            Ok(_) => Ok(t),
            Err(_) => Err(Status::not_found(format!("image {id} is not built"))),
        }
    }
}

pub async fn get_or_create(
    m: &Modal,
    req: Request<api::ImageGetOrCreateRequest>,
) -> Result<Response<api::ImageGetOrCreateResponse>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    if !r.build_function_id.is_empty() {
        return Err(unsupported("Image.run_function (build functions)"));
    }
    let img = r.image.unwrap_or_default();
    let parent = match img.base_images.as_slice() {
        [] => None,
        [b] => {
            let t = m.image_template(&caller, &b.image_id)?;
            let host = m.manager().templates.store.load(&t).is_some_and(|t| t.host_usr);
            Some((t, host))
        }
        _ => return Err(unsupported("images with several base images")),
    };
    let mut secrets = BTreeMap::new();
    for id in &img.secret_ids {
        secrets.extend(m.inner.apps.secret(&caller, id)?);
    }
    let spec = translate(&img, parent.as_ref().map(|(t, h)| (t.as_str(), *h)), secrets, &host_has_python)?;
    let id = image_id(&spec);
    let template = template_of(&id).unwrap_or_default();
    let force = r.force_build || r.ignore_cache;
    if !force && m.manager().template(&template).is_ok() {
        tracing::info!(image = %id, "modal: image is built (template {template}): cache hit");
        return Ok(Response::new(built(&id)));
    }
    // A build of it under way: the client joins it.
    if let Some(b) = m.inner.images.builds.lock().unwrap_or_else(|p| p.into_inner()).get(&id).map(|(_, b)| b.clone()) {
        if b.result().is_none() {
            return Ok(Response::new(api::ImageGetOrCreateResponse { image_id: id, ..Default::default() }));
        }
    }
    if !caller.admin {
        return Err(Status::permission_denied(
            "building an image needs the daemon's admin key (builds reach the network, like `glovebox template build`); images built already can be used with any key",
        ));
    }
    let checked = crate::builds::check(BuildTemplate {
        name: template.clone(),
        dockerfile: spec.dockerfile.clone(),
        build_args: spec.build_args.clone(),
        no_cache: force,
        resources: Default::default(),
        isolation: None,
        context_tar_base64: context_tar(&spec.context)?,
    })
    .map_err(|f| unsupported(&format!("this image ({})", f.message)))?;
    let b = Arc::new(Build {
        template: template.clone(),
        lines: Mutex::default(),
        result: Mutex::default(),
        changed: tokio::sync::watch::Sender::new(0),
    });
    bounded_insert(
        &mut m.inner.images.builds.lock().unwrap_or_else(|p| p.into_inner()),
        id.clone(),
        b.clone(),
        MAX_KEPT,
    );
    tracing::info!(image = %id, "modal: building template {template}");
    let mgr = m.manager().clone();
    let image = id.clone();
    tokio::spawn(async move {
        let t0 = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<BuildLine>(256);
        let run = crate::builds::run(mgr, checked, tx);
        let b2 = b.clone();
        let follow = async move {
            let (mut steps, mut cached) = (0usize, 0usize);
            while let Some(l) = rx.recv().await {
                match l {
                    BuildLine::Step { step, total, instruction, cached: c, .. } => {
                        steps += 1;
                        cached += usize::from(c);
                        b2.push(format!("=> step {step}/{total}: {instruction}{}\n", if c { " (cached)" } else { "" }));
                    }
                    BuildLine::Output { data, .. } => b2.push(data),
                    BuildLine::Base { message } => b2.push(format!("=> {message}\n")),
                    BuildLine::Done { .. } | BuildLine::Error { .. } => {}
                }
            }
            (steps, cached)
        };
        let (res, (steps, cached)) = tokio::join!(run, follow);
        let secs = t0.elapsed().as_secs_f64();
        match res {
            Ok(_) => {
                tracing::info!(image = %image, "modal: built template {} in {secs:.2}s ({cached} of {steps} steps cached)", b.template);
                b.push(format!("=> built {image} in {secs:.1}s\n"));
                b.finish(result(GenericStatus::Success, 0, ""));
            }
            Err(f) => {
                let at = f.step.map(|s| format!("step {s}: ")).unwrap_or_default();
                let code = f.exit_code.map(|c| format!(" (exit code {c})")).unwrap_or_default();
                let msg = format!("{at}{}{code}", f.message);
                tracing::warn!(image = %image, "modal: build of template {} failed: {msg}", b.template);
                b.push(format!("=> build failed: {msg}\n{}", f.output_tail));
                b.finish(result(GenericStatus::Failure, 1, &format!("{msg}\n{}", f.output_tail)));
            }
        }
    });
    Ok(Response::new(api::ImageGetOrCreateResponse { image_id: id, ..Default::default() }))
}

/// The build's log from after `last_entry_id`, live, then its result; the stream ends with
/// the result or after `timeout` seconds (the client joins again).
pub fn join_streaming(
    m: &Modal,
    req: Request<api::ImageJoinStreamingRequest>,
) -> Result<Response<Stream<api::ImageJoinStreamingResponse>>, Status> {
    let caller = caller_of(&req)?;
    let r = req.into_inner();
    let build =
        m.inner.images.builds.lock().unwrap_or_else(|p| p.into_inner()).get(&r.image_id).map(|(_, b)| b.clone());
    let Some(b) = build else {
        // Built before this daemon started (or its log was forgotten): only the result.
        m.image_template(&caller, &r.image_id)?;
        let done = api::ImageJoinStreamingResponse {
            result: Some(result(GenericStatus::Success, 0, "")),
            eof: true,
            metadata: Some(metadata()),
            ..Default::default()
        };
        return Ok(Response::new(Box::pin(futures_util::stream::iter([Ok(done)]))));
    };
    let start: usize = r.last_entry_id.parse::<usize>().map_or(0, |n| n + 1);
    let limit =
        std::time::Duration::from_secs_f32(if r.timeout > 0.0 { r.timeout.min(MAX_JOIN_S) } else { MAX_JOIN_S });
    let deadline = tokio::time::Instant::now() + limit;
    let rx = b.changed.subscribe();
    let s = futures_util::stream::unfold((b, rx, start, false), move |(b, mut rx, next, done)| async move {
        if done {
            return None;
        }
        loop {
            rx.borrow_and_update();
            let lines: Vec<String> = b
                .lines
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(next..)
                .map(<[String]>::to_vec)
                .unwrap_or_default();
            if !lines.is_empty() {
                let last = next + lines.len() - 1;
                let task_logs = lines
                    .into_iter()
                    .map(|data| api::TaskLogs {
                        data,
                        file_descriptor: api::FileDescriptor::Stdout as i32,
                        timestamp: super::now_s(),
                        ..Default::default()
                    })
                    .collect();
                let resp =
                    api::ImageJoinStreamingResponse { task_logs, entry_id: last.to_string(), ..Default::default() };
                return Some((Ok(resp), (b, rx, last + 1, false)));
            }
            if let Some(res) = b.result() {
                let resp = api::ImageJoinStreamingResponse {
                    result: Some(res),
                    eof: true,
                    metadata: Some(metadata()),
                    ..Default::default()
                };
                return Some((Ok(resp), (b, rx, next, true)));
            }
            tokio::select! {
                c = rx.changed() => if c.is_err() { return None },
                _ = tokio::time::sleep_until(deadline) => return None,
            }
        }
    });
    Ok(Response::new(Box::pin(s)))
}

pub fn from_id(m: &Modal, req: Request<api::ImageFromIdRequest>) -> Result<Response<api::ImageFromIdResponse>, Status> {
    let caller = caller_of(&req)?;
    let id = req.into_inner().image_id;
    m.image_template(&caller, &id)?;
    Ok(Response::new(api::ImageFromIdResponse { image_id: id, metadata: Some(metadata()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(cmds: &[&str]) -> api::Image {
        api::Image { dockerfile_commands: cmds.iter().map(|s| s.to_string()).collect(), ..Default::default() }
    }

    const SLIM: &[&str] = &[
        "FROM python:3.11.12-slim-bookworm",
        "RUN apt-get update",
        "RUN apt-get install -y gcc gfortran build-essential",
        "RUN pip install --upgrade pip wheel uv",
        "RUN echo 'debconf debconf/frontend select Noninteractive' | debconf-set-selections",
        "CMD [\"sleep\", \"172800\"]",
    ];

    #[test]
    fn debian_slim_is_the_hosts_python() {
        let s = translate(&image(SLIM), None, BTreeMap::new(), &|v| v == "3.11").unwrap();
        assert_eq!(s.dockerfile, HOST_PYTHON_BASE);
        assert!(s.host_based);
        let e = translate(&image(SLIM), None, BTreeMap::new(), &|_| false).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("python_version=\"3.11\""), "{}", e.message());
        assert_eq!(python_slim("python:3.12.10-slim-trixie").as_deref(), Some("3.12"));
        assert_eq!(python_slim("python:3.12"), None);
    }

    #[test]
    fn layers_chain_through_their_parent_template() {
        let img = image(&["FROM base", "RUN python -m pip install pandas", "ENV A='b c'", "WORKDIR /app"]);
        let s = translate(&img, Some(("modal-aaa", true)), BTreeMap::new(), &|_| true).unwrap();
        assert_eq!(s.dockerfile, "FROM modal-aaa\nRUN python -m pip install pandas\nENV A='b c'\nWORKDIR /app\n");
        let other = translate(&img, Some(("modal-bbb", true)), BTreeMap::new(), &|_| true).unwrap();
        assert_ne!(image_id(&s), image_id(&other), "the parent is part of the id");
        assert_eq!(
            image_id(&s),
            image_id(&translate(&img, Some(("modal-aaa", true)), BTreeMap::new(), &|_| true).unwrap())
        );
        assert!(template_of(&image_id(&s)).unwrap().starts_with(PREFIX));
        assert_eq!(template_of("im-../../etc"), None);
    }

    #[test]
    fn apt_on_the_host_base_is_refused_by_name() {
        let img = image(&["FROM base", "RUN apt-get update", "RUN apt-get install -y cowsay"]);
        let e = translate(&img, Some(("modal-aaa", true)), BTreeMap::new(), &|_| true).unwrap_err();
        assert!(e.message().contains("apt_install"), "{}", e.message());
        // On a Debian root, apt is the image's own.
        assert!(translate(&img, Some(("modal-deb", false)), BTreeMap::new(), &|_| true).is_ok());
    }

    #[test]
    fn secrets_are_build_arguments() {
        let img = image(&["FROM base", "RUN echo $TOKEN"]);
        let secrets = BTreeMap::from([("TOKEN".to_string(), "s3cret".to_string())]);
        let s = translate(&img, Some(("modal-aaa", true)), secrets, &|_| true).unwrap();
        assert_eq!(s.dockerfile, "FROM modal-aaa\nARG TOKEN\nRUN echo $TOKEN\n");
        assert_eq!(s.build_args.get("TOKEN").map(String::as_str), Some("s3cret"));
    }

    #[test]
    fn build_functions_and_mounts_are_refused() {
        let mut img = image(&["FROM base", "RUN true"]);
        img.context_mount_id = "mo-1".into();
        assert!(translate(&img, Some(("modal-a", true)), BTreeMap::new(), &|_| true)
            .unwrap_err()
            .message()
            .contains("add_local_file"));
    }
}
