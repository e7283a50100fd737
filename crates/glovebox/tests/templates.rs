//! Templates end to end: build from a spec through the CLI and the API, start sandboxes from
//! the result. Debian bases come from debootstrap once per target dir (the harness points
//! every daemon at one base cache), so only the first run of the suite downloads them.
//! Build steps reach the package registries (PyPI, the Debian archive); the sandboxes made
//! from templates never reach anything (deny-all).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{run_bounded, Daemon};
use serde_json::json;

/// `glovebox template build` through the CLI; returns (exit code, stdout, stderr).
fn cli_build(
    d: &Daemon,
    dockerfile: &Path,
    name: &str,
    extra: &[&str],
    ctx: Option<&Path>,
    limit: Duration,
) -> (i32, String, String) {
    let mut c = d.cli();
    c.args(["template", "build", "-f"]).arg(dockerfile).args(["-t", name]).args(extra);
    if let Some(ctx) = ctx {
        c.arg(ctx);
    }
    let o = run_bounded(&mut c, None, limit);
    (o.code().unwrap_or(-1), o.stdout_str(), o.stderr_str())
}

fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

fn repo_file(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn create(d: &Daemon, template: &str) -> String {
    d.create(json!({ "template": template, "timeout_s": 300 }))
}

#[test]
fn python_template_from_debian_builds_caches_and_installs_from_pypi() {
    require_root!();
    let d = Daemon::start();
    let work = common::tempdir("gbtest-tpl-");
    // From a fresh data dir: progress per step, success.
    let t = Instant::now();
    let (code, out, err) =
        cli_build(&d, &repo_file("templates/python/Dockerfile"), "python", &[], None, Duration::from_secs(900));
    assert_eq!(code, 0, "build failed:\n{out}\n{err}");
    eprintln!("python template built in {:.1} s", t.elapsed().as_secs_f64());
    assert!(err.contains("Step 1/3 : RUN apt-get update"), "{err}");
    assert!(err.contains("Step 3/3 : WORKDIR /home/user"), "{err}");
    assert!(out.contains("built template python"), "{out}");
    let id = create(&d, "python");
    let v = d.exec(&id, json!({ "cmd": ["python3", "-c", "import sys; print(sys.version)"] }));
    assert_eq!(v["exit_code"], 0, "{v}");
    assert!(v["stdout"].as_str().unwrap().starts_with("3.11"), "{v}");
    // A Debian root, not the host's /usr.
    let os = d.sh_ok(&id, "cat /etc/debian_version; pwd; test -x /usr/bin/pip3 && echo pip");
    assert!(os.starts_with("12."), "{os}");
    assert!(os.contains("/home/user\npip"), "{os}");
    d.delete(&format!("/v1/sandboxes/{id}"));

    // Rebuilding is a cache hit: every filesystem step cached, seconds at most.
    let t = Instant::now();
    let (code, _, err) =
        cli_build(&d, &repo_file("templates/python/Dockerfile"), "python", &[], None, Duration::from_secs(60));
    let took = t.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("RUN apt-get update") && err.contains("(cached)"), "{err}");
    assert!(!err.contains("Get:1"), "the rebuild ran apt again:\n{err}");
    assert!(took < Duration::from_secs(5), "cached rebuild took {took:?}");

    // A package from PyPI on top (FROM another template): it imports, and the sandbox
    // still cannot reach any network.
    let df = write(work.path(), "Dockerfile.pip", "FROM python\nRUN pip install --no-cache-dir six==1.16.0\n");
    let (code, out, err) = cli_build(&d, &df, "py-six", &[], None, Duration::from_secs(300));
    assert_eq!(code, 0, "{out}\n{err}");
    let id = create(&d, "py-six");
    let v = d.exec(&id, json!({ "cmd": ["python3", "-c", "import six; print(six.__version__)"] }));
    assert_eq!(v["stdout"], "1.16.0\n", "{v}");
    // No route at all (deny-all): a connect fails at once with ENETUNREACH, no packet leaves.
    let probe = "import socket, errno\ns = socket.socket()\ns.settimeout(3)\ntry:\n    s.connect(('198.51.100.7', 80))\n    print('connected')\nexcept OSError as e:\n    print(errno.errorcode.get(e.errno, e))\n";
    let v = d.exec(&id, json!({ "cmd": ["python3", "-c", probe] }));
    assert_eq!(v["stdout"], "ENETUNREACH\n", "{v}");
    let v = d.exec(&id, json!({ "cmd": ["python3", "-c", "import socket; socket.getaddrinfo('pypi.org', 443)"] }));
    assert_ne!(v["exit_code"], 0, "name resolution worked in a deny-all sandbox: {v}");
    d.delete(&format!("/v1/sandboxes/{id}"));
    d.shutdown_and_check_leaks();
}

