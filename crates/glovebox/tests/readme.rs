//! The README runs as written (issue 29): every ```sh block of README.md after "the two
//! commands", then those of docs/e2b.md, docs/network.md, docs/templates.md,
//! docs/volumes.md and docs/install.md ([`DOCS`]), in order, in one bash process, as root
//! would type them on a fresh Debian 12 machine after command 1 (command 2 is the suite this
//! test is part of).
//! Nothing is skipped but lines ending in [`SKIP`], and those ending in [`NEEDS_SYSTEMD`]
//! where systemd is not PID 1. The Debian package docs/install.md installs is purged
//! afterwards with every other package the lines added. Each line must exit 0, or with the
//! status a trailing `# exits N` states; a trailing comment that is only digits (`# 3`,
//! `# 42`) is the last line of output it must print.
//!
//! Not run: docs/threat-model.md's block, which is `cargo test` of suites scripts/test runs
//! anyway (this test among them); the other docs have no shell blocks.
//!
//! What stands in for what, and why:
//! - cwd is a temp dir with fresh copies of the repo files the README names (`scripts/`,
//!   `templates/`, `examples/`), so nothing the README writes (`data.csv`, `script.py`) lands in the repo;
//!   `target/x86_64-unknown-linux-gnu/release` there is a symlink to the directory of the
//!   binaries under test (a debug build), so the README's `export PATH=…/release:$PATH` runs
//!   unchanged. HOME is a fresh temp dir; the environment is cleared but for HOME, PATH, LANG
//!   and proxies.
//! - the data dir is the README's `/var/lib/glovebox`: one there before is set aside and put
//!   back after; the one the README made is removed with the sandboxes it holds destroyed.
//! - `glovebox template build … -t code-interpreter` (824 MiB, minutes to build) finds its
//!   layers cached: when the template store scripts/test built (`GLOVEBOX_TEMPLATES_DIR`) holds
//!   a build of the same Dockerfile, its layers are hard-linked into the fresh data dir's
//!   layer cache first, as if the user had built it once before. The build still runs every
//!   step's cache lookup and saves the template; the test checks each RUN/COPY step reported
//!   `(cached)`. Without such a store the build runs in full.
//! - Debian bases (`FROM debian:bookworm-slim`) come from the debootstrap cache every test
//!   daemon shares (`GLOVEBOX_BASE_CACHE`); the template's own RUN steps run for real.
//!
//! `GLOVEBOX_README_KEEP=1` keeps the script and each line's output (`out/<i>.{out,err,rc}`).
//!
//! It holds the host-wide lock [`SYSTEM_LOCK`] throughout: the package test also installs
//! into /var/lib/glovebox and /etc/glovebox.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The one marker that skips a line: it needs the internet beyond PyPI, npm and the Debian
/// archive, which tests may not reach.
const SKIP: &str = "# needs the internet";
/// Lines that need systemd as PID 1 (`systemctl`, `journalctl`): run where it is, skipped
/// where it is not (CI's containers).
const NEEDS_SYSTEMD: &str = "# needs systemd";
const SYSTEM_LOCK: &str = "/run/lock/glovebox-system-install.lock";
const DATA_DIR: &str = "/var/lib/glovebox";
const SET_ASIDE: &str = "/var/lib/glovebox.before-readme-test";
/// Markdown files run, in order.
const DOCS: &[&str] =
    &["README.md", "docs/e2b.md", "docs/network.md", "docs/templates.md", "docs/volumes.md", "docs/install.md"];
/// Repo paths the README names, copied into the test's cwd.
const REPO_FILES: &[&str] = &["scripts", "templates", "examples", "packaging", "Cargo.toml", "README.md"];
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

/// One shell command of a doc: its first line's number, its text (continuation lines
/// joined with newlines) and what it must do.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    doc: &'static str,
    line: usize,
    text: String,
    expect: Expect,
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Status(i32),
    /// Exit 0, the last line of stdout this.
    Output(String),
    Skip,
}

/// The ```sh blocks of `md`: each a list of (line number, text).
fn sh_blocks(md: &str) -> Vec<Vec<(usize, String)>> {
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<(usize, String)>> = None;
    for (i, l) in md.lines().enumerate() {
        match (&mut cur, l.trim_end()) {
            (None, "```sh") => cur = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(cur.take()),
            (Some(b), _) => b.push((i + 1, l.to_string())),
            (None, _) => {}
        }
    }
    blocks
}

/// Where the trailing comment of a shell line starts: a `#` outside quotes, at the start
/// or after a blank.
fn comment_start(l: &str) -> Option<usize> {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    for (i, c) in l.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single && prev != '\\' => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return Some(i),
            _ => {}
        }
        prev = c;
    }
    None
}

