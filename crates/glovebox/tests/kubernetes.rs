//! The Kubernetes manifests (deploy/kubernetes, issue 28): every resource the kustomization
//! lists validates against the Kubernetes schemas (`kubernetes-validate`, pinned, strict:
//! unknown fields fail), a manifest with a misspelled field is refused (the validator is
//! really checking), and the daemon accepts the ConfigMap's config.toml: a daemon started
//! with it (port and data dir overridden, as the flags do) gives a sandbox the ConfigMap's
//! default limits. No API server runs here; a cluster is what docs/scale-out.md is for.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const VALIDATE: &str = "kubernetes-validate==1.37.0";
/// The Kubernetes minor the manifests are held to.
const KUBERNETES: &str = "1.34.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A venv with the pinned validator, made once per target dir (it reaches PyPI once).
fn venv() -> PathBuf {
    // Tests run in parallel and more than one wants it: one makes it, the others wait (two
    // making it at once collided: `venv` saw the other's half-made directory, EEXIST).
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("k8s-validate-venv");
    let py = dir.join("bin/python");
    let marker = dir.join(".installed");
    if fs::read_to_string(&marker).is_ok_and(|m| m == VALIDATE) {
        return py;
    }
    let _ = fs::remove_dir_all(&dir);
    let o = run_bounded(Command::new("python3").args(["-m", "venv"]).arg(&dir), None, Duration::from_secs(120));
    assert_eq!(o.code(), Some(0), "venv: {}", o.stderr_str());
    let o = run_bounded(
        Command::new(dir.join("bin/pip")).args(["install", "-q", "--disable-pip-version-check", VALIDATE]),
        None,
        Duration::from_secs(300),
    );
    assert_eq!(o.code(), Some(0), "pip install {VALIDATE}: {}", o.stderr_str());
    fs::write(&marker, VALIDATE).expect("marker");
    py
}

fn validate(py: &Path, files: &[PathBuf]) -> Outcome {
    run_bounded(
        Command::new(py).args(["-m", "kubernetes_validate", "-k", KUBERNETES, "--strict"]).args(files),
        None,
        Duration::from_secs(120),
    )
}

/// The files `kustomization.yaml` lists under `resources:`.
fn resources(dir: &Path) -> Vec<PathBuf> {
    let k = fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization.yaml");
    k.lines()
        .skip_while(|l| l.trim() != "resources:")
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- "))
        .map(|f| dir.join(f.trim()))
        .collect()
}

#[test]
fn the_manifests_validate_against_the_pinned_kubernetes_schemas() {
    let dir = repo().join("deploy/kubernetes");
    let files = resources(&dir);
    assert!(files.len() >= 5, "kustomization lists {files:?}");
    let py = venv();
    let o = validate(&py, &files);
    let out = format!("{}{}", o.stdout_str(), o.stderr_str());
    assert_eq!(o.code(), Some(0), "{out}");
    for kind in [
        "namespace/",
        "serviceaccount/",
        "role/",
        "rolebinding/",
        "clusterrole/",
        "clusterrolebinding/",
        "configmap/",
        "service/",
        "daemonset/",
        "deployment/",
        "networkpolicy/",
    ] {
        assert!(out.lines().any(|l| l.contains("passed") && l.contains(kind)), "no {kind} passed:\n{out}");
    }
    assert!(!out.contains("WARN") && !out.contains("ERROR"), "{out}");

    // Control: a misspelled field in the DaemonSet is refused.
    let scratch = tempdir("k8s-bad");
    let bad = scratch.path().join("daemonset.yaml");
    let text = fs::read_to_string(dir.join("daemonset.yaml")).expect("daemonset");
    assert!(text.contains("privileged: true"));
    fs::write(&bad, text.replace("privileged: true", "privilegd: true")).expect("write");
    let o = validate(&py, &[bad]);
    assert_ne!(o.code(), Some(0), "a misspelled field passed: {}", o.stdout_str());
}