#[test]
fn copy_env_workdir_user_and_isolation_on_host_base() {
    require_root!();
    let d = Daemon::start();
    let work = common::tempdir("gbtest-tpl-");
    let ctx = work.path().join("ctx");
    fs::create_dir_all(ctx.join("conf")).unwrap();
    write(&ctx, "tool.sh", "#!/bin/sh\necho tool ran as $(id -u)\n");
    fs::set_permissions(ctx.join("tool.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&ctx.join("conf"), "secret.cfg", "k=v\n");
    fs::set_permissions(ctx.join("conf/secret.cfg"), fs::Permissions::from_mode(0o600)).unwrap();
    write(&ctx.join("conf"), "odd.cfg", "x\n");
    fs::set_permissions(ctx.join("conf/odd.cfg"), fs::Permissions::from_mode(0o4751)).unwrap();
    let df = write(
        work.path(),
        "Dockerfile",
        "# host base, no FROM\nARG WHO=world\n\
         RUN echo \"hello $WHO\" > /etc/greeting && rm /etc/hostname\n\
         COPY tool.sh /opt/app/bin/\n\
         COPY conf /opt/app/conf\n\
         ENV APP_MODE=test \\\n    PATH=/opt/app/bin:/usr/local/bin:/usr/bin:/bin\n\
         WORKDIR /opt/app\n\
         RUN mkdir data && echo made-by-root > data/f\n\
         USER user\n\
         RUN id -u > /tmp/built-as\n",
    );
    let (code, out, err) = cli_build(
        &d,
        &df,
        "app",
        &["--build-arg", "WHO=tests", "--memory", "256M"],
        Some(&ctx),
        Duration::from_secs(300),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    for n in 1..=8 {
        assert!(err.contains(&format!("Step {n}/8 : ")), "no progress line for step {n}:\n{err}");
    }
    let (st, info) = d.get("/v1/templates/app");
    assert_eq!(st, 200, "{info}");
    assert_eq!(info["workdir"], "/opt/app");
    assert_eq!(info["user"], "user");
    assert_eq!(info["env"]["APP_MODE"], "test");
    assert_eq!(info["resources"]["memory_mb"], 256);

    let a = create(&d, "app");
    let (_, sb) = d.get(&format!("/v1/sandboxes/{a}"));
    assert_eq!(sb["limits"]["memory_mb"], 256, "template default memory: {sb}");
    // USER, WORKDIR, ENV are the defaults of commands.
    let who = d.sh_ok(&a, "id -u; pwd; echo $APP_MODE; cat /etc/greeting; cat /tmp/built-as; tool.sh");
    assert_eq!(who, "1000\n/opt/app\ntest\nhello tests\n1000\ntool ran as 1000\n");
    // The request's env wins over the template's.
    let b = d.create(json!({ "template": "app", "env": { "APP_MODE": "override" }, "timeout_s": 300 }));
    assert_eq!(d.sh_ok(&b, "echo $APP_MODE"), "override\n");
    // COPY kept the modes (setuid included), files owned by root; rm in a RUN is a whiteout.
    let modes = d.sh_ok(&a, "stat -c '%a %u %n' /opt/app/bin/tool.sh /opt/app/conf/secret.cfg /opt/app/conf/odd.cfg; test -e /etc/hostname || echo no-hostname");
    assert_eq!(
        modes,
        "755 0 /opt/app/bin/tool.sh\n600 0 /opt/app/conf/secret.cfg\n4751 0 /opt/app/conf/odd.cfg\nno-hostname\n"
    );
    // Root's files stay root's (the build's uid range is shifted back to 0).
    assert_eq!(d.sh_ok(&a, "stat -c '%u %a' /opt/app/data/f /etc/greeting"), "0 644\n0 644\n");

    // Writes in one sandbox show up neither in another nor in the template.
    d.sh_ok(&a, "echo mine > /tmp/a-only; echo x > /opt/app/bin/tool.sh 2>/dev/null; true");
    assert_eq!(d.sh_ok(&a, "ls /tmp"), "a-only\nbuilt-as\n");
    assert_eq!(d.sh_ok(&b, "ls /tmp; tool.sh"), "built-as\ntool ran as 1000\n");
    let c = create(&d, "app");
    assert_eq!(d.sh_ok(&c, "ls /tmp"), "built-as\n");
    let layers_dir = d.data_dir.join("layers");
    let found = Command::new("grep").args(["-rl", "mine"]).arg(&layers_dir).output().unwrap();
    assert!(
        found.stdout.is_empty(),
        "a sandbox's write reached the template: {}",
        String::from_utf8_lossy(&found.stdout)
    );

    // Deleting a template in use is refused; after its sandboxes end it goes, with its layers.
    let (st, v) = d.delete("/v1/templates/app");
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["code"], "conflict");
    for id in [&a, &b, &c] {
        d.delete(&format!("/v1/sandboxes/{id}"));
    }
    let before = fs::read_dir(&layers_dir).unwrap().count();
    assert!(before >= 6, "{before} layers");
    let o = run_bounded(d.cli().args(["template", "rm", "app"]), None, Duration::from_secs(30));
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let (st, _) = d.get("/v1/templates/app");
    assert_eq!(st, 404);
    let left: Vec<_> = fs::read_dir(&layers_dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "layers left after rm: {left:?}");
    d.shutdown_and_check_leaks();
}

#[test]
fn failed_step_and_bad_spec() {
    require_root!();
    let d = Daemon::start();
    let work = common::tempdir("gbtest-tpl-");
    let df = write(
        work.path(),
        "Dockerfile",
        "FROM host\nRUN echo first-ok > /etc/one\nRUN echo about to fail; echo oops >&2; exit 3\nRUN echo never\n",
    );
    let (code, out, err) = cli_build(&d, &df, "broken", &[], None, Duration::from_secs(120));
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("build failed at step 2 (line 3), exit code 3"), "{err}");
    assert!(err.contains("about to fail") && err.contains("oops"), "no output tail:\n{err}");
    assert!(!err.contains("Step 3/3"), "{err}");
    let (st, v) = d.get("/v1/templates/broken");
    assert_eq!(st, 404, "a failed build left a template: {v}");
    let (_, l) = d.get("/v1/templates");
    assert_eq!(l["templates"], json!([]));
    assert_eq!(d.post("/v1/sandboxes", &json!({ "template": "broken" })).0, 404);
    // The step that succeeded stays as cache until GC, which removes it (no template names it).
    let layers = d.data_dir.join("layers");
    assert_eq!(fs::read_dir(&layers).unwrap().count(), 1, "the first step's layer is cached");
    let o = run_bounded(d.cli().args(["template", "gc"]), None, Duration::from_secs(30));
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    assert_eq!(fs::read_dir(&layers).unwrap().count(), 0, "gc left an unreferenced layer");

    // The API without streaming: 422 with the step and exit code.
    let (st, v) = d.post("/v1/templates", &json!({ "name": "broken2", "dockerfile": "RUN false\n" }));
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "build_failed");
    assert!(v["error"]["message"].as_str().unwrap().contains("step 1"), "{v}");

    // A malformed spec: 400 naming the line, nothing runs.
    let (st, v) =
        d.post("/v1/templates", &json!({ "name": "bad", "dockerfile": "FROM host\nRUN true\n\nEXPOSE 8080\n" }));
    assert_eq!(st, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("line 4") && msg.contains("EXPOSE"), "{msg}");
    let bad = write(work.path(), "Bad", "FROM host\nCOPY --from=x a b\n");
    let (code, _, err) = cli_build(&d, &bad, "bad", &[], None, Duration::from_secs(30));
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("line 2") && err.contains("--from"), "{err}");
    for (name, why) in [("Bad Name", "bad template name"), ("base", "built-in")] {
        let (st, v) = d.post("/v1/templates", &json!({ "name": name, "dockerfile": "RUN true\n" }));
        assert_eq!(st, 400, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{v}");
    }
    let (st, _) = d.delete("/v1/templates/nope");
    assert_eq!(st, 404);
    // Templates are shared: a tenant key lists them but does not build or remove them.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "builder" }));
    assert_eq!(st, 201, "{k}");
    let key = k["key"].as_str().unwrap();
    let http = reqwest::blocking::Client::builder().no_proxy().build().unwrap();
    let r = http
        .post(format!("{}/v1/templates", d.url))
        .bearer_auth(key)
        .json(&json!({ "name": "mine", "dockerfile": "RUN true\n" }))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = http.get(format!("{}/v1/templates", d.url)).bearer_auth(key).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    d.shutdown_and_check_leaks();
}

