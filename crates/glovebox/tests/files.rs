//! The file API end to end: large streaming round trips, and every path trick (traversal,
//! absolute paths, symlinks planted by sandboxed code, magic links, special files) resolving
//! inside the sandbox and never reaching host content.

mod common;

use std::fs;
use std::io::Read;
use std::time::{Duration, Instant};

use common::{rand_token, sandbox_body, tempdir, Daemon, Prng};
use reqwest::Method;
use serde_json::{json, Value};

fn q(path: &str) -> String {
    // Percent-encode everything but unreserved characters.
    let mut s = String::new();
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn files(id: &str, op: &str, path: &str) -> String {
    format!("/v1/sandboxes/{id}/files{op}?path={}", q(path))
}

/// GET a file: (status, body bytes).
fn download(d: &Daemon, id: &str, path: &str) -> (u16, Vec<u8>) {
    let resp = d.req(Method::GET, &files(id, "", path)).timeout(Duration::from_secs(20)).send().unwrap();
    let st = resp.status().as_u16();
    (st, resp.bytes().unwrap().to_vec())
}

fn upload(d: &Daemon, id: &str, path: &str, body: &[u8]) -> (u16, Value) {
    d.send(d.req(Method::PUT, &files(id, "", path)).body(body.to_vec()))
}

fn code(v: &[u8]) -> String {
    serde_json::from_slice::<Value>(v)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(String::from))
        .unwrap_or_default()
}

#[test]
fn hundred_mib_round_trip_is_exact_and_streams() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "memory_mb": 512, "disk_mb": 512 } })));
    const LEN: u64 = 100 << 20;
    const SEED: u64 = 0x00C0_FFEE_1234_5678;
    let t = Instant::now();
    let body = reqwest::blocking::Body::sized(Prng::new(SEED, LEN), LEN);
    let (st, info) =
        d.send(d.req(Method::PUT, &files(&id, "", "/home/user/big.bin")).body(body).timeout(Duration::from_secs(60)));
    assert_eq!(st, 200, "{info}");
    assert_eq!((info["size"].as_u64(), info["path"].as_str()), (Some(LEN), Some("/home/user/big.bin")), "{info}");
    let up = t.elapsed();

    let mut resp =
        d.req(Method::GET, &files(&id, "", "/home/user/big.bin")).timeout(Duration::from_secs(60)).send().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.content_length(), Some(LEN));
    let mut want = Prng::new(SEED, LEN);
    let (mut got, mut buf, mut exp) = (0u64, vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = resp.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        want.read_exact(&mut exp[..n]).unwrap();
        assert!(buf[..n] == exp[..n], "content differs in the MiB at offset {got}");
        got += n as u64;
    }
    assert_eq!(got, LEN, "download length");
    eprintln!("100 MiB: upload {up:?}, total {:?}", t.elapsed());
    // The sandbox sees the same bytes (its own tools agree on the size).
    assert_eq!(d.sh_ok(&id, "stat -c %s /home/user/big.bin").trim(), LEN.to_string());
    let peak = d.peak_rss_kib();
    assert!(peak < 150 * 1024, "daemon peak RSS {peak} KiB moving 100 MiB each way");
    d.shutdown_and_check_leaks();
}

