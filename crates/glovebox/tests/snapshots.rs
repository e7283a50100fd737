//! Snapshots and forks on the real jail: a sandbox's files (100 MiB of data, a template file
//! it deleted, a directory it replaced, a symlink, a file of a non-root user, an xattr) reach
//! each of ten fork children with their owners; one child's write is seen by nobody else; a
//! named snapshot starts sandboxes, survives a restart, is private to its tenant, and its
//! deletion is deferred while a sandbox runs on it; the API's 400/404/409/422 answers; a hostile
//! layer (links to host files, a fifo, a socket, a huge sparse file, a deep tree) is neither
//! followed nor hangs the daemon; a daemon killed mid-snapshot leaves no half layer or record;
//! E2B's snapshot calls (create, list, delete, create from a snapshot id) over the same.
//!
//! The tests run one at a time (`serial()`): the fault test crashes a daemon and restarts it,
//! and a daemon starting in between would clean the crashed one's sandboxes; the ten children
//! also want the machine to themselves.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{poll, sandbox_body, Daemon};
use serde_json::{json, Value};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

macro_rules! require_root {
    () => {
        if !common::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

/// A template (built into the daemon's own data dir) whose commands run as uid 1000, with
/// files of the template's layer that uid may delete (`/srv/tpl/gone`) or replace (`op/`).
const TEMPLATE: &str = "FROM host\n\
    RUN mkdir -p /srv/tpl/op && echo t > /srv/tpl/gone && echo k > /srv/tpl/kept && echo a > /srv/tpl/op/a \
    && chmod -R 777 /srv/tpl\n\
    USER 1000\n";

fn build_template(d: &Daemon, name: &str) {
    let (st, v) = d.post("/v1/templates", &json!({ "name": name, "dockerfile": TEMPLATE }));
    assert!(st == 200 || st == 201, "build {name}: {st} {v}");
    assert_eq!(v["name"], name, "{v}");
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

fn layers_dir(d: &Daemon) -> PathBuf {
    d.data_dir.join("layers")
}

/// Snapshot records on disk (anonymous ones too).
fn records(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(d.data_dir.join("snapshots"))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn layer_ids(d: &Daemon) -> BTreeSet<String> {
    fs::read_dir(layers_dir(d))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// What a sandbox shows of the files the parent made (one line per check).
const CHECK: &str = "cat /tmp/data/f* | md5sum | cut -c1-32; \
    stat -c '%u:%g %a' /tmp/data/f1 /srv/tpl/kept /tmp/data; \
    readlink /tmp/data/link; \
    python3 -c 'import os; print(os.getxattr(\"/tmp/data/f1\", \"user.tag\").decode())'; \
    test -e /srv/tpl/gone && echo gone-is-back || echo gone-stays-gone; \
    ls /srv/tpl/op | tr '\\n' ' '; echo";

#[test]
fn fork_ten_children_share_the_parents_files_and_nothing_else() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    build_template(&d, "snapfork");
    let id = d.create(sandbox_body(json!({
        "template": "snapfork", "resources": { "memory_mb": 1024, "disk_mb": 512 }, "metadata": { "team": "a" },
        "env": { "FROM_PARENT": "yes" },
    })));
    d.sh_ok(
        &id,
        "set -e; mkdir -p /tmp/data; for i in 1 2 3 4 5 6 7 8 9 10; do head -c 10485760 /dev/urandom > /tmp/data/f$i; done; \
         ln -s /etc/passwd /tmp/data/link; \
         python3 -c 'import os; os.setxattr(\"/tmp/data/f1\", \"user.tag\", b\"blue\")'; \
         rm /srv/tpl/gone; rm -rf /srv/tpl/op; mkdir /srv/tpl/op; echo b > /srv/tpl/op/b",
    );
    let want = d.sh_ok(&id, CHECK);
    let lines: Vec<&str> = want.lines().collect();
    assert_eq!(lines.len(), 8, "{want}");
    assert_eq!(lines[1].split(' ').next(), Some("1000:1000"), "the parent's file is uid 1000's: {want}");
    assert_eq!(lines[2].split(' ').next(), Some("0:0"), "the template's file is root's: {want}");
    assert_eq!(&lines[4..], ["/etc/passwd", "blue", "gone-stays-gone", "b "], "{want}");
    let layers_before = layer_ids(&d);

    let t = Instant::now();
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/fork"), &json!({ "count": 10 }));
    let took = t.elapsed();
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["processes_copied"], false, "{v}");
    let kids: Vec<String> =
        v["sandboxes"].as_array().expect("children").iter().map(|c| c["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(kids.len(), 10, "{v}");
    eprintln!("fork of 100 MiB into 10 children: {} ms", took.as_millis());
    for (c, k) in v["sandboxes"].as_array().unwrap().iter().zip(&kids) {
        d.register(k);
        assert_eq!(c["parent_id"], id.as_str(), "{c}");
        assert_eq!(c["ancestors"], json!([id]), "{c}");
        assert_eq!(c["template"], "snapfork", "{c}");
        assert_eq!(c["metadata"]["team"], "a", "{c}");
        assert_eq!(c["limits"]["memory_mb"], 1024, "{c}");
        assert_eq!(c["state"], "running", "{c}");
    }
    assert_eq!(kids.iter().collect::<BTreeSet<_>>().len(), 10, "ten distinct children");
    // The anonymous snapshot is not listed.
    let (_, l) = d.get("/v1/snapshots");
    assert_eq!(l["snapshots"], json!([]), "{l}");

    for k in &kids {
        assert_eq!(d.sh_ok(k, CHECK), want, "child {k} sees the parent's files as the parent does");
        assert_eq!(d.sh_ok(k, "echo $FROM_PARENT; id -u").trim(), "yes\n1000", "child {k}: env and user");
    }
    // One child's write: invisible to the others and to the parent.
    d.sh_ok(&kids[0], "echo mine > /tmp/data/only-in-0 && echo changed > /tmp/data/f2");
    for other in kids[1..].iter().chain(std::iter::once(&id)) {
        let r = d.sh(other, "ls /tmp/data/only-in-0; head -c 7 /tmp/data/f2 | grep -c changed");
        assert_ne!(r["exit_code"], 0, "{other} sees child 0's write: {r}");
    }
    // And the parent's later writes are not the children's.
    d.sh_ok(&id, "echo later > /tmp/data/after-fork");
    assert_ne!(d.sh(&kids[1], "cat /tmp/data/after-fork")["exit_code"], 0);

    // A grandchild: lineage grows, files come through both layers.
    let (st, g) = d.post(&format!("/v1/sandboxes/{}/fork", kids[0]), &json!({}));
    assert_eq!(st, 201, "{g}");
    let gid = g["sandboxes"][0]["id"].as_str().unwrap().to_string();
    d.register(&gid);
    assert_eq!(g["sandboxes"][0]["ancestors"], json!([kids[0], id]), "{g}");
    assert_eq!(d.sh_ok(&gid, "cat /tmp/data/only-in-0"), "mine\n");

    // Every child gone: the fork snapshots and their layers are collected.
    for k in kids.iter().chain(std::iter::once(&gid)) {
        let (st, _) = d.delete(&format!("/v1/sandboxes/{k}"));
        assert_eq!(st, 204);
    }
    let cleared = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        (records(&d).is_empty() && layer_ids(&d) == layers_before).then_some(())
    });
    assert!(cleared.is_some(), "fork snapshots left: {:?}, layers {:?}", records(&d), layer_ids(&d));
    // The parent runs on, thawed.
    assert_eq!(d.sh_ok(&id, "cat /tmp/data/after-fork"), "later\n");
    d.shutdown_and_check_leaks();
}

#[test]
fn named_snapshots_create_list_delete_tenants_errors_and_restart() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "mkdir -p /work && echo v1 > /work/state && rm /etc/machine-id");

    // Errors first, each with its code.
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "Bad/Name" }));
    assert_eq!((st, code(&v)), (400, "invalid_request"), "{v}");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}));
    assert_eq!((st, code(&v)), (400, "invalid_request"), "{v}");
    let (st, v) = d.post("/v1/sandboxes/nosuchsandbox00/snapshots", &json!({ "name": "x" }));
    assert_eq!((st, code(&v)), (404, "sandbox_not_found"), "{v}");
    let (st, v) = d.get("/v1/snapshots/nope");
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    let (st, v) = d.delete("/v1/snapshots/nope");
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    let (st, v) = d.post("/v1/sandboxes", &json!({ "snapshot": "nope" }));
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    for n in [0, 21] {
        let (st, v) = d.post(&format!("/v1/sandboxes/{id}/fork"), &json!({ "count": n }));
        assert_eq!((st, code(&v)), (400, "invalid_request"), "count {n}: {v}");
    }
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/fork"), &json!({ "count": "ten" }));
    assert_eq!((st, code(&v)), (400, "invalid_request"), "{v}");

    // Take one, list it, show it; the name is taken once.
    let (st, s) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "s1" }));
    assert_eq!(st, 201, "{s}");
    assert_eq!(
        (s["name"].as_str(), s["template"].as_str(), s["source_sandbox"].as_str()),
        (Some("s1"), Some("base"), Some(id.as_str()))
    );
    let layer = s["layer"].as_str().unwrap().to_string();
    assert!(layers_dir(&d).join(&layer).join("fs/work/state").is_file(), "the layer is in the store");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "s1" }));
    assert_eq!((st, code(&v)), (409, "conflict"), "{v}");
    let (st, l) = d.get("/v1/snapshots");
    assert_eq!((st, l["snapshots"].as_array().map(|a| a.len())), (200, Some(1)), "{l}");
    // The sandbox was thawed after the copy.
    d.sh_ok(&id, "echo v2 > /work/state");
    // A paused sandbox is snapshotted as it is, and stays paused.
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pause"), &json!({}));
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "while-paused" }));
    assert_eq!(st, 201, "{v}");
    let (_, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(v["state"], "paused", "a snapshot does not resume a paused sandbox: {v}");
    let (st, _) = d.post(&format!("/v1/sandboxes/{id}/resume"), &json!({}));
    assert_eq!(st, 200);
    assert_eq!(d.delete("/v1/snapshots/while-paused").0, 204);

    // Start from it: files there at once, the template recorded, the snapshot named.
    let (st, v) = d.post("/v1/sandboxes", &json!({ "snapshot": "s1", "template": "other" }));
    assert_eq!((st, code(&v)), (400, "invalid_request"), "another template than the snapshot's: {v}");
    let (st, c) = d.post("/v1/sandboxes", &sandbox_body(json!({ "snapshot": "s1" })));
    assert_eq!(st, 201, "{c}");
    let child = c["id"].as_str().unwrap().to_string();
    d.register(&child);
    assert_eq!((c["snapshot"].as_str(), c["template"].as_str()), (Some("s1"), Some("base")), "{c}");
    assert!(c.get("parent_id").is_none(), "not a fork: {c}");
    assert_eq!(d.sh_ok(&child, "cat /work/state; test -e /etc/machine-id || echo deleted"), "v1\ndeleted\n");
    let (_, one) = d.get("/v1/snapshots/s1");
    assert_eq!(one["sandboxes"], 1, "{one}");

    // Another tenant sees nothing of it and cannot use it.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "other" }));
    assert_eq!(st, 201, "{k}");
    let other = k["key"].as_str().unwrap().to_string();
    let as_other = |m: reqwest::Method, p: &str, body: Option<Value>| {
        let mut rb = d.req_noauth(m, p).bearer_auth(&other);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        d.send(rb)
    };
    let (st, v) = as_other(reqwest::Method::GET, "/v1/snapshots", None);
    assert_eq!((st, &v["snapshots"]), (200, &json!([])), "{v}");
    let (st, v) = as_other(reqwest::Method::GET, "/v1/snapshots/s1", None);
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    let (st, v) = as_other(reqwest::Method::DELETE, "/v1/snapshots/s1", None);
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    let (st, v) = as_other(reqwest::Method::POST, "/v1/sandboxes", Some(json!({ "snapshot": "s1" })));
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    let (st, v) =
        as_other(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/snapshots"), Some(json!({ "name": "mine" })));
    assert_eq!(st, 404, "another tenant's sandbox: {v}");

    // Delete while in use: deferred (the record goes, the layer stays for the sandbox on it).
    let (st, _) = d.delete("/v1/snapshots/s1");
    assert_eq!(st, 204);
    let (st, v) = d.get("/v1/snapshots/s1");
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    assert!(layers_dir(&d).join(&layer).is_dir(), "the layer of a snapshot in use stays");
    assert_eq!(d.sh_ok(&child, "cat /work/state"), "v1\n");
    // The name is free again.
    let (st, s2) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "s1" }));
    assert_eq!(st, 201, "{s2}");
    assert_ne!(s2["layer"].as_str(), Some(layer.as_str()), "new content, new layer id");
    let (st, _) = d.delete(&format!("/v1/sandboxes/{child}"));
    assert_eq!(st, 204);
    let gone = poll(Duration::from_secs(10), Duration::from_millis(50), || {
        (!layers_dir(&d).join(&layer).exists()).then_some(())
    });
    assert!(gone.is_some(), "the deleted snapshot's layer outlived its last sandbox");

    // Snapshots survive a restart (the sandboxes of this non-keeping daemon do not).
    let mut d = d;
    d.stop();
    let d = d.restart();
    let (st, v) = d.get("/v1/snapshots/s1");
    assert_eq!(st, 200, "{v}");
    let c = d.create(sandbox_body(json!({ "snapshot": "s1" })));
    assert_eq!(d.sh_ok(&c, "cat /work/state"), "v2\n");
    d.shutdown_and_check_leaks();
}

