//! Volumes: disk-backed, capped, shared by sandboxes, surviving sandboxes and a daemon
//! SIGKILL. What one sandbox writes the next reads; a read-only mount refuses writes; a full
//! volume answers ENOSPC to its writer while the daemon and the other sandboxes carry on;
//! bad names and paths get 400s, an unknown volume 404, a delete in use 409; a tenant sees
//! only its own volumes; nothing (mount, loop device) is left behind.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{poll, run_bounded, sandbox_body, Daemon};
use serde_json::{json, Value};

fn vol(name: &str, path: &str, read_only: bool) -> Value {
    json!({ "name": name, "path": path, "read_only": read_only })
}

fn host_mnt(d: &Daemon, tenant: &str, name: &str) -> PathBuf {
    d.data_dir.join("volumes").join(tenant).join(name).join("mnt")
}

fn host_mounted(p: &std::path::Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = p.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*want))
}

fn mounted_by(d: &Daemon, name: &str) -> u64 {
    let (st, v) = d.get(&format!("/v1/volumes/{name}"));
    assert_eq!(st, 200, "{v}");
    v["mounted_by"].as_u64().unwrap()
}

/// Waits for a volume nobody uses any more to be unmounted from the host.
/// A destroy's 204 means its volumes are free: counted down and, unused, unmounted from the
/// host (a `volume rm` right after it must work).
fn assert_released(d: &Daemon, name: &str) {
    let mnt = host_mnt(d, "default", name);
    assert_eq!(mounted_by(d, name), 0, "volume {name} still counted as mounted after the destroy");
    assert!(!host_mounted(&mnt), "volume {name} still mounted on the host after the destroy");
}

fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[test]
fn volumes_carry_data_between_sandboxes_and_hold_their_cap() {
    require_root!();
    let d = Daemon::start();

    // Create, refuse duplicates and bad input, list.
    let (st, v) = d.post("/v1/volumes", &json!({ "name": "data", "size_mb": 20 }));
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (v["name"].as_str(), v["size_mb"].as_u64(), v["mounted_by"].as_u64()),
        (Some("data"), Some(20), Some(0))
    );
    let (st, v) = d.post("/v1/volumes", &json!({ "name": "data", "size_mb": 20 }));
    assert_eq!((st, error_code(&v)), (409, "conflict"), "{v}");
    for bad in [
        json!({ "name": "../x", "size_mb": 20 }),
        json!({ "name": "Big", "size_mb": 20 }),
        json!({ "name": "tiny", "size_mb": 1 }),
    ] {
        let (st, v) = d.post("/v1/volumes", &bad);
        assert_eq!((st, error_code(&v)), (400, "invalid_request"), "{bad}: {v}");
    }
    let (st, v) = d.get("/v1/volumes");
    assert_eq!(st, 200);
    let names: Vec<&str> = v["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["data"], "no half-made volume listed");

    // Bad mounts are refused before anything boots.
    for (m, code, status) in [
        (vol("data", "/proc/x", false), "invalid_request", 400),
        (vol("data", "data", false), "invalid_request", 400),
        (vol("data", "/data/../etc", false), "invalid_request", 400),
        (vol("data", "/usr/local", false), "invalid_request", 400),
        (vol("data", "/", false), "invalid_request", 400),
        (vol("nope", "/data", false), "volume_not_found", 404),
    ] {
        let (st, v) = d.post("/v1/sandboxes", &sandbox_body(json!({ "volumes": [m] })));
        assert_eq!((st, error_code(&v)), (status, code), "{m}: {v}");
    }
    assert_eq!(mounted_by(&d, "data"), 0, "a refused create holds nothing");

    // A writes (as its root: the file is its root's inside, on-disk uid 0 on the host).
    // Memory well above the volume's cap: what stops the writer below is the disk.
    let limits = json!({ "memory_mb": 256 });
    let a = d.create(sandbox_body(json!({ "resources": limits, "volumes": [vol("data", "/data", false)] })));
    assert_eq!(
        d.sh_ok(&a, "echo hello > /data/f && sync && stat -c '%u %F' /data/f /data"),
        "0 regular file\n0 directory\n"
    );
    assert_eq!(d.sh_ok(&a, "stat -f -c %T /data"), "ext2/ext3\n", "a disk filesystem, not tmpfs");
    let on_host = host_mnt(&d, "default", "data").join("f");
    assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "hello\n");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&on_host).unwrap()), 0);
    assert_eq!(mounted_by(&d, "data"), 1);
    let (_, info) = d.get(&format!("/v1/sandboxes/{a}"));
    assert_eq!(info["volumes"], json!([vol("data", "/data", false)]), "{info}");
    let (st, v) = d.delete("/v1/volumes/data");
    assert_eq!((st, error_code(&v)), (409, "volume_in_use"), "{v}");

    // B mounts it read-only elsewhere, at the same time: reads A's data, cannot write.
    let b = d.create(sandbox_body(json!({ "volumes": [vol("data", "/mnt/shared", true)] })));
    assert_eq!(d.sh_ok(&b, "cat /mnt/shared/f"), "hello\n");
    let w = d.sh(&b, "echo x > /mnt/shared/g");
    assert_ne!(w["exit_code"], 0, "{w}");
    assert!(w["stderr"].as_str().unwrap().contains("Read-only file system"), "{w}");
    assert_eq!(mounted_by(&d, "data"), 2);

    // A fills the volume: ENOSPC for A; the daemon and B carry on.
    let full = d.sh(&a, "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1; sync; df -m /data | tail -1");
    let out = full["stdout"].as_str().unwrap();
    assert!(out.contains("No space left on device"), "{full}");
    let written = std::fs::metadata(host_mnt(&d, "default", "data").join("big")).unwrap().len();
    assert!(written <= 20 << 20 && written > 8 << 20, "wrote {written} bytes into a 20 MiB volume");
    let (st, _) = d.get("/healthz");
    assert_eq!(st, 200);
    assert_eq!(d.sh_ok(&b, "cat /mnt/shared/f"), "hello\n");
    assert_eq!(d.sh_ok(&a, "echo ok > /tmp/t && cat /tmp/t"), "ok\n", "A's own disk is not the volume");
    d.sh_ok(&a, "rm /data/big");

    // Both gone: the host mount goes; C (another uid range) reads what A wrote, as its root.
    for id in [&a, &b] {
        assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).0, 204);
    }
    assert_released(&d, "data");
    let c = d.create(sandbox_body(json!({ "volumes": [vol("data", "/home/user/data", false)] })));
    assert_eq!(d.sh_ok(&c, "cat /home/user/data/f; stat -c %u /home/user/data/f"), "hello\n0\n");
    assert_eq!(d.delete(&format!("/v1/sandboxes/{c}")).0, 204);
    assert_released(&d, "data");

    // Another tenant neither sees nor mounts it.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "other" }));
    assert_eq!(st, 201, "{k}");
    let key = k["key"].as_str().unwrap().to_string();
    let (st, v) = d.send(d.req_noauth(reqwest::Method::GET, "/v1/volumes").bearer_auth(&key));
    assert_eq!((st, v["volumes"].as_array().map(|a| a.len())), (200, Some(0)), "{v}");
    let body = sandbox_body(json!({ "volumes": [vol("data", "/data", false)] }));
    let (st, v) = d.send(d.req_noauth(reqwest::Method::POST, "/v1/sandboxes").bearer_auth(&key).json(&body));
    assert_eq!((st, error_code(&v)), (404, "volume_not_found"), "{v}");

    // The CLI: create, mount read-only, list, remove.
    let t = Duration::from_secs(60);
    let o = run_bounded(d.cli().args(["volume", "create", "cli-vol", "--size", "32M"]), None, t);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let o = run_bounded(d.cli().args(["sandbox", "create", "--volume", "cli-vol:/work:ro"]), None, t);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let id = o.stdout_str().trim().to_string();
    d.register(&id);
    let r = d.sh(&id, "touch /work/x");
    assert!(r["stderr"].as_str().unwrap().contains("Read-only file system"), "{r}");
    let o = run_bounded(d.cli().args(["volume", "ls"]), None, t);
    assert!(o.stdout_str().lines().any(|l| l.starts_with("cli-vol") && l.contains(" 32 ")), "{}", o.stdout_str());
    let o = run_bounded(d.cli().args(["volume", "rm", "cli-vol"]), None, t);
    assert_ne!(o.code(), Some(0), "rm of a mounted volume is refused");
    assert!(o.stderr_str().contains("volume_in_use"), "{}", o.stderr_str());
    assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).0, 204);
    assert_released(&d, "cli-vol");
    let o = run_bounded(d.cli().args(["volume", "rm", "cli-vol"]), None, t);
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());

    assert_eq!(d.delete("/v1/volumes/data").0, 204);
    let (st, v) = d.get("/v1/volumes/data");
    assert_eq!((st, error_code(&v)), (404, "volume_not_found"));
    assert!(!d.data_dir.join("volumes/default/data").exists());
    d.shutdown_and_check_leaks();
}