#[test]
fn paths_resolve_inside_the_sandbox() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let host_passwd = fs::read("/etc/passwd").unwrap();
    let own_passwd = d.sh_ok(&id, "cat /etc/passwd").into_bytes();
    assert!(String::from_utf8_lossy(&own_passwd).contains("user:x:1000"), "sandbox passwd");
    assert_ne!(own_passwd, host_passwd, "the sandbox's /etc/passwd must differ from the host's for this test");

    for p in [
        "/etc/passwd",
        "../../etc/passwd",
        "../../../../../../../../etc/passwd",
        "/../../etc/passwd",
        "/home/user/../../etc/passwd",
        "./../.././etc//passwd",
        "/etc/./passwd",
    ] {
        let (st, body) = download(&d, &id, p);
        assert_eq!(st, 200, "{p}: {}", String::from_utf8_lossy(&body));
        assert_eq!(body, own_passwd, "{p} is not the sandbox's /etc/passwd");
    }
    // Relative paths are relative to /home/user.
    assert_eq!(upload(&d, &id, "rel.txt", b"relative").0, 200);
    assert_eq!(d.sh_ok(&id, "cat /home/user/rel.txt"), "relative");

    // Host content never comes back, through any path or link.
    let host = tempdir("gbtest-hostdir-");
    let secret = format!("host-secret-{}", rand_token(16));
    fs::write(host.path().join("canary.txt"), &secret).unwrap();
    let hp = host.path().display().to_string();
    d.sh_ok(
        &id,
        &format!(
            "cd /home/user && ln -s / rootlink && ln -s /root rootdir && ln -s {hp} hostlink \
             && ln -s ../../../../../..{hp}/canary.txt rel && ln -s /proc/1/root agentroot \
             && ln -s /proc/self/fd selffd && ln -s loop2 loop1 && ln -s loop1 loop2 \
             && mkdir -p {hp} && echo sandbox-copy > {hp}/own.txt"
        ),
    );
    let (st, body) = download(&d, &id, "/home/user/rootlink/etc/passwd");
    assert_eq!((st, &body), (200, &own_passwd), "a link to / is the sandbox's /");
    let (st, body) = download(&d, &id, "/home/user/hostlink/own.txt");
    assert_eq!(
        (st, body.as_slice()),
        (200, b"sandbox-copy\n".as_slice()),
        "a link to a host path is the sandbox's path"
    );
    let probes = [
        format!("{hp}/canary.txt"),
        "/home/user/hostlink/canary.txt".to_string(),
        "/home/user/rel".to_string(),
        "/home/user/rootlink/../../..".to_string() + &hp + "/canary.txt",
        "/home/user/agentroot/etc/passwd".to_string(),
        "/proc/1/root/etc/passwd".to_string(),
        format!("/proc/1/root{hp}/canary.txt"),
        "/proc/self/root/etc/passwd".to_string(),
        "/proc/self/cwd/rel.txt".to_string(),
        "/home/user/loop1".to_string(),
        "/home/user/rootdir/.bashrc".to_string(),
    ];
    for p in &probes {
        let (st, body) = download(&d, &id, p);
        assert!(!String::from_utf8_lossy(&body).contains(&secret), "{p} returned host content");
        if st == 200 {
            // Only the sandbox's own view may come back.
            assert!(
                body == own_passwd || body.is_empty(),
                "{p}: unexpected content {:?}",
                String::from_utf8_lossy(&body)
            );
        } else {
            assert!((400..500).contains(&st), "{p}: {st} {}", String::from_utf8_lossy(&body));
        }
    }
    // Magic links to the agent's fds (some are host files) are refused.
    for fdn in 0..12 {
        for p in [format!("/proc/1/fd/{fdn}"), format!("/proc/self/fd/{fdn}"), format!("/home/user/selffd/{fdn}")] {
            let (st, body) = download(&d, &id, &p);
            assert!((400..500).contains(&st), "{p}: {st} {:?}", String::from_utf8_lossy(&body[..body.len().min(200)]));
        }
    }

    // Writes through `..` or links stay inside: the host dir keeps only its canary.
    for p in [
        format!("../../../../..{hp}/evil1"),
        format!("{hp}/evil2"),
        "/home/user/hostlink/evil3".to_string(),
        "/home/user/rootlink/tmp/evil4".to_string(),
        format!("/proc/1/root{hp}/evil5"),
    ] {
        let (st, v) = upload(&d, &id, &p, b"evil");
        assert!(st == 200 || (400..500).contains(&st), "{p}: {st} {v}");
    }
    let names: Vec<String> =
        fs::read_dir(host.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["canary.txt"], "a write reached the host dir");
    assert_eq!(fs::read_to_string(host.path().join("canary.txt")).unwrap(), secret);
    assert!(d.sh_ok(&id, &format!("ls {hp}")).contains("evil1"), "the write landed inside the sandbox");

    // Writing to a symlink replaces the link; it does not write through it.
    d.sh_ok(&id, "echo original > /tmp/target && ln -s /tmp/target /home/user/link");
    assert_eq!(upload(&d, &id, "/home/user/link", b"new").0, 200);
    assert_eq!(d.sh_ok(&id, "cat /tmp/target"), "original\n");
    assert_eq!(d.sh_ok(&id, "test -L /home/user/link || echo replaced"), "replaced\n");
    d.shutdown_and_check_leaks();
}