fn expect_of(comment: &str) -> Expect {
    let c = comment.trim_start_matches('#').trim();
    if comment.trim_end().ends_with(SKIP) {
        Expect::Skip
    } else if comment.trim_end().ends_with(NEEDS_SYSTEMD) {
        if Path::new("/run/systemd/system").is_dir() {
            Expect::Status(0)
        } else {
            Expect::Skip
        }
    } else if !c.is_empty() && c.chars().all(|ch| ch.is_ascii_digit()) {
        Expect::Output(c.to_string())
    } else if let Some(n) = c.strip_prefix("exits ").and_then(|r| r.split_whitespace().next()?.parse().ok()) {
        Expect::Status(n)
    } else {
        Expect::Status(0)
    }
}

/// The commands of one block: comment-only and blank lines dropped; a line ending in `\` or
/// `|` (before its comment) continues on the next.
fn commands(doc: &'static str, block: &[(usize, String)]) -> Vec<Line> {
    let mut out = Vec::new();
    let mut open: Option<Line> = None;
    for (n, l) in block {
        let code = comment_start(l).map_or(l.as_str(), |i| &l[..i]).trim_end();
        let comment = comment_start(l).map(|i| &l[i..]).unwrap_or("");
        if open.is_none() && code.trim().is_empty() {
            continue;
        }
        let line = match open.take() {
            Some(mut o) => {
                o.text.push('\n');
                o.text.push_str(l);
                if o.expect == Expect::Status(0) {
                    o.expect = expect_of(comment);
                }
                o
            }
            None => Line { doc, line: *n, text: l.clone(), expect: expect_of(comment) },
        };
        if code.ends_with('\\') || code.ends_with('|') {
            open = Some(line);
        } else {
            out.push(line);
        }
    }
    out.extend(open);
    out
}

/// Every command the test runs, in order. README.md's first block is the two commands
/// themselves (build; the suite this test belongs to), which it does not run.
fn doc_commands(root: &Path) -> Vec<Line> {
    let mut all = Vec::new();
    for doc in DOCS {
        let md = fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("read {doc}: {e}"));
        let mut blocks = sh_blocks(&md);
        assert!(!blocks.is_empty(), "{doc} has no ```sh block");
        if *doc == "README.md" {
            let two = blocks.remove(0).into_iter().map(|(_, l)| l).collect::<Vec<_>>().join("\n");
            assert!(
                two.contains("cargo build --release") && two.contains("scripts/test"),
                "README.md's first ```sh block is no longer the two commands (build, scripts/test):\n{two}"
            );
        }
        for b in &blocks {
            all.extend(commands(doc, b));
        }
    }
    all
}

/// The bash script: each command runs in the script's own shell (so `export`, `ID=…` and
/// `. venv/bin/activate` carry over) with its stdout and stderr in `out/<i>.{out,err}` and
/// its status, start and end times in `out/<i>.rc`; the first unexpected status ends the script.
fn script(lines: &[Line], out: &Path) -> String {
    let o = out.display();
    let mut s = String::from("# generated by crates/glovebox/tests/readme.rs\n");
    for (i, l) in lines.iter().enumerate() {
        let want = match l.expect {
            Expect::Skip => continue,
            Expect::Status(n) => n,
            Expect::Output(_) => 0,
        };
        s.push_str(&format!("t=$EPOCHREALTIME\n{{ {}\n}} >{o}/{i}.out 2>{o}/{i}.err </dev/null\n", l.text));
        s.push_str(&format!("rc=$?; echo $rc $t $EPOCHREALTIME >{o}/{i}.rc; [ $rc = {want} ] || exit 100\n"));
    }
    s
}

/// What went wrong with line `i`, if anything; None also for lines not reached.
fn verdict(l: &Line, i: usize, out: &Path) -> Option<String> {
    let rc = fs::read_to_string(out.join(format!("{i}.rc"))).ok()?;
    let rc: i32 = rc.split_whitespace().next()?.parse().ok()?;
    let stdout = fs::read_to_string(out.join(format!("{i}.out"))).unwrap_or_default();
    let stderr = fs::read_to_string(out.join(format!("{i}.err"))).unwrap_or_default();
    let problem = match &l.expect {
        Expect::Skip => return None,
        Expect::Status(want) if rc != *want => format!("exited {rc}, not {want}"),
        Expect::Output(_) if rc != 0 => format!("exited {rc}"),
        Expect::Output(want) if stdout.lines().last().map(str::trim) != Some(want) => {
            format!("printed a last line other than {want:?}")
        }
        _ => return None,
    };
    Some(format!(
        "{}:{}: {problem}\n  $ {}\n  --- stdout\n{}\n  --- stderr\n{}",
        l.doc,
        l.line,
        l.text,
        tail(&stdout),
        tail(&stderr)
    ))
}

