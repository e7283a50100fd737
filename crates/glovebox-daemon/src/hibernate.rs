//! Whether this host could hibernate a sandbox (write its processes' memory to disk with
//! CRIU), and the reason it cannot: the text of the 501 `hibernate_unavailable` answer.
//!
//! The probe runs once per process, when the first request asks for hibernate (a daemon that is
//! never asked runs no CRIU child: `criu check` takes ~0.1 s and holds two pipes while it runs):
//! it looks for a CRIU binary (`GLOVEBOX_CRIU`, then `scripts/build-criu`'s install path, then
//! `criu` on the PATH), reads its version and runs `criu check`. The verdict is cached;
//! [`unavailable_reason`] composes the message from it. It blocks: async callers run it with
//! `spawn_blocking`.
//!
//! Even where CRIU 4 passes its check, a Glovebox sandbox cannot be checkpointed (measured with
//! CRIU 4.1.1, docs/hibernate.md): the sandbox's network namespace is made by the host's root
//! (so the daemon can plug its link in), not inside the sandbox's user namespace, and CRIU
//! refuses a tree whose namespaces are not all owned by its user namespace; and CRIU has no
//! support for Landlock, whose ruleset confines the agent (PID 1): a restored agent would come
//! back unconfined. So hibernate is never offered by this release; the probe says how far the
//! host gets.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where `scripts/build-criu` installs its CRIU.
pub const BUILT_CRIU: &str = "/usr/local/lib/glovebox/criu/sbin/criu";

/// What the probe found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No CRIU binary at any of these places.
    NoCriu { searched: Vec<String> },
    /// A CRIU older than 4 (Debian 12's 3.17.1 fails `criu check` on recent kernels).
    TooOld { path: String, version: String },
    /// CRIU 4+ whose `criu check` failed (or could not run): its output's last line.
    CheckFailed { path: String, version: String, output: String },
    /// CRIU 4+ whose `criu check` passed.
    CheckPassed { path: String, version: String },
}

static VERDICT: OnceLock<Verdict> = OnceLock::new();

/// The probe's verdict: probed on the first call (blocking, at most ~25 s when CRIU hangs),
/// cached for the rest of the process.
pub fn verdict() -> &'static Verdict {
    VERDICT.get_or_init(|| {
        let t = Instant::now();
        let v = probe(&candidates());
        tracing::info!(verdict = ?v, ms = t.elapsed().as_millis() as u64, "hibernate probe");
        v
    })
}

/// The reason hibernate is unavailable here, from the probe's verdict (blocking on first use).
pub fn unavailable_reason() -> String {
    compose(Some(verdict()))
}

/// The places a CRIU binary is looked for, in order.
fn candidates() -> Vec<PathBuf> {
    let mut c: Vec<PathBuf> = std::env::var_os("GLOVEBOX_CRIU").map(PathBuf::from).into_iter().collect();
    c.push(PathBuf::from(BUILT_CRIU));
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin".into());
    c.extend(std::env::split_paths(&path).map(|d| d.join("criu")));
    c
}

fn probe(candidates: &[PathBuf]) -> Verdict {
    let Some(path) = candidates.iter().find(|p| p.is_file()) else {
        let mut searched: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        searched.dedup();
        return Verdict::NoCriu { searched };
    };
    let shown = path.display().to_string();
    let version = match run(path, &["--version"], Duration::from_secs(5)) {
        Ok((_, out)) => parse_version(&out).unwrap_or_else(|| "unknown".into()),
        Err(e) => return Verdict::CheckFailed { path: shown, version: "unknown".into(), output: e },
    };
    if major(&version).is_none_or(|m| m < 4) {
        return Verdict::TooOld { path: shown, version };
    }
    match run(path, &["check"], Duration::from_secs(20)) {
        Ok((true, _)) => Verdict::CheckPassed { path: shown, version },
        Ok((false, out)) => Verdict::CheckFailed { path: shown, version, output: last_error(&out) },
        Err(e) => Verdict::CheckFailed { path: shown, version, output: e },
    }
}