#[test]
fn file_operations_and_error_codes() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let get = |op: &str, p: &str| d.get(&files(&id, op, p));

    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/files/mkdir"), &json!({ "path": "/home/user/a/b" }));
    assert_eq!((st, v["type"].as_str()), (200, Some("dir")), "{v}");
    let (st, v) = upload(&d, &id, "/home/user/a/b/f.txt", b"hello");
    assert_eq!((st, v["size"].as_u64()), (200, Some(5)), "{v}");
    // Uploads create missing parents.
    assert_eq!(upload(&d, &id, "/home/user/new/dir/g.txt", b"g").0, 200);
    let (st, v) = get("/stat", "/home/user/a/b/f.txt");
    assert_eq!(
        (st, v["type"].as_str(), v["size"].as_u64(), v["name"].as_str()),
        (200, Some("file"), Some(5), Some("f.txt"))
    );
    let (st, v) = get("/list", "/home/user/a");
    assert_eq!(st, 200, "{v}");
    let names: Vec<&str> = v["entries"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["b"], "{v}");
    let (st, v) = d.get(&format!("{}&depth=3", files(&id, "/list", "/home/user/a")));
    assert_eq!(st, 200);
    assert!(v["entries"].as_array().unwrap().iter().any(|e| e["path"] == "/home/user/a/b/f.txt"), "{v}");

    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/files/rename"),
        &json!({ "from": "/home/user/a/b/f.txt", "to": "/home/user/a/moved.txt" }),
    );
    assert_eq!((st, v["path"].as_str()), (200, Some("/home/user/a/moved.txt")), "{v}");
    assert_eq!(get("/stat", "/home/user/a/b/f.txt").0, 404);
    assert_eq!(download(&d, &id, "/home/user/a/moved.txt"), (200, b"hello".to_vec()));

    // Mode on upload.
    let (st, v) = d.send(
        d.req(Method::PUT, &format!("{}&mode=0755", files(&id, "", "/home/user/x.sh"))).body("#!/bin/sh\necho ran\n"),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["mode"].as_u64().map(|m| m & 0o777), Some(0o755), "{v}");
    assert_eq!(d.sh_ok(&id, "/home/user/x.sh"), "ran\n");
    let (st, _) = d.send(d.req(Method::PUT, &format!("{}&mode=9z", files(&id, "", "/home/user/y"))).body("y"));
    assert_eq!(st, 400);

    // Removing.
    let del = |p: &str, rec: bool| {
        let mut u = files(&id, "", p);
        if rec {
            u.push_str("&recursive=true");
        }
        d.delete(&u)
    };
    let (st, v) = del("/home/user/a", false);
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("directory_not_empty")), "{v}");
    assert_eq!(del("/home/user/a", true).0, 204);
    assert_eq!(get("/stat", "/home/user/a").0, 404);
    assert_eq!(d.sh_ok(&id, "test -e /home/user/a || echo gone"), "gone\n");

    // Errors, each with a code and quickly (special files never hang a read).
    d.sh_ok(&id, "mkfifo /home/user/fifo; mkdir -p /home/user/dir");
    let t = Instant::now();
    for (p, want_st, want_code) in [
        ("/home/user/missing", 404, "file_not_found"),
        ("/home/user/dir", 400, "is_a_directory"),
        ("/home/user/fifo", 400, ""),
        ("/dev/zero", 400, ""),
        ("/dev/null", 400, ""),
        ("/home/user/missing/deeper", 404, ""),
        ("", 400, "invalid_path"),
    ] {
        let (st, body) = download(&d, &id, p);
        assert_eq!(st, want_st, "GET {p:?}: {}", String::from_utf8_lossy(&body));
        if !want_code.is_empty() {
            assert_eq!(code(&body), want_code, "GET {p:?}");
        }
        assert!(!code(&body).is_empty(), "GET {p:?}: error body {}", String::from_utf8_lossy(&body));
    }
    assert!(t.elapsed() < Duration::from_secs(5), "special files slowed reads: {:?}", t.elapsed());
    let (st, _) = get("/stat", "/home/user/missing");
    assert_eq!(st, 404);
    let (st, v) = get("/list", "/home/user/missing");
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("file_not_found")), "{v}");
    let (st, _) = get("/list", "/home/user/fifo");
    assert_eq!(st, 400, "listing a non-directory");
    let (st, v) = d.get(&format!("{}&depth=0", files(&id, "/list", "/home/user")));
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/files/mkdir"), &json!({ "path": "/home/user/fifo" }));
    assert_eq!(st / 100, 4, "mkdir over a file: {v}");
    let (st, v) = d
        .post(&format!("/v1/sandboxes/{id}/files/rename"), &json!({ "from": "/home/user/nope", "to": "/home/user/x" }));
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("file_not_found")), "{v}");
    let (st, v) = upload(&d, &id, "/home/user/dir", b"x");
    assert_eq!(st / 100, 4, "uploading over a directory: {v}");
    let (st, v) = upload(&d, &id, "/proc/self/status", b"x");
    assert_eq!(st / 100, 4, "writing procfs: {v}");
    let (st, v) = upload(&d, &id, "/home/user/a\u{0}b", b"x");
    assert_eq!(st, 400, "NUL in a path: {v}");
    let (st, v) = del("/", true);
    assert_eq!(st / 100, 4, "removing / must be refused: {v}");
    assert_eq!(d.sh_ok(&id, "echo alive"), "alive\n", "the sandbox survives all of that");
    d.shutdown_and_check_leaks();
}