#[test]
fn hostile_layer_is_neither_followed_nor_hangs() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "disk_mb": 256 } })));
    d.sh_ok(
        &id,
        "set -e; mkdir -p /h; ln -s /etc/shadow /h/shadow; ln -s / /h/hostroot; ln -s ../../../../../../etc /h/up; \
         mkfifo /h/fifo; python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"/h/sock\")'; \
         p=/h/deep; for i in $(seq 1 100); do p=$p/d; done; mkdir -p $p; echo bottom > $p/f",
    );
    // The descriptor of the layer PID 1 keeps (what the daemon reads) leads nowhere above the
    // layer: `..` from it stays in it (a detached mount), so even a process that got hold of
    // it could not climb to the host's files.
    let agent = common::processes_of(&id).into_iter().find(|p| p.ppid == d.pid()).expect("the sandbox's PID 1");
    let fd = PathBuf::from(format!("/proc/{}/fd/12", agent.pid));
    let (top, up) = (fs::metadata(&fd).expect("PID 1 holds its layer at fd 12"), fs::metadata(fd.join("..")).unwrap());
    assert_eq!((top.ino(), top.dev()), (up.ino(), up.dev()), "`..` of the layer's descriptor leaves it");
    assert!(fd.join("root/h/shadow").symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()));
    assert!(!fd.join("../../../../etc/shadow").exists(), "the host's files are reachable from the layer's descriptor");
    // A sparse file far beyond the disk cap: refused at once (its size counts), not inflated.
    d.sh_ok(&id, "truncate -s 100G /h/sparse");
    let t = Instant::now();
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "sparse" }));
    assert_eq!((st, code(&v)), (422, "snapshot_failed"), "{v}");
    assert!(t.elapsed() < Duration::from_secs(30), "refused in {:?}", t.elapsed());
    assert_eq!(d.sh_ok(&id, "rm /h/sparse; echo thawed"), "thawed\n", "the sandbox runs after a refusal");

    let (st, s) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "hostile" }));
    assert_eq!(st, 201, "{s}");
    assert_eq!(s["skipped"], 2, "the fifo and the socket are left out: {s}");
    let fs_dir = layers_dir(&d).join(s["layer"].as_str().unwrap()).join("fs");
    for l in ["shadow", "hostroot", "up"] {
        let md = fs::symlink_metadata(fs_dir.join("h").join(l)).unwrap();
        assert!(md.file_type().is_symlink(), "{l} is kept as a link, not followed");
    }
    assert_eq!(fs::read_link(fs_dir.join("h/shadow")).unwrap(), Path::new("/etc/shadow"));
    assert!(!fs_dir.join("h/fifo").exists() && !fs_dir.join("h/sock").exists());
    // Nothing of the host's shadow file was copied anywhere.
    if let Ok(shadow) = fs::read("/etc/shadow") {
        let mut found = Vec::new();
        walk_files(&fs_dir, &mut |p| {
            if fs::read(p).is_ok_and(|b| !shadow.is_empty() && b == shadow) {
                found.push(p.to_path_buf());
            }
        });
        assert!(found.is_empty(), "host /etc/shadow copied to {found:?}");
    }
    let c = d.create(sandbox_body(json!({ "snapshot": "hostile" })));
    let out = d
        .sh_ok(&c, "readlink /h/shadow; cat /h/deep/$(printf 'd/%.0s' $(seq 1 100))f; test -e /h/fifo || echo no-fifo");
    assert_eq!(out, "/etc/shadow\nbottom\nno-fifo\n");

    // A tree deeper than the walk goes: refused quickly, the sandbox thawed.
    d.sh_ok(&id, "cd /h && for i in $(seq 1 400); do mkdir x && cd x; done");
    let t = Instant::now();
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "deep" }));
    assert_eq!((st, code(&v)), (422, "snapshot_failed"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("deeper"), "{v}");
    assert!(t.elapsed() < Duration::from_secs(30), "refused in {:?}", t.elapsed());
    assert_eq!(d.sh_ok(&id, "echo thawed"), "thawed\n");
    // Nothing half-made is left in the store's scratch space.
    assert_eq!(fs::read_dir(d.data_dir.join("builds")).unwrap().count(), 0);
    d.shutdown_and_check_leaks();
}

