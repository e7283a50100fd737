//! `glovebox doctor`: what this host offers Glovebox, each check with its fix.
//!
//! Checks read what the kernel publishes (`/proc`, `/sys`), ask nf_tables over netlink, and
//! finally boot one sandbox embedded and run `true` in it — the check that proves the rest
//! (namespaces, cgroups, id-mapped mounts, seccomp, the agent) work together. Exit status 0
//! when nothing failed (warnings allowed), 1 otherwise.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct DoctorArgs {
    /// The daemon's data directory (for the free-space and template checks).
    #[arg(long, default_value = "/var/lib/glovebox", env = "GLOVEBOX_DATA_DIR")]
    data_dir: PathBuf,
    /// Skip the last check (booting a sandbox).
    #[arg(long)]
    no_boot: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Check {
    level: Level,
    what: String,
    fix: Option<String>,
}

fn ok(what: impl Into<String>) -> Check {
    Check { level: Level::Ok, what: what.into(), fix: None }
}
fn warn(what: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { level: Level::Warn, what: what.into(), fix: Some(fix.into()) }
}
fn fail(what: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { level: Level::Fail, what: what.into(), fix: Some(fix.into()) }
}

pub async fn run(a: DoctorArgs) -> Result<i32> {
    let checks = [
        kernel(),
        root(),
        user_namespaces(),
        time_namespace(),
        cgroups(),
        cgroup_migrations(),
        filesystem("overlay", "overlayfs (template layers)", "load it: modprobe overlay"),
        seccomp(),
        landlock(),
        nftables(),
        gvisor(),
        volumes(),
        template(&a.data_dir),
        disk(&a.data_dir),
    ];
    let mut failed = 0;
    let mut report = |c: &Check| {
        let tag = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        println!("{tag}  {}", c.what);
        if let Some(f) = &c.fix {
            println!("      → {f}");
        }
        if c.level == Level::Fail {
            failed += 1;
        }
    };
    for c in &checks {
        report(c);
    }
    if !a.no_boot {
        report(&boot().await);
    }
    println!(
        "{}",
        if failed == 0 {
            "glovebox doctor: this host can run Glovebox".to_string()
        } else {
            format!("glovebox doctor: {failed} check(s) failed")
        }
    );
    Ok(if failed == 0 { 0 } else { 1 })
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `6.1.0-18-amd64` → (6, 1).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn kernel() -> Check {
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    match kernel_version(&release) {
        // Id-mapped mounts (5.12) are what the root filesystem needs; time namespaces 5.6.
        Some(v) if v >= (5, 12) => ok(format!("kernel {release}")),
        Some(_) => fail(format!("kernel {release}"), "Glovebox needs Linux 5.12 or later (id-mapped mounts)"),
        None => warn(format!("kernel version unreadable ({release:?})"), "check /proc/sys/kernel/osrelease"),
    }
}

fn root() -> Check {
    let status = read("/proc/self/status").unwrap_or_default();
    let euid = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2));
    if euid == Some("0") {
        ok("running as root")
    } else {
        fail(
            "not running as root",
            "run the daemon (and this check) as root: sandboxes need namespaces, cgroups and mounts",
        )
    }
}

fn user_namespaces() -> Check {
    match read("/proc/sys/user/max_user_namespaces").and_then(|s| s.trim().parse::<u64>().ok()) {
        Some(0) => {
            fail("user namespaces disabled (user.max_user_namespaces = 0)", "sysctl -w user.max_user_namespaces=15000")
        }
        Some(n) => ok(format!("user namespaces (max {n})")),
        None => fail("user namespaces unavailable", "a kernel built with CONFIG_USER_NS is needed"),
    }
}

fn time_namespace() -> Check {
    if Path::new("/proc/self/ns/time").exists() {
        ok("time namespaces")
    } else {
        warn("no time namespaces", "sandboxes share the host's monotonic clock offsets (Linux 5.6+ has them)")
    }
}