#[test]
fn the_daemon_takes_the_configmaps_config() {
    require_root!();
    let dir = repo().join("deploy/kubernetes");
    let py = venv();
    let scratch = tempdir("k8s-config");
    let config = scratch.path().join("config.toml");
    let o = run_bounded(
        Command::new(&py)
            .args([
                "-c",
                "import sys, yaml; sys.stdout.write(yaml.safe_load(open(sys.argv[1]))['data']['config.toml'])",
            ])
            .arg(dir.join("configmap.yaml")),
        None,
        Duration::from_secs(30),
    );
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let toml = o.stdout_str();
    assert!(toml.contains("memory_mb = 1024"), "{toml}");
    assert!(toml.contains("router_listen = \"0.0.0.0:8888\""), "{toml}");
    fs::write(&config, &toml).expect("config");

    // As the DaemonSet runs it, but on free loopback ports and a scratch data dir (flags
    // override the file), without the warm pool, destroying its sandboxes on exit.
    let free = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let (port, router_port) = (free(), free());
    let key = format!("e2b_{}", rand_hex(20));
    let log = fs::File::create(scratch.path().join("daemon.log")).expect("log");
    let mut child = Command::new(glovebox_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--router-listen", &format!("127.0.0.1:{router_port}")])
        .arg("--data-dir")
        .arg(scratch.path().join("data"))
        .args(["--warm-pool", "0", "--destroy-on-exit"])
        .env("GLOVEBOX_API_KEY", &key)
        .env_remove("GLOVEBOX_URL")
        .env_remove("GLOVEBOX_DATA_DIR")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn serve");
    let http = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().expect("http");
    let url = format!("http://127.0.0.1:{port}");
    let up = poll(Duration::from_secs(20), Duration::from_millis(50), || {
        http.get(format!("{url}/healthz")).send().ok().filter(|r| r.status().is_success()).map(|_| ())
    });
    let result = (|| -> Result<Value, String> {
        up.ok_or("the daemon did not answer /healthz")?;
        let r = http
            .post(format!("{url}/v1/sandboxes"))
            .bearer_auth(&key)
            .json(&json!({ "timeout_s": 60 }))
            .send()
            .map_err(|e| e.to_string())?;
        let v: Value = r.json().map_err(|e| e.to_string())?;
        let id = v["id"].as_str().ok_or(format!("create: {v}"))?.to_string();
        let got = http.get(format!("{url}/v1/sandboxes/{id}")).bearer_auth(&key).send().map_err(|e| e.to_string())?;
        let sb: Value = got.json().map_err(|e| e.to_string())?;
        // The router-facing listener the ConfigMap turns on answers (a name it does not know).
        let r = http
            .get(format!("http://127.0.0.1:{router_port}/v1/health"))
            .header("host", "nobody.default.svc.cluster.local:8888")
            .send()
            .map_err(|e| e.to_string())?;
        if r.status() != 404 {
            return Err(format!("router-facing listener: {} {}", r.status(), r.text().unwrap_or_default()));
        }
        Ok(sb)
    })();
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let exited = wait_bounded(&mut child, Duration::from_secs(30));
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let daemon_log = fs::read_to_string(scratch.path().join("daemon.log")).unwrap_or_default();
    let sb = result.unwrap_or_else(|e| panic!("{e}\n--- daemon log\n{daemon_log}"));
    assert_eq!(sb["limits"]["memory_mb"], 1024, "the ConfigMap's default memory: {sb}");
    assert_eq!(sb["limits"]["pids"], 512, "the ConfigMap's default pids: {sb}");
    assert!(exited.is_some_and(|s| s.success()), "serve did not stop cleanly on SIGTERM\n{daemon_log}");
    let id = sb["id"].as_str().unwrap_or_default().to_string();
    assert_no_leaks(&std::collections::BTreeSet::from([id]), &[child.id()]);
}