fn walk_files(dir: &Path, f: &mut dyn FnMut(&Path)) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            walk_files(&e.path(), f);
        } else if ft.is_file() {
            f(&e.path());
        }
    }
}

#[test]
fn daemon_killed_mid_snapshot_leaves_no_half_layer_or_record() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "memory_mb": 1024, "disk_mb": 768 } })));
    d.sh_ok(&id, "mkdir -p /big && for i in $(seq 1 30); do head -c 10485760 /dev/urandom > /big/f$i; done");
    let layers_before = layer_ids(&d);
    let (url, key) = (d.url.clone(), d.key.clone());
    let path = format!("/v1/sandboxes/{id}/snapshots");
    let req = std::thread::spawn(move || {
        let c = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap();
        c.post(format!("{url}{path}")).bearer_auth(key).json(&json!({ "name": "cut" })).send().map(|r| r.status())
    });
    // Killed once the copy has started (a scratch tree exists).
    let builds = d.data_dir.join("builds");
    let started = poll(Duration::from_secs(30), Duration::from_millis(2), || {
        fs::read_dir(&builds).ok()?.flatten().any(|e| e.path().join("tree").exists()).then_some(())
    });
    assert!(started.is_some(), "the copy never started");
    let mut d = d;
    d.crash();
    let answered = req.join().unwrap();
    assert!(answered.is_err(), "the request could not have been answered: {answered:?}");
    let d = d.restart();
    assert_eq!(fs::read_dir(&builds).unwrap().count(), 0, "scratch space left");
    assert!(records(&d).is_empty(), "records left: {:?}", records(&d));
    assert_eq!(layer_ids(&d), layers_before, "a half (or unnamed) snapshot layer was left");
    let (st, v) = d.get("/v1/snapshots/cut");
    assert_eq!((st, code(&v)), (404, "snapshot_not_found"), "{v}");
    // The sandbox was adopted and thawed (its snapshot froze it), or cleaned up with a reason.
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    if st == 200 {
        let ok = poll(Duration::from_secs(10), Duration::from_millis(100), || {
            let r = d.sh(&id, "ls /big | wc -l");
            (r["exit_code"] == 0).then(|| r["stdout"].as_str().unwrap_or_default().trim().to_string())
        });
        assert_eq!(ok.as_deref(), Some("30"), "the adopted sandbox answers, thawed");
        let (st, s) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": "cut" }));
        assert_eq!(st, 201, "a snapshot after the restart: {s}");
    } else {
        assert_eq!(st, 410, "{v}");
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn e2b_fork_answers_its_sdks_shape_with_the_parents_files() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "echo before-fork > /tmp/state");
    let e2b = |path: &str, body: Value| {
        d.send(d.req_noauth(reqwest::Method::POST, path).header("X-API-Key", &d.key).json(&body))
    };
    let (st, v) = e2b(&format!("/sandboxes/{id}/fork"), json!({ "timeout": 60, "count": 2 }));
    assert_eq!(st, 201, "{v}");
    let kids: Vec<String> = v
        .as_array()
        .expect("a list of results")
        .iter()
        .map(|r| r["sandbox"]["sandboxID"].as_str().expect("a sandbox per result").to_string())
        .collect();
    assert_eq!(kids.len(), 2, "{v}");
    for k in &kids {
        d.register(k);
        assert_eq!(d.sh_ok(k, "cat /tmp/state"), "before-fork\n");
        let (_, s) = d.get(&format!("/v1/sandboxes/{k}"));
        assert_eq!(s["parent_id"], id.as_str(), "{s}");
    }
    let (st, v) = e2b("/sandboxes/nosuchsandbox00/fork", json!({}));
    assert_eq!(st, 404, "{v}");
    d.shutdown_and_check_leaks();
}