fn cgroups() -> Check {
    let root = Path::new("/sys/fs/cgroup");
    let v2_controllers =
        read("/sys/fs/cgroup/cgroup.controllers").or_else(|| read("/sys/fs/cgroup/unified/cgroup.controllers"));
    match glovebox_jail::cgroup::detect(root).map(|d| d.version()) {
        Ok(glovebox_jail::cgroup::Version::V2) => {
            ok(format!("cgroup v2 (controllers: {})", v2_controllers.unwrap_or_default().trim()))
        }
        Ok(_) => {
            let mounted: Vec<&str> = ["memory", "pids", "cpu", "cpuset", "blkio", "freezer"]
                .into_iter()
                .filter(|c| root.join(c).join("tasks").exists() || root.join(c).join("cgroup.procs").exists())
                .collect();
            let v2 = match v2_controllers.as_deref().map(str::trim) {
                Some("") => "; v2 has no controllers".to_string(),
                Some(c) => format!("; v2: {c}"),
                None => String::new(),
            };
            let c = format!("cgroup v1 hybrid ({}{v2})", mounted.join(", "));
            if mounted.contains(&"freezer") {
                ok(c)
            } else {
                warn(c, "no freezer hierarchy: pause/resume is unavailable")
            }
        }
        Err(e) => fail(format!("cgroups: {e}"), "mount cgroup2 on /sys/fs/cgroup with memory, pids and cpu enabled"),
    }
}

/// Whether moving a process into a cgroup waits for an RCU grace period after a quiet spell
/// (`glovebox_daemon::cgroup_tuning`): creates and first commands pay it when favordynmods is
/// off — on v1 hierarchies. On a v2 host a create migrates nothing (the jailer clones the
/// sandbox's first process into its cgroup; Linux 5.7, below the 5.12 this needs anyway).
fn cgroup_migrations() -> Check {
    if matches!(
        glovebox_jail::cgroup::detect(Path::new("/sys/fs/cgroup")).map(|d| d.version()),
        Ok(glovebox_jail::cgroup::Version::V2)
    ) {
        return ok("cgroup migrations: none per create (cgroup v2: a sandbox starts in its cgroup)");
    }
    match glovebox_daemon::cgroup_tuning::cgroup2_mount() {
        Ok(Some(m)) if m.favors_dynmods() => {
            ok(format!("cgroup migrations: favordynmods on ({}): no grace period per create", m.path.display()))
        }
        Ok(Some(m)) => warn(
            format!(
                "cgroup migrations: favordynmods off ({}): a create after a quiet spell waits an RCU grace period (2-16 ms)",
                m.path.display()
            ),
            format!(
                "glovebox serve --cgroup-favor-dynmods (or mount -o remount,favordynmods {}; or boot with \
                 cgroup_favordynmods=true); it makes every fork and exit on the host slightly costlier",
                m.path.display()
            ),
        ),
        Ok(None) => warn(
            "cgroup migrations: no cgroup2 mount to set favordynmods on",
            "boot with cgroup_favordynmods=true for cheaper cgroup migrations",
        ),
        Err(e) => warn(format!("cgroup migrations: {e}"), "cannot read /proc/self/mountinfo"),
    }
}

fn filesystem(name: &str, what: &str, fix: &str) -> Check {
    let known = read("/proc/filesystems").unwrap_or_default();
    if known.lines().any(|l| l.split_whitespace().last() == Some(name)) {
        ok(what)
    } else {
        fail(format!("{what}: not available"), fix)
    }
}

/// Volumes are ext4 images (made with `mkfs.ext4`) the daemon mounts through loop devices.
/// Without them only volumes are unavailable.
fn volumes() -> Check {
    let on_path = |exe: &str| {
        std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .chain([PathBuf::from("/sbin"), PathBuf::from("/usr/sbin")])
                    .any(|d| d.join(exe).is_file())
            })
            .unwrap_or(false)
    };
    let ext4 =
        read("/proc/filesystems").unwrap_or_default().lines().any(|l| l.split_whitespace().last() == Some("ext4"));
    let missing: Vec<&str> = [
        (!on_path("mkfs.ext4")).then_some("mkfs.ext4 (apt-get install e2fsprogs)"),
        (!ext4).then_some("the ext4 filesystem (modprobe ext4)"),
        (!Path::new("/dev/loop-control").exists()).then_some("loop devices (modprobe loop)"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() {
        ok("volumes (ext4 images on loop devices)")
    } else {
        warn(
            format!("volumes unavailable: missing {}", missing.join(", ")),
            "install or load what is missing (or scripts/deps)",
        )
    }
}

fn seccomp() -> Check {
    let status = read("/proc/self/status").unwrap_or_default();
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        ok("seccomp filters")
    } else {
        fail("seccomp unavailable", "a kernel built with CONFIG_SECCOMP_FILTER is needed")
    }
}

