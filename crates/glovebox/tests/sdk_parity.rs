//! End to end: the CLI, the Python SDK and the TypeScript SDK give the same results for the
//! same scenario against one daemon. Each client creates its own sandbox, runs a command
//! that writes to both streams and exits 3, writes a file and reads it back, runs the cell
//! `6*7`, destroys the sandbox, and reports a normalised summary
//! `{exit_code, stdout, stderr, file_content, code_result}`. The three summaries must be
//! equal to each other and to what the scenario should give.
//!
//! The Python SDK has no dependencies and runs from `sdk/python/src`. The TypeScript SDK is
//! compiled with the checkout's `tsc` into this test's own directory, so a concurrent
//! `sdk/typescript/run_tests.sh` (which deletes `dist/`) cannot race it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{run_bounded, tempdir, Daemon};
use serde_json::{json, Value};

/// What the command runs (as an argv: `sh -c SCRIPT`).
const SCRIPT: &str = "echo out; echo err >&2; exit 3";
/// Written and read back; not ASCII, ends without a newline, so encodings and trimming show.
const CONTENT: &str = "parity ✓ héllo\nsecond line";
/// Where it is written (relative paths start at /home/user; the CLI takes absolute ones).
const FILE: &str = "/home/user/parity.txt";
/// A client gets this long for the whole scenario.
const CLIENT_BUDGET: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn expected() -> Value {
    json!({
        "exit_code": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "file_content": CONTENT,
        "code_result": "42",
    })
}

/// Parses a client's one-line JSON report, registering the sandbox it made for the leak
/// check and dropping the id (which differs by construction).
fn summary(d: &Daemon, who: &str, out: &common::Outcome) -> Value {
    assert!(
        out.status.success(),
        "{who} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout_str(),
        out.stderr_str()
    );
    let line = out.stdout_str().lines().last().unwrap_or_default().to_string();
    let mut v: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        panic!("{who}: last stdout line is not JSON ({e}): {line:?}\nstderr:\n{}", out.stderr_str())
    });
    let id = v.as_object_mut().and_then(|m| m.remove("id"));
    let id = id.as_ref().and_then(Value::as_str).unwrap_or_else(|| panic!("{who}: no sandbox id in {line}"));
    d.register(id);
    v
}

// --- the CLI ---------------------------------------------------------------------------

fn via_cli(d: &Daemon) -> Value {
    let cli = |args: &[&str]| {
        let mut c = d.cli();
        c.args(args);
        run_bounded(&mut c, None, CLIENT_BUDGET)
    };
    let ok = |what: &str, o: &common::Outcome| {
        assert!(o.status.success(), "glovebox {what}: {}\n{}", o.status, o.stderr_str());
    };
    let o = cli(&["sandbox", "create", "--timeout", "2m"]);
    ok("sandbox create", &o);
    let id = o.stdout_str().trim().to_string();
    assert!(!id.is_empty() && !id.contains(char::is_whitespace), "sandbox create printed {:?}", o.stdout_str());
    d.register(&id);

    let exec = cli(&["sandbox", "exec", &id, "--", "sh", "-c", SCRIPT]);

    let local = tempdir("gb-parity-");
    let src = local.path().join("parity.txt");
    std::fs::write(&src, CONTENT).expect("write local file");
    let o = cli(&["files", "put", &id, src.to_str().expect("utf-8 temp path"), FILE]);
    ok("files put", &o);
    let get = cli(&["files", "get", &id, FILE]);
    ok("files get", &get);

    let code = cli(&["sandbox", "code", &id, "6*7"]);
    ok("sandbox code", &code);

    ok("sandbox kill", &cli(&["sandbox", "kill", &id]));
    // The CLI prints the cell's main result as a line of text.
    let code_out = code.stdout_str();
    json!({
        // `glovebox sandbox exec` exits with the command's own code.
        "exit_code": exec.code(),
        "stdout": exec.stdout_str(),
        "stderr": exec.stderr_str(),
        "file_content": String::from_utf8(get.stdout).expect("file is UTF-8"),
        "code_result": code_out.strip_suffix('\n').unwrap_or(&code_out),
    })
}

// --- the Python SDK --------------------------------------------------------------------