#[test]
fn acknowledged_volume_writes_survive_a_daemon_sigkill() {
    require_root!();
    let mut d = Daemon::start();
    let (st, v) = d.post("/v1/volumes", &json!({ "name": "keep", "size_mb": 32 }));
    assert_eq!(st, 201, "{v}");
    let (st, v) = d.post("/v1/volumes", &json!({ "name": "stale", "size_mb": 16 }));
    assert_eq!(st, 201, "{v}");
    let a = d.create(sandbox_body(json!({ "volumes": [vol("keep", "/data", false)] })));
    // Acknowledged (the exec answered), not synced: the page cache outlives the daemon.
    d.sh_ok(&a, "echo acked > /data/f");
    d.crash();
    // A host mount no sandbox uses (as a daemon that died mid-teardown leaves): the next
    // start unmounts it.
    let stale = host_mnt(&d, "default", "stale");
    let img = stale.parent().unwrap().join("disk.ext4");
    let o = run_bounded(
        std::process::Command::new("mount").arg("-o").arg("loop").arg(&img).arg(&stale),
        None,
        Duration::from_secs(20),
    );
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let d = d.restart();
    assert!(!host_mounted(&stale), "the unused host mount was swept at start");
    let live = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        let (st, v) = d.get(&format!("/v1/sandboxes/{a}"));
        (st == 200 && v["state"] == "running").then_some(())
    });
    assert!(live.is_some(), "sandbox {a} was not re-adopted:\n{}", d.log());
    // The count is rebuilt from the adopted sandbox; its mount is the one it had.
    assert_eq!(mounted_by(&d, "keep"), 1);
    assert_eq!(d.sh_ok(&a, "cat /data/f"), "acked\n");
    let (st, v) = d.delete("/v1/volumes/keep");
    assert_eq!((st, error_code(&v)), (409, "volume_in_use"), "{v}");
    // Another sandbox sees the write.
    let b = d.create(sandbox_body(json!({ "volumes": [vol("keep", "/data", true)] })));
    assert_eq!(d.sh_ok(&b, "cat /data/f"), "acked\n");
    for id in [&a, &b] {
        assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).0, 204);
    }
    assert_released(&d, "keep");
    // Nothing used: an admin sweep finds nothing to do; a tenant may not run it.
    let (st, v) = d.post("/v1/volumes/gc", &json!({}));
    assert_eq!((st, v["swept"].as_array().map(|a| a.len())), (200, Some(0)), "{v}");
    for n in ["keep", "stale"] {
        assert_eq!(d.delete(&format!("/v1/volumes/{n}")).0, 204);
    }
    d.shutdown_and_check_leaks();
}
