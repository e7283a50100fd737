//! The spare: a process started ahead of the next command so that the costly part of
//! starting one (fork, moving it into its own cgroup — a cgroup migration waits for an RCU
//! grace period, milliseconds on cgroup v1) is off the command's path.
//!
//! A spare is spawned exactly like a user command — new session, no capabilities,
//! no_new_privs, seccomp — running `glovebox-agent spare`, and is moved into its command
//! cgroup by the agent. It then blocks reading its job (argv, env, cwd) from fd 3 and execs
//! it. Being already as unprivileged as the code it will become, hijacking it while it waits
//! gains nothing. If the exec fails it reports on its own stderr (the command's stderr) and
//! exits 127 or 126, as a shell would.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub struct Job {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// Largest job accepted (argv + env of one command).
const MAX_JOB: u64 = 8 << 20;

/// Entry point of `glovebox-agent spare`.
pub fn main() -> ! {
    let Some(fd) = glovebox_jail::child::take_fd3() else {
        eprintln!("glovebox: spare started without a job channel");
        std::process::exit(125);
    };
    // Room for a typical job up front: read_to_end on an empty Vec starts with a 32-byte
    // probe and grows, four reads for a short command where two do.
    let mut buf = Vec::with_capacity(16 << 10);
    let job: Job = match std::fs::File::from(fd).take(MAX_JOB).read_to_end(&mut buf) {
        // An empty read means the agent dropped this spare (sandbox ending): just leave.
        Ok(0) => std::process::exit(0),
        Ok(_) => match serde_json::from_slice(&buf) {
            Ok(j) => j,
            Err(e) => fail(125, &format!("bad job: {e}")),
        },
        Err(e) => fail(125, &format!("read job: {e}")),
    };
    let Some((prog, args)) = job.argv.split_first() else { fail(125, "empty command") };
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).env_clear().envs(job.env.iter().map(|(k, v)| (k, v))).current_dir(&job.cwd);
    let e = cmd.exec();
    let code = match e.kind() {
        std::io::ErrorKind::PermissionDenied => 126,
        _ => 127,
    };
    let what = if std::path::Path::new(&job.cwd).is_dir() { prog.clone() } else { format!("cwd {}", job.cwd) };
    fail(code, &format!("{what}: {e}"))
}

fn fail(code: i32, msg: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "glovebox: {msg}");
    std::process::exit(code)
}