/// How long line `i` ran, if it ran.
fn seconds(i: usize, out: &Path) -> Option<f64> {
    let rc = fs::read_to_string(out.join(format!("{i}.rc"))).ok()?;
    let t: Vec<f64> = rc.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    Some(t.get(1)? - t.first()?)
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `/var/lib/glovebox` for the test's length: a fresh one; what was there before is put back
/// when dropped (also on panic), the README's removed.
struct DataDir {
    had: bool,
}

impl DataDir {
    fn take() -> DataDir {
        assert!(
            !Path::new(SET_ASIDE).exists(),
            "{SET_ASIDE} exists: an earlier run of this test ended before putting it back to {DATA_DIR}; \
             move it back by hand"
        );
        let had = Path::new(DATA_DIR).exists();
        if had {
            fs::rename(DATA_DIR, SET_ASIDE).expect("set the data dir aside");
        }
        DataDir { had }
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(DATA_DIR) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("remove {DATA_DIR}: {e}");
            }
        }
        if self.had {
            if let Err(e) = fs::rename(SET_ASIDE, DATA_DIR) {
                eprintln!("put {SET_ASIDE} back to {DATA_DIR}: {e}");
            }
        }
    }
}

/// Links the layers of the shared store's `code-interpreter` into the fresh data dir's layer
/// cache when that store built the same Dockerfile; true if it did.
fn seed_code_interpreter(repo: &Path) -> bool {
    use sha2::Digest;
    let Some(store) = std::env::var_os("GLOVEBOX_TEMPLATES_DIR").map(PathBuf::from) else {
        eprintln!("GLOVEBOX_TEMPLATES_DIR unset: the README builds code-interpreter in full");
        return false;
    };
    let spec = fs::read(repo.join("templates/code-interpreter/Dockerfile")).expect("Dockerfile");
    let digest: String = sha2::Sha256::digest(&spec).iter().map(|b| format!("{b:02x}")).collect();
    let built = fs::read_to_string(store.join("code-interpreter.spec")).unwrap_or_default();
    let meta: Option<Value> =
        fs::read(store.join("templates/code-interpreter.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let (true, Some(meta)) = (built.trim() == digest, meta) else {
        eprintln!("{} holds no build of this Dockerfile: the README builds it in full", store.display());
        return false;
    };
    let layers = Path::new(DATA_DIR).join("layers");
    fs::create_dir_all(&layers).expect("layers dir");
    for id in meta["layers"].as_array().expect("layers").iter().filter_map(Value::as_str) {
        let o = run_bounded(
            Command::new("cp").arg("-al").arg(store.join("layers").join(id)).arg(layers.join(id)),
            None,
            Duration::from_secs(120),
        );
        assert_eq!(o.code(), Some(0), "link layer {id}: {}", o.stderr_str());
    }
    true
}

fn installed_packages() -> BTreeSet<String> {
    let o = run_bounded(
        Command::new("dpkg-query").args(["-W", "-f", "${db:Status-Abbrev} ${Package}\n"]),
        None,
        Duration::from_secs(30),
    );
    o.stdout_str().lines().filter_map(|l| l.strip_prefix("ii ")).map(|p| p.trim().to_string()).collect()
}

/// Processes whose cwd is under `dir` (what the script left running: the README's daemon).
fn processes_in(dir: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cwd) = fs::read_link(e.path().join("cwd")) else { continue };
        if cwd.starts_with(dir) {
            let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            found.push((pid, cmd.trim().to_string()));
        }
    }
    found
}

fn signal(pid: u32, sig: &str) {
    let _ = run_bounded(Command::new("kill").args([sig, &pid.to_string()]), None, Duration::from_secs(5));
}