// --- OCI images ---------------------------------------------------------------------------

struct Blob {
    digest: String,
    data: Vec<u8>,
}

fn blob(data: Vec<u8>) -> Blob {
    use sha2::Digest;
    let digest = format!("sha256:{}", hex(&sha2::Sha256::digest(&data)));
    Blob { digest, data }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn tar_entry(
    b: &mut tar::Builder<Vec<u8>>,
    path: &str,
    data: &[u8],
    mode: u32,
    kind: tar::EntryType,
    link: Option<&str>,
) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1);
    h.set_size(data.len() as u64);
    match link {
        Some(l) => b.append_link(&mut h, path, l).unwrap(),
        None => b.append_data(&mut h, path, data).unwrap(),
    }
}

/// A tiny image built here: layer 1 (gzip) has a static busybox and some files, layer 2
/// (plain tar) deletes one (whiteout) and replaces a directory (opaque).
fn tiny_image() -> (Blob, Blob, Blob, Blob) {
    let busybox = fs::read("/bin/busybox").expect("/bin/busybox (scripts/deps installs busybox-static)");
    let mut l1 = tar::Builder::new(Vec::new());
    for dir in ["bin/", "etc/", "etc/conf.d/", "tmp/"] {
        tar_entry(&mut l1, dir, b"", 0o755, tar::EntryType::Directory, None);
    }
    tar_entry(&mut l1, "bin/busybox", &busybox, 0o755, tar::EntryType::Regular, None);
    for tool in ["sh", "cat", "ls", "id", "echo", "tar", "mkdir", "test"] {
        tar_entry(&mut l1, &format!("bin/{tool}"), b"", 0o777, tar::EntryType::Symlink, Some("busybox"));
    }
    tar_entry(&mut l1, "etc/hello", b"hello from oci\n", 0o644, tar::EntryType::Regular, None);
    tar_entry(&mut l1, "etc/remove-me", b"x\n", 0o644, tar::EntryType::Regular, None);
    tar_entry(&mut l1, "etc/conf.d/old", b"old\n", 0o644, tar::EntryType::Regular, None);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &l1.into_inner().unwrap()).unwrap();
    let l1 = blob(gz.finish().unwrap());
    let mut l2 = tar::Builder::new(Vec::new());
    tar_entry(&mut l2, "etc/.wh.remove-me", b"", 0o644, tar::EntryType::Regular, None);
    tar_entry(&mut l2, "etc/conf.d/", b"", 0o755, tar::EntryType::Directory, None);
    tar_entry(&mut l2, "etc/conf.d/.wh..wh..opq", b"", 0o644, tar::EntryType::Regular, None);
    tar_entry(&mut l2, "etc/conf.d/new", b"new\n", 0o644, tar::EntryType::Regular, None);
    let l2 = blob(l2.into_inner().unwrap());
    let config = blob(
        serde_json::to_vec(&json!({
            "architecture": "amd64", "os": "linux",
            "config": { "Env": ["PATH=/bin", "IMG_VAR=from-image"], "WorkingDir": "/etc" },
            "rootfs": { "type": "layers", "diff_ids": [] }
        }))
        .unwrap(),
    );
    let manifest = blob(
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.digest, "size": config.data.len() },
            "layers": [
                { "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": l1.digest, "size": l1.data.len() },
                { "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": l2.digest, "size": l2.data.len() }
            ]
        }))
        .unwrap(),
    );
    (manifest, config, l1, l2)
}