const PYTHON: &str = r#"
import json, sys
from glovebox import Sandbox

script, content, path = sys.argv[1:4]
with Sandbox.create(timeout=120) as sb:
    r = sb.commands.run(["sh", "-c", script])
    sb.files.write(path, content)
    got = sb.files.read(path)
    ex = sb.run_code("6*7")
    print(json.dumps({
        "id": sb.id,
        "exit_code": r.exit_code,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "file_content": got,
        "code_result": ex.text,
    }))
"#;

fn via_python(d: &Daemon) -> Value {
    let mut c = Command::new("python3");
    c.args(["-c", PYTHON, SCRIPT, CONTENT, FILE])
        .env("PYTHONPATH", repo().join("sdk/python/src"))
        .env("GLOVEBOX_URL", &d.url)
        .env("GLOVEBOX_API_KEY", &d.key)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    summary(d, "the Python SDK", &run_bounded(&mut c, None, CLIENT_BUDGET))
}

// --- the TypeScript SDK ----------------------------------------------------------------

const NODE: &str = r#"
const [sdk, script, content, path] = process.argv.slice(1);
const { Sandbox } = await import(sdk);
const sb = await Sandbox.create({ timeoutMs: 120_000 });
try {
  const r = await sb.commands.run(["sh", "-c", script]);
  await sb.files.write(path, content);
  const got = await sb.files.read(path);
  const ex = await sb.runCode("6*7");
  console.log(JSON.stringify({
    id: sb.id,
    exit_code: r.exitCode,
    stdout: r.stdout,
    stderr: r.stderr,
    file_content: got,
    code_result: ex.text,
  }));
} finally {
  await sb.kill();
}
"#;

/// Compiles `sdk/typescript/src` into this test's directory (installing the dev
/// dependencies first if the checkout has none) and returns the entry module.
fn build_ts_sdk() -> PathBuf {
    let ts = repo().join("sdk/typescript");
    if !ts.join("node_modules/typescript").is_dir() {
        eprintln!("sdk/typescript has no node_modules: running npm ci");
        let o = run_bounded(
            Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&ts),
            None,
            Duration::from_secs(300),
        );
        assert!(o.status.success(), "npm ci in sdk/typescript failed:\n{}{}", o.stdout_str(), o.stderr_str());
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("sdk-parity-ts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("ts output dir");
    // The compiled files are ES modules, which Node decides from the nearest package.json.
    std::fs::write(out.join("package.json"), r#"{"type": "module"}"#).expect("package.json");
    let dist = out.join("dist");
    let o = run_bounded(
        Command::new("npx")
            .args([
                "--no-install",
                "tsc",
                "-p",
                "tsconfig.json",
                "--declaration",
                "false",
                "--declarationMap",
                "false",
                "--outDir",
            ])
            .arg(&dist)
            .current_dir(&ts),
        None,
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "tsc failed for sdk/typescript:\n{}{}", o.stdout_str(), o.stderr_str());
    let entry = dist.join("index.js");
    assert!(entry.is_file(), "tsc did not produce {}", entry.display());
    entry
}

fn via_typescript(d: &Daemon, entry: &Path) -> Value {
    let mut c = Command::new("node");
    c.args(["--input-type=module", "-e", NODE])
        .arg(format!("file://{}", entry.display()))
        .args([SCRIPT, CONTENT, FILE])
        .env("GLOVEBOX_URL", &d.url)
        .env("GLOVEBOX_API_KEY", &d.key);
    summary(d, "the TypeScript SDK", &run_bounded(&mut c, None, CLIENT_BUDGET))
}

#[test]
fn cli_python_and_typescript_agree() {
    require_root!();
    let entry = build_ts_sdk();
    let d = Daemon::start();
    let cli = via_cli(&d);
    let python = via_python(&d);
    let typescript = via_typescript(&d, &entry);
    let _ = std::fs::remove_dir_all(entry.parent().and_then(Path::parent).expect("ts output dir"));
    assert_eq!(cli, expected(), "the CLI");
    assert_eq!(python, cli, "the Python SDK differs from the CLI");
    assert_eq!(typescript, cli, "the TypeScript SDK differs from the CLI");
    d.shutdown_and_check_leaks();
}