/// Destroys every sandbox of the README's daemon and stops it; the ids of every sandbox it
/// ever had (for the leak check), its pid and what went wrong.
fn stop_daemon(cwd: &Path) -> (BTreeSet<String>, Vec<u32>, Vec<String>) {
    let mut ids = BTreeSet::new();
    let mut problems = Vec::new();
    let key = fs::read_to_string(Path::new(DATA_DIR).join("api-key")).unwrap_or_default();
    let http =
        reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().expect("client");
    let get = |path: &str| -> Option<Value> {
        http.get(format!("http://127.0.0.1:7171{path}")).bearer_auth(key.trim()).send().ok()?.json().ok()
    };
    let procs = processes_in(cwd);
    let daemons: Vec<u32> = procs.iter().filter(|(_, c)| c.contains(" serve")).map(|(p, _)| *p).collect();
    if !daemons.is_empty() {
        for e in get("/v1/events?limit=1000").and_then(|v| v["events"].as_array().cloned()).unwrap_or_default() {
            ids.extend(e["sandbox_id"].as_str().map(String::from));
        }
        for s in get("/v1/sandboxes").and_then(|v| v["sandboxes"].as_array().cloned()).unwrap_or_default() {
            let Some(id) = s["id"].as_str() else { continue };
            ids.insert(id.to_string());
            let r = http.delete(format!("http://127.0.0.1:7171/v1/sandboxes/{id}")).bearer_auth(key.trim()).send();
            if !r.as_ref().is_ok_and(|r| r.status().is_success() || r.status() == 410) {
                problems.push(format!("destroy {id}: {r:?}"));
            }
        }
    }
    for (pid, _) in &procs {
        signal(*pid, "-TERM");
    }
    for (pid, cmd) in &procs {
        let gone = poll(Duration::from_secs(30), Duration::from_millis(50), || {
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        });
        if gone.is_none() {
            signal(*pid, "-KILL");
            problems.push(format!("{cmd} (pid {pid}) outlived SIGTERM by 30 s"));
        }
    }
    (ids, daemons, problems)
}

#[test]
fn readme_runs_as_written() {
    require_root!();
    let t0 = Instant::now();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lines = doc_commands(&root);
    let lock = fs::File::create(SYSTEM_LOCK).expect("open the system-install lock");
    lock.lock().expect("take the system-install lock");
    assert!(
        std::net::TcpListener::bind("127.0.0.1:7171").is_ok(),
        "127.0.0.1:7171 is taken: the README's daemon needs it (is a glovebox serve running?)"
    );

    let work = tempdir("readme");
    let (repo, home, out) = (work.path().join("repo"), work.path().join("home"), work.path().join("out"));
    for d in [&repo, &home, &out] {
        fs::create_dir_all(d).expect("mkdir");
    }
    for f in REPO_FILES {
        let o = run_bounded(Command::new("cp").arg("-a").arg(root.join(f)).arg(&repo), None, Duration::from_secs(30));
        assert_eq!(o.code(), Some(0), "copy {f}: {}", o.stderr_str());
    }
    // The README's release dir, standing for the debug build under test.
    let bins = glovebox_bin().parent().expect("bin dir").to_path_buf();
    fs::create_dir_all(repo.join("target/x86_64-unknown-linux-gnu")).expect("target dir");
    std::os::unix::fs::symlink(&bins, repo.join("target/x86_64-unknown-linux-gnu/release")).expect("symlink");
    let script_path = work.path().join("readme.sh");
    fs::write(&script_path, script(&lines, &out)).expect("script");

    let packages = installed_packages();
    let data_dir = DataDir::take();
    let seeded = seed_code_interpreter(&repo);
    let mut bash = Command::new("bash");
    bash.args(["--noprofile", "--norc"])
        .arg(&script_path)
        .current_dir(&repo)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LANG", "C.UTF-8")
        .env("USER", "root")
        .env(
            "GLOVEBOX_BASE_CACHE",
            std::env::var_os("GLOVEBOX_BASE_CACHE")
                .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("glovebox-base-cache").into()),
        );
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.to_ascii_lowercase().ends_with("_proxy")) {
            bash.env(k, v);
        }
    }
    // Not run_bounded: a script past its time must still have its daemon stopped and the
    // data dir put back before the test fails.
    let log = |n: &str| fs::File::create(work.path().join(n)).expect("script log");
    let mut child = bash
        .stdin(std::process::Stdio::null())
        .stdout(log("script.out"))
        .stderr(log("script.err"))
        .spawn()
        .expect("spawn bash");
    let status = wait_bounded(&mut child, SCRIPT_TIMEOUT);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let ran_for = t0.elapsed();

    let (mut ids, daemons, mut problems) = stop_daemon(&repo);
    // Also the sandboxes only its log names (warm ones, builds' steps).
    if let Some(i) = lines.iter().position(|l| l.text.starts_with("glovebox serve")) {
        ids.extend(ids_in_log(&fs::read_to_string(out.join(format!("{i}.err"))).unwrap_or_default()));
    }
    let added: Vec<String> = installed_packages().difference(&packages).cloned().collect();
    if !added.is_empty() {
        let o = run_bounded(
            Command::new("apt-get").args(["purge", "-y", "-q"]).args(&added).env("DEBIAN_FRONTEND", "noninteractive"),
            None,
            Duration::from_secs(300),
        );
        if o.code() != Some(0) {
            problems.push(format!("apt-get purge {added:?}: {}", o.stderr_str()));
        }
    }
    drop(data_dir);
    let leaked = leaks(&ids, &daemons);

    // What the README's lines did, first failure first.
    let failures: Vec<String> = lines.iter().enumerate().filter_map(|(i, l)| verdict(l, i, &out)).collect();
    let reached = (0..lines.len()).filter(|i| out.join(format!("{i}.rc")).exists()).count();
    let runnable = lines.iter().filter(|l| l.expect != Expect::Skip).count();
    eprintln!(
        "readme: {reached}/{runnable} lines ran ({} skipped) in {:.0} s; {} sandboxes; code-interpreter layers {}",
        lines.len() - runnable,
        ran_for.as_secs_f64(),
        ids.len(),
        if seeded { "linked from the shared store" } else { "built" }
    );
    for (i, l) in lines.iter().enumerate() {
        if let Some(t) = seconds(i, &out).filter(|t| *t >= 5.0) {
            eprintln!("  {t:5.1} s  {}:{}  {}", l.doc, l.line, l.text.lines().next().unwrap_or(""));
        }
    }
    let script_err = fs::read_to_string(work.path().join("script.err")).unwrap_or_default();
    if std::env::var_os("GLOVEBOX_README_KEEP").is_some() {
        let kept = work.keep();
        eprintln!("readme: the script and each line's output are kept in {}", kept.display());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        status.is_some_and(|s| s.success()),
        "the script ended with {status:?} (None: killed after {SCRIPT_TIMEOUT:?}) at {reached}/{runnable} lines:\n{script_err}"
    );
    assert_eq!(reached, runnable, "not every line ran");
    if seeded {
        let i = lines.iter().position(|l| l.text.contains("-t code-interpreter")).expect("the build line");
        let log = fs::read_to_string(out.join(format!("{i}.err"))).unwrap_or_default();
        let uncached: Vec<&str> = log
            .lines()
            .filter(|l| (l.contains(" : RUN ") || l.contains(" : COPY ")) && !l.ends_with("(cached)"))
            .collect();
        assert!(
            uncached.is_empty(),
            "code-interpreter steps built despite the linked layers:\n{}",
            uncached.join("\n")
        );
    }
    assert!(problems.is_empty(), "cleanup: {}", problems.join("\n"));
    assert!(leaked.is_empty(), "left on the host:\n  {}", leaked.join("\n  "));
    drop(lock);
}