#[test]
fn e2b_snapshots_create_list_delete_and_start_sandboxes() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "mkdir -p /home/user && echo v1 > /home/user/state");
    let e2b_as = |key: &str, m: reqwest::Method, path: &str, body: Option<Value>| {
        let mut rb = d.req_noauth(m, path).header("X-API-Key", key);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        rb.send().expect("HTTP request to the daemon")
    };
    let e2b = |m: reqwest::Method, path: &str, body: Option<Value>| {
        let r = e2b_as(&d.key, m, path, body);
        let st = r.status().as_u16();
        (st, r.json::<Value>().unwrap_or(Value::Null))
    };
    let ids = |v: &Value| -> Vec<String> {
        v.as_array().expect("a list").iter().map(|s| s["snapshotID"].as_str().unwrap().to_string()).collect()
    };
    use reqwest::Method as M;

    // Named (E2B's default `memory: true` is answered with a files-only snapshot) and unnamed.
    let (st, s) =
        e2b(M::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({ "name": "e2b-one", "memory": true })));
    assert_eq!((st, &s), (201, &json!({ "snapshotID": "snapshots/e2b-one", "names": ["snapshots/e2b-one"] })));
    let (st, v) = d.get("/v1/snapshots/e2b-one");
    assert_eq!((st, v["source_sandbox"].as_str()), (200, Some(id.as_str())), "the same snapshot natively: {v}");
    let (st, u) = e2b(M::POST, &format!("/sandboxes/{id}/snapshots"), None);
    assert_eq!(st, 201, "{u}");
    let unnamed = u["snapshotID"].as_str().unwrap().to_string();
    assert!(unnamed.starts_with("snapshots/snap-"), "{u}");

    // Lists: all of the caller's, by sandbox, by name (or id), in pages.
    let (st, l) = e2b(M::GET, "/snapshots", None);
    assert_eq!(st, 200, "{l}");
    let mut all = ids(&l);
    all.sort();
    assert_eq!(all, vec!["snapshots/e2b-one".to_string(), unnamed.clone()]);
    assert_eq!(ids(&e2b(M::GET, &format!("/snapshots?sandboxID={id}"), None).1).len(), 2);
    assert!(ids(&e2b(M::GET, "/snapshots?sandboxID=nosuchsandbox00", None).1).is_empty());
    assert_eq!(ids(&e2b(M::GET, "/snapshots?name=e2b-one", None).1), vec!["snapshots/e2b-one"]);
    assert_eq!(ids(&e2b(M::GET, "/snapshots?name=snapshots/e2b-one", None).1), vec!["snapshots/e2b-one"]);
    assert!(ids(&e2b(M::GET, "/snapshots?name=e2b-one-not", None).1).is_empty());
    let r = e2b_as(&d.key, M::GET, "/snapshots?limit=1", None);
    let token = r.headers().get("x-next-token").map(|t| t.to_str().unwrap().to_string()).expect("a next page");
    let first = ids(&r.json::<Value>().unwrap());
    let (_, rest) = e2b(M::GET, &format!("/snapshots?limit=1&nextToken={token}"), None);
    let mut paged = [first, ids(&rest)].concat();
    paged.sort();
    assert_eq!(paged, all, "two pages of one hold both");

    // A create whose template id is the snapshot's starts on its files; a second snapshot
    // under the same name replaces it (E2B: a new build of the snapshot template), and the
    // sandbox on the old one keeps its files.
    let from = |snap: &str| {
        let (st, c) = e2b(M::POST, "/sandboxes", Some(json!({ "templateID": snap, "timeout": 120 })));
        assert_eq!(st, 201, "create from {snap}: {c}");
        let child = c["sandboxID"].as_str().unwrap().to_string();
        d.register(&child);
        child
    };
    let one = from("snapshots/e2b-one");
    assert_eq!(d.sh_ok(&one, "cat /home/user/state"), "v1\n");
    d.sh_ok(&id, "echo v2 > /home/user/state");
    let (st, s) = e2b(M::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({ "name": "e2b-one" })));
    assert_eq!((st, s["snapshotID"].as_str()), (201, Some("snapshots/e2b-one")), "{s}");
    let two = from("snapshots/e2b-one");
    assert_eq!(d.sh_ok(&two, "cat /home/user/state"), "v2\n");
    assert_eq!(d.sh_ok(&one, "cat /home/user/state"), "v1\n");

    // Errors, in E2B's shape: unknown snapshots are 404, ids that are not valid 400.
    let (st, v) = e2b(M::POST, "/sandboxes", Some(json!({ "templateID": "snapshots/nope" })));
    assert_eq!((st, &v), (404, &json!({ "code": 404, "message": "snapshot 'snapshots/nope' not found" })));
    for bad in ["snapshots/../e2b-one", "snapshots/", "snapshots/E2B-ONE"] {
        let (st, v) = e2b(M::POST, "/sandboxes", Some(json!({ "templateID": bad })));
        assert_eq!((st, v["code"].as_u64()), (400, Some(400)), "{bad}: {v}");
    }
    for (path, want) in [
        ("/templates/snapshots%2Fnope", 404),
        ("/templates/snapshots%2F..%2Fe2b-one", 400),
        ("/templates/base", 400),
        ("/templates/nosuchtemplate", 404),
    ] {
        let (st, v) = e2b(M::DELETE, path, None);
        assert_eq!(st, want, "{path}: {v}");
    }
    let (st, v) = e2b(M::POST, "/sandboxes/nosuchsandbox00/snapshots", Some(json!({})));
    assert_eq!(st, 404, "{v}");
    let (st, v) = e2b(M::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({ "name": "Bad/Name" })));
    assert_eq!(st, 400, "{v}");

    // Another tenant sees none of it, cannot use or delete it, nor snapshot our sandbox.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "other" }));
    assert_eq!(st, 201, "{k}");
    let other = k["key"].as_str().unwrap().to_string();
    let r = e2b_as(&other, M::GET, "/snapshots", None);
    assert_eq!(r.json::<Value>().unwrap(), json!([]));
    let r = e2b_as(&other, M::POST, "/sandboxes", Some(json!({ "templateID": "snapshots/e2b-one" })));
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(e2b_as(&other, M::DELETE, "/templates/snapshots%2Fe2b-one", None).status().as_u16(), 404);
    let r = e2b_as(&other, M::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({ "name": "mine" })));
    assert_eq!(r.status().as_u16(), 404);

    // Delete: 204, then 404 (the SDK's `True`, then `False`); the sandboxes on it run on.
    for snap in ["snapshots%2Fe2b-one", &unnamed.replace('/', "%2F")] {
        assert_eq!(e2b(M::DELETE, &format!("/templates/{snap}"), None).0, 204, "{snap}");
        assert_eq!(e2b(M::DELETE, &format!("/templates/{snap}"), None).0, 404, "{snap}");
    }
    assert_eq!(e2b(M::GET, "/snapshots", None).1, json!([]));
    assert_eq!(d.sh_ok(&two, "cat /home/user/state"), "v2\n");
    d.shutdown_and_check_leaks();
}