/// Runs `exe args…` with a time bound; (exit status 0, stdout and stderr).
fn run(exe: &Path, args: &[&str], limit: Duration) -> Result<(bool, String), String> {
    let mut child = Command::new(exe)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let (mut so, mut se) = (child.stdout.take(), child.stderr.take());
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = se.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{} {}` took longer than {limit:?}", exe.display(), args.join(" ")));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", exe.display())),
        }
    };
    let mut out = String::new();
    if let Some(o) = so.as_mut() {
        let _ = o.read_to_string(&mut out);
    }
    out.push_str(&err_reader.join().unwrap_or_default());
    Ok((status.success(), out))
}

/// `Version: 4.1.1` (CRIU's `--version`) → `4.1.1`.
fn parse_version(out: &str) -> Option<String> {
    out.lines().find_map(|l| l.trim().strip_prefix("Version:")).map(|v| v.trim().to_string())
}

fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.trim().parse().ok()
}

/// The line of a failed `criu check` that says why: its last `Error` line, else its last line.
fn last_error(out: &str) -> String {
    let lines: Vec<&str> = out.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = lines.iter().rev().find(|l| l.contains("Error")).or(lines.last()).copied().unwrap_or("no output");
    line.chars().take(300).collect()
}

/// Why a Glovebox sandbox cannot be checkpointed even by a CRIU that passes its check.
const JAIL_REASON: &str = "CRIU cannot checkpoint a Glovebox sandbox: its network namespace belongs to the \
     host's user namespace, not the sandbox's (CRIU 4.1.1 stops with \"One or more namespaces doesn't \
     belong to the target user namespace\"), and CRIU does not save Landlock rulesets, so the agent \
     (PID 1, Landlock-confined) would be restored unconfined";

/// The message of the 501 for a verdict (`None`: the probe has not finished).
pub fn compose(v: Option<&Verdict>) -> String {
    let host = match v {
        None => "the CRIU probe has not finished yet".to_string(),
        Some(Verdict::NoCriu { searched }) => format!(
            "no CRIU binary found (looked at {}; scripts/build-criu builds CRIU 4 from Debian's source package)",
            searched.join(", ")
        ),
        Some(Verdict::TooOld { path, version }) => {
            format!("{path} is CRIU {version}; 4 or later is needed (scripts/build-criu builds one)")
        }
        Some(Verdict::CheckFailed { path, version, output }) => {
            format!("`{path} check` (CRIU {version}) failed: {output}")
        }
        Some(Verdict::CheckPassed { path, version }) => format!("CRIU {version} at {path} passes `criu check`, but"),
    };
    let sep = if matches!(v, Some(Verdict::CheckPassed { .. })) { " " } else { "; and " };
    format!("{host}{sep}{JAIL_REASON}; pause stays memory-resident (use on_idle \"pause\")")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_says_what_the_probe_found() {
        let passed = compose(Some(&Verdict::CheckPassed { path: BUILT_CRIU.into(), version: "4.1.1".into() }));
        assert!(passed.starts_with("CRIU 4.1.1 at /usr/local/lib/glovebox/criu/sbin/criu passes `criu check`, but CRIU cannot checkpoint a Glovebox sandbox: its network namespace"), "{passed}");
        assert!(passed.contains("Landlock") && passed.ends_with("use on_idle \"pause\")"), "{passed}");

        let none = compose(Some(&Verdict::NoCriu { searched: vec!["/a/criu".into(), "/b/criu".into()] }));
        assert!(none.starts_with("no CRIU binary found (looked at /a/criu, /b/criu;"), "{none}");
        assert!(none.contains("; and CRIU cannot checkpoint a Glovebox sandbox"), "{none}");

        let old = compose(Some(&Verdict::TooOld { path: "/usr/sbin/criu".into(), version: "3.17.1".into() }));
        assert!(old.starts_with("/usr/sbin/criu is CRIU 3.17.1; 4 or later is needed"), "{old}");

        let failed = compose(Some(&Verdict::CheckFailed {
            path: "/x/criu".into(),
            version: "4.0".into(),
            output: "Error (criu/cr-check.c:1): vdso".into(),
        }));
        assert!(
            failed.starts_with("`/x/criu check` (CRIU 4.0) failed: Error (criu/cr-check.c:1): vdso; and "),
            "{failed}"
        );

        assert!(compose(None).starts_with("the CRIU probe has not finished yet; and "));
    }

    #[test]
    fn versions_and_errors_are_read_from_criu_output() {
        assert_eq!(parse_version("Version: 4.1.1\n").as_deref(), Some("4.1.1"));
        assert_eq!(parse_version("Version: 3.17.1\nGitID: v3.17.1\n").as_deref(), Some("3.17.1"));
        assert_eq!(parse_version("garbage"), None);
        assert_eq!(major("4.1.1"), Some(4));
        assert_eq!(major("3.17.1"), Some(3));
        assert_eq!(major("unknown"), None);
        let out =
            "Warn  (criu/kerndat.c:1285): x\nError (criu/cr-check.c:1007): failed to mount autofs\nLooks good but\n";
        assert_eq!(last_error(out), "Error (criu/cr-check.c:1007): failed to mount autofs");
        assert_eq!(last_error(""), "no output");
    }

    #[test]
    fn a_missing_binary_is_reported_with_where_it_was_looked_for() {
        let v = probe(&[PathBuf::from("/nonexistent/criu"), PathBuf::from("/nonexistent/criu")]);
        assert_eq!(v, Verdict::NoCriu { searched: vec!["/nonexistent/criu".into()] });
    }

    #[test]
    fn a_binary_that_is_not_criu_is_too_old_or_failing() {
        // `/bin/true --version` prints nothing: version unknown, so not CRIU 4.
        let v = probe(&[PathBuf::from("/bin/true")]);
        assert_eq!(v, Verdict::TooOld { path: "/bin/true".into(), version: "unknown".into() });
    }
}