mod parse {
    use super::*;

    #[test]
    fn blocks_commands_and_expectations() {
        let md = "x\n```sh\n# only a comment\nexport A=1\n\nrun -- sh -c 'exit 3'; echo $?   # 3\n\
                  a \\\n  b | \n  c  # exits 124 after 2 s\ncurl 'x # y' # needs the internet\n```\n\
                  ```python\nprint(1)  # 42\n```\n```sh\nls # lists it\n```\n";
        let blocks = sh_blocks(md);
        assert_eq!(blocks.len(), 2);
        let c = commands("R", &blocks[0]);
        let got: Vec<(usize, &str, &Expect)> = c.iter().map(|l| (l.line, l.text.as_str(), &l.expect)).collect();
        assert_eq!(
            got,
            vec![
                (4, "export A=1", &Expect::Status(0)),
                (6, "run -- sh -c 'exit 3'; echo $?   # 3", &Expect::Output("3".into())),
                (7, "a \\\n  b | \n  c  # exits 124 after 2 s", &Expect::Status(124)),
                (10, "curl 'x # y' # needs the internet", &Expect::Skip),
            ]
        );
        assert_eq!(commands("R", &blocks[1])[0].expect, Expect::Status(0));
    }

    #[test]
    fn comments_start_outside_quotes() {
        assert_eq!(comment_start("echo '# no' \"# no\" # yes"), Some(19));
        assert_eq!(comment_start("echo $#"), None);
        assert_eq!(comment_start("# all"), Some(0));
    }

    #[test]
    fn the_readme_parses() {
        let lines = doc_commands(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
        assert!(lines.iter().any(|l| l.expect == Expect::Status(124)));
        assert!(lines.iter().any(|l| l.expect == Expect::Output("42".into())));
        assert!(lines.iter().any(|l| l.text.contains("python3 examples/e2b_quickstart.py")));
        assert!(!lines.iter().any(|l| l.text.contains("scripts/test")));
    }
}