/// An OCI image layout as a tar (what `FROM oci-archive:` reads).
fn oci_layout_tar(parts: &(Blob, Blob, Blob, Blob)) -> Vec<u8> {
    let (manifest, config, l1, l2) = parts;
    let mut t = tar::Builder::new(Vec::new());
    let index = json!({ "schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest.digest, "size": manifest.data.len() }] });
    tar_entry(&mut t, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644, tar::EntryType::Regular, None);
    tar_entry(&mut t, "index.json", &serde_json::to_vec(&index).unwrap(), 0o644, tar::EntryType::Regular, None);
    for b in [manifest, config, l1, l2] {
        let hexd = b.digest.strip_prefix("sha256:").unwrap();
        tar_entry(&mut t, &format!("blobs/sha256/{hexd}"), &b.data, 0o644, tar::EntryType::Regular, None);
    }
    t.into_inner().unwrap()
}

fn check_tiny(d: &Daemon, template: &str) {
    let id = create(d, template);
    let out = d.sh_ok(
        &id,
        "cat /etc/hello; test -e /etc/remove-me || echo removed; ls /etc/conf.d; echo $IMG_VAR; pwd; cat /built",
    );
    assert_eq!(out, "hello from oci\nremoved\nnew\nfrom-image\n/etc\nbuilt on oci\n");
    d.delete(&format!("/v1/sandboxes/{id}"));
}

#[test]
fn oci_archive_and_loopback_registry_as_base() {
    require_root!();
    let d = Daemon::start();
    let work = common::tempdir("gbtest-tpl-");
    let parts = tiny_image();
    let ctx = work.path().join("ctx");
    fs::create_dir(&ctx).unwrap();
    fs::write(ctx.join("image.tar"), oci_layout_tar(&parts)).unwrap();
    let df = write(work.path(), "Dockerfile", "FROM oci-archive:image.tar\nRUN echo built on oci > /built\n");
    let (code, out, err) = cli_build(&d, &df, "tiny", &[], Some(&ctx), Duration::from_secs(120));
    assert_eq!(code, 0, "{out}\n{err}");
    check_tiny(&d, "tiny");
    // An archive path outside the context is refused.
    let df2 = write(work.path(), "D2", "FROM oci-archive:../etc/passwd\n");
    let (code, _, err) = cli_build(&d, &df2, "nope", &[], Some(&ctx), Duration::from_secs(30));
    assert_ne!(code, 0);
    assert!(err.contains("build context"), "{err}");

    // The same image pushed to a registry on loopback that this test runs.
    let reg = Registry::start(work.path());
    reg.push("tiny", "v1", &parts);
    let df3 =
        write(work.path(), "D3", &format!("FROM 127.0.0.1:{}/tiny:v1\nRUN echo built on oci > /built\n", reg.port));
    let (code, out, err) = cli_build(&d, &df3, "tiny-reg", &["--no-cache"], None, Duration::from_secs(120));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("pulling tiny:v1"), "{err}");
    check_tiny(&d, "tiny-reg");
    drop(reg);
    d.shutdown_and_check_leaks();
}

/// Debian's `docker-registry` on a free loopback port, storage in a temp dir.
struct Registry {
    child: std::process::Child,
    port: u16,
    http: reqwest::blocking::Client,
}

impl Registry {
    fn start(dir: &Path) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let store = dir.join("registry");
        fs::create_dir_all(&store).unwrap();
        let cfg = dir.join("registry.yml");
        fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                store.display()
            ),
        )
        .unwrap();
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start docker-registry (scripts/deps installs it)");
        let http = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
        let mut r = Registry { child, port, http };
        let up = common::poll(Duration::from_secs(15), Duration::from_millis(50), || {
            r.http.get(r.url("/v2/")).send().ok().filter(|x| x.status().is_success()).map(|_| ())
        });
        if up.is_none() {
            let _ = r.child.kill();
            panic!("docker-registry did not come up on port {port}");
        }
        r
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn push(&self, repo: &str, tag: &str, parts: &(Blob, Blob, Blob, Blob)) {
        let (manifest, config, l1, l2) = parts;
        for b in [config, l1, l2] {
            let r = self.http.post(self.url(&format!("/v2/{repo}/blobs/uploads/"))).send().unwrap();
            assert_eq!(r.status().as_u16(), 202, "start upload");
            let loc = r.headers()["location"].to_str().unwrap().to_string();
            let loc = if loc.starts_with('/') { self.url(&loc) } else { loc };
            let sep = if loc.contains('?') { '&' } else { '?' };
            let r = self.http.put(format!("{loc}{sep}digest={}", b.digest)).body(b.data.clone()).send().unwrap();
            assert_eq!(r.status().as_u16(), 201, "upload blob: {:?}", r.text());
        }
        let r = self
            .http
            .put(self.url(&format!("/v2/{repo}/manifests/{tag}")))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(manifest.data.clone())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "push manifest: {:?}", r.text());
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