fn landlock() -> Check {
    let Some(lsms) = read("/sys/kernel/security/lsm") else {
        return warn(
            "Landlock: cannot tell (securityfs is not mounted on /sys/kernel/security)",
            "optional today; `mount -t securityfs securityfs /sys/kernel/security` lets this check see the active LSMs",
        );
    };
    if lsms.split(',').any(|l| l.trim() == "landlock") {
        ok(format!("Landlock LSM active ({})", lsms.trim()))
    } else {
        warn(
            format!("Landlock LSM not active (active: {})", lsms.trim()),
            "optional today; boot with lsm=…,landlock to enable it",
        )
    }
}

/// The gVisor tier (`isolation: "gvisor"`) is optional: without runsc those creates answer 503.
fn gvisor() -> Check {
    match glovebox_daemon::backend::gvisor::Runsc::detect() {
        Ok(r) => ok(format!("gVisor tier: {} (platform {})", r.path.display(), r.platform)),
        Err(why) => warn(
            format!("gVisor tier unavailable: {why}"),
            "optional: `apt-get install runsc` for sandboxes created with isolation gvisor",
        ),
    }
}

fn nftables() -> Check {
    match glovebox_daemon::net::probe_nftables() {
        Ok(n) => ok(format!("nf_tables over netlink ({n} inet tables)")),
        Err(e) => fail(format!("nf_tables: {e}"), "network policies need nf_tables (modprobe nf_tables)"),
    }
}

fn template(data_dir: &Path) -> Check {
    // Built on this data dir, or in a shared read-only store (`GLOVEBOX_TEMPLATES_DIR`).
    let built_in = |store: &Path| store.join("templates/code-interpreter.json").is_file();
    let shared = std::env::var_os("GLOVEBOX_TEMPLATES_DIR").map(PathBuf::from);
    match [Some(data_dir.to_path_buf()), shared].into_iter().flatten().find(|d| built_in(d)) {
        Some(store) => ok(format!("template code-interpreter built ({})", store.display())),
        None => warn(
            "template code-interpreter not built (the first sandbox that asks for it builds it, a few minutes)",
            "glovebox template build -f templates/code-interpreter/Dockerfile -t code-interpreter",
        ),
    }
}

fn disk(data_dir: &Path) -> Check {
    // The data dir may not exist yet: its nearest existing ancestor is where it will live.
    let mut at = data_dir;
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    match rustix::fs::statvfs(at) {
        Ok(s) => {
            let free = s.f_bavail * s.f_frsize;
            let gib = free as f64 / (1u64 << 30) as f64;
            let what = format!("{gib:.1} GiB free for {}", data_dir.display());
            if free < 2 << 30 {
                warn(what, "templates and sandboxes' writes need space: keep a few GiB free")
            } else {
                ok(what)
            }
        }
        Err(e) => warn(format!("free space of {}: {e}", at.display()), "check the data directory"),
    }
}

async fn boot() -> Check {
    let dir = match tempfile_dir() {
        Ok(d) => d,
        Err(e) => return fail(format!("boot a sandbox: {e}"), "check /tmp"),
    };
    let started = Instant::now();
    let result = async {
        let e = crate::embedded::Embedded::start(&dir).await?;
        let client = e.client()?;
        let r = async {
            let sb = client.create(&glovebox_proto::api::CreateSandbox::default()).await?;
            let exec = glovebox_proto::api::ExecRequest {
                cmd: glovebox_proto::api::Command::Argv(vec!["true".into()]),
                cwd: None,
                env: Default::default(),
                stdin: None,
                stdin_base64: None,
                timeout_ms: None,
                max_output_bytes: None,
                output_tail_bytes: None,
                encoding: glovebox_proto::api::Encoding::Utf8,
                background: false,
            };
            let r: Result<glovebox_proto::api::ExecResult> = client
                .json(client.req(reqwest::Method::POST, &format!("/v1/sandboxes/{}/exec", sb.id)).json(&exec))
                .await;
            let _ = client.kill(&sb.id).await;
            r.map(|r| r.exit_code)
        }
        .await;
        e.stop().await;
        r
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(0) => ok(format!("a sandbox boots and runs `true` ({} ms, embedded)", started.elapsed().as_millis())),
        Ok(code) => {
            fail(format!("a sandbox ran `true` with exit code {code}"), "see GLOVEBOX_LOG=debug glovebox run -- true")
        }
        Err(e) => fail(format!("a sandbox did not boot: {e:#}"), "see GLOVEBOX_LOG=debug glovebox run -- true"),
    }
}

fn tempfile_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("glovebox-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_parse() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.15.153.1-microsoft-standard-WSL2"), Some((5, 15)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