#[test]
fn cli_snapshot_fork_and_create_from_a_snapshot() {
    require_root!();
    let _s = serial();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "echo from-cli > /tmp/f");
    let cli = |args: &[&str]| {
        let o = common::run_bounded(d.cli().args(args), None, Duration::from_secs(60));
        assert!(o.status.success(), "glovebox {args:?}: {}", o.stderr_str());
        o.stdout_str()
    };
    assert_eq!(cli(&["sandbox", "snapshot", &id, "c1"]), "c1\n");
    let ls = cli(&["snapshot", "ls"]);
    assert!(ls.lines().any(|l| l.starts_with("c1 ")), "{ls}");
    let c = cli(&["sandbox", "create", "--snapshot", "c1", "--timeout", "60s"]).trim().to_string();
    d.register(&c);
    assert_eq!(d.sh_ok(&c, "cat /tmp/f"), "from-cli\n");
    let kids: Vec<String> = cli(&["sandbox", "fork", &id, "--count", "2"]).lines().map(str::to_string).collect();
    assert_eq!(kids.len(), 2, "{kids:?}");
    for k in &kids {
        d.register(k);
        assert_eq!(d.sh_ok(k, "cat /tmp/f"), "from-cli\n");
    }
    cli(&["snapshot", "rm", "c1"]);
    assert!(!cli(&["snapshot", "ls"]).lines().any(|l| l.starts_with("c1 ")));
    let o = common::run_bounded(d.cli().args(["snapshot", "rm", "c1"]), None, Duration::from_secs(60));
    assert_eq!(o.code(), Some(125), "a missing snapshot is the CLI's own error: {}", o.stderr_str());
    d.shutdown_and_check_leaks();
}
