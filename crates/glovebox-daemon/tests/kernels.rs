//! The code-interpreter kernels (`kernels/`), driven directly on the host over their
//! JSON-lines protocol: requests on the kernel's stdin, events on its stdout.
//!
//! Every read has a deadline (a reader thread feeds a channel read with `recv_timeout`),
//! and every kernel is closed at the end of its test: stdin is closed (EOF asks it to
//! exit), and it is killed if it has not exited within a few seconds.
//!
//! Interpreters: Python is `/usr/bin/python3` unless `GLOVEBOX_TEST_PYTHON` names another
//! (e.g. a virtualenv with matplotlib/pandas); Node is `node` from PATH; the bash kernel is
//! started as the daemon starts it, `bash bash_kernel.sh`, and drives bash from `python3`.
//! Tests needing an optional module (matplotlib, pandas) or Node print a skip line and
//! pass when it is missing from this machine.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Start-up, including interpreter start and preloads.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// One ordinary cell.
const CELL_TIMEOUT: Duration = Duration::from_secs(20);
/// From SIGINT to the KeyboardInterrupt error.
const INTERRUPT_TIMEOUT: Duration = Duration::from_secs(2);
/// From closing stdin to the kernel's exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

fn kernel_path(file: &str) -> String {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "kernels", file].iter().collect();
    path.to_string_lossy().into_owned()
}

fn python() -> String {
    std::env::var("GLOVEBOX_TEST_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_string())
}

/// Whether `program args...` runs and exits 0 (used to find optional tools and modules).
fn works(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn python_has(module: &str) -> bool {
    works(&python(), &["-c", &format!("import {module}")])
}

fn node_available(test: &str) -> bool {
    let ok = works("node", &["--version"]);
    if !ok {
        println!("skip {test}: node is not installed");
    }
    ok
}

/// What one cell produced, in the shape E2B's `Execution` has.
#[derive(Debug, Default)]
struct Execution {
    events: Vec<Value>,
    stdout: String,
    stderr: String,
    results: Vec<Value>,
    error: Option<Value>,
    execution_count: Option<u64>,
}

impl Execution {
    fn main_result(&self) -> Option<&Value> {
        self.results.iter().find(|r| r["is_main_result"] == json!(true))
    }

    fn main_text(&self) -> Option<&str> {
        self.main_result().and_then(|r| r["data"]["text/plain"].as_str())
    }

    fn error_name(&self) -> Option<&str> {
        self.error.as_ref().and_then(|e| e["name"].as_str())
    }

    fn add(&mut self, event: Value) {
        match event["type"].as_str() {
            Some("stdout") => self.stdout.push_str(event["text"].as_str().unwrap_or_default()),
            Some("stderr") => self.stderr.push_str(event["text"].as_str().unwrap_or_default()),
            Some("result") => self.results.push(event.clone()),
            Some("error") => {
                assert!(self.error.is_none(), "two errors for one cell: {:?} then {event}", self.error);
                self.error = Some(event.clone());
            }
            Some("end") => self.execution_count = event["execution_count"].as_u64(),
            _ => panic!("unknown event {event}"),
        }
        self.events.push(event);
    }

    /// Index in `events` of the first event matching `pred`.
    fn position(&self, pred: impl Fn(&Value) -> bool) -> Option<usize> {
        self.events.iter().position(pred)
    }
}

struct Kernel {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Result<Value, String>>,
    next_id: u64,
    /// Events with a null id (protocol errors) seen so far.
    unaddressed: Vec<Value>,
}

impl Kernel {
    fn spawn(name: &str, program: &str, args: &[&str], envs: &[(&str, &str)]) -> Kernel {
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{name}: cannot start {program}: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parsed = serde_json::from_str::<Value>(&line).map_err(|e| format!("{e}: {line:?}"));
                if tx.send(parsed).is_err() {
                    break;
                }
            }
        });
        Kernel {
            name: name.to_string(),
            stdin: child.stdin.take(),
            child,
            events: rx,
            next_id: 0,
            unaddressed: Vec::new(),
        }
    }

    fn python() -> Kernel {
        Self::python_with(&[])
    }

    fn python_with(envs: &[(&str, &str)]) -> Kernel {
        let mut k = Kernel::spawn("python", &python(), &[&kernel_path("python_kernel.py")], envs);
        k.expect_ready("python");
        k
    }

    fn node() -> Kernel {
        let mut k = Kernel::spawn("node", "node", &[&kernel_path("node_kernel.js")], &[]);
        k.expect_ready("javascript");
        k
    }

    fn typescript() -> Kernel {
        let mut k = Kernel::spawn("typescript", "node", &[&kernel_path("node_kernel.js"), "--typescript"], &[]);
        k.expect_ready("typescript");
        k
    }

    fn r() -> Kernel {
        let mut k = Kernel::spawn("r", "Rscript", &["--no-save", "--no-restore", &kernel_path("r_kernel.R")], &[]);
        k.expect_ready("r");
        k
    }

    fn java() -> Kernel {
        let mut k = Kernel::spawn("java", "java", &["-XX:+UseSerialGC", &kernel_path("java_kernel.java")], &[]);
        k.expect_ready("java");
        k
    }

    fn bash() -> Kernel {
        // As the daemon starts it: bash hands the file to python3 from PATH.
        let mut k = Kernel::spawn("bash", "bash", &[&kernel_path("bash_kernel.sh")], &[]);
        k.expect_ready("bash");
        k
    }

    fn next_event(&mut self, deadline: Instant) -> Value {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(Ok(event)) => event,
            Ok(Err(bad)) => panic!("{}: kernel wrote a line that is not JSON: {bad}", self.name),
            Err(e) => panic!("{}: no event before the deadline ({e:?})", self.name),
        }
    }

    fn expect_ready(&mut self, language: &str) {
        let event = self.next_event(Instant::now() + READY_TIMEOUT);
        assert_eq!(event["type"], "ready", "{}: first event {event}", self.name);
        assert_eq!(event["language"], language, "{}: {event}", self.name);
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    fn send(&mut self, code: &str, env: Option<Value>) -> String {
        self.next_id += 1;
        let id = format!("req-{}", self.next_id);
        let mut request = json!({"id": id, "code": code});
        if let Some(env) = env {
            request["env"] = env;
        }
        self.send_line(&request.to_string());
        id
    }

    /// Next event of cell `id`, added to `exec`; other cells' late output is skipped.
    fn next_of(&mut self, id: &str, exec: &mut Execution, deadline: Instant) -> Value {
        loop {
            let event = self.next_event(deadline);
            if event["id"].is_null() {
                self.unaddressed.push(event);
            } else if event["id"] == id {
                exec.add(event.clone());
                return event;
            }
        }
    }

    fn finish(&mut self, id: &str, mut exec: Execution, timeout: Duration) -> Execution {
        let deadline = Instant::now() + timeout;
        while exec.execution_count.is_none() {
            self.next_of(id, &mut exec, deadline);
        }
        exec
    }

    fn run(&mut self, code: &str) -> Execution {
        let id = self.send(code, None);
        self.finish(&id, Execution::default(), CELL_TIMEOUT)
    }

    fn run_with_env(&mut self, code: &str, env: Value) -> Execution {
        let id = self.send(code, Some(env));
        self.finish(&id, Execution::default(), CELL_TIMEOUT)
    }

    /// Runs `code` with the sandbox's environment (`env`, kept) and a cell's own (`scoped_env`).
    fn run_with_envs(&mut self, code: &str, base: Value, env: Value) -> Execution {
        self.next_id += 1;
        let id = format!("req-{}", self.next_id);
        self.send_line(&json!({"id": id, "code": code, "env": base, "scoped_env": env}).to_string());
        self.finish(&id, Execution::default(), CELL_TIMEOUT)
    }

    /// Runs `code`, which must print "started" before it blocks, and interrupts it with
    /// SIGINT half a second after that; returns the cell's events and checks that the
    /// interrupt ended it in time.
    fn run_and_interrupt(&mut self, code: &str) -> Execution {
        let id = self.send(code, None);
        let mut exec = Execution::default();
        let deadline = Instant::now() + CELL_TIMEOUT;
        while !exec.stdout.contains("started") {
            let event = self.next_of(&id, &mut exec, deadline);
            assert_ne!(event["type"], "end", "{}: cell ended before the interrupt: {exec:?}", self.name);
        }
        thread::sleep(Duration::from_millis(500));
        let sent = Instant::now();
        self.sigint();
        let exec = self.finish(&id, exec, INTERRUPT_TIMEOUT);
        assert!(sent.elapsed() <= INTERRUPT_TIMEOUT);
        exec
    }

    fn sigint(&self) {
        let status = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -INT failed");
    }

    /// Closes stdin and waits for the kernel to exit.
    fn close(&mut self) -> Option<ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.close();
    }
}

fn assert_no_error(exec: &Execution) {
    assert!(exec.error.is_none(), "unexpected error: {:?}", exec.error);
}

/// Decodes standard base64 (enough to check the PNG signature of a result).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {:?}", c as char),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (i, d) in chunk.iter().enumerate() {
            n |= u32::from(*d) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

fn assert_png(result: &Value) {
    let png = result["data"]["image/png"].as_str().unwrap_or_else(|| panic!("no image/png in {result}"));
    let bytes = base64_decode(png);
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG: {:?}", &bytes[..bytes.len().min(8)]);
    assert!(bytes.len() > 1000, "PNG of {} bytes is too small to hold a plot", bytes.len());
}

// ---- Python ---------------------------------------------------------------------------

#[test]
fn python_keeps_state_and_returns_the_last_expression() {
    let mut k = Kernel::python();
    let set = k.run("x = 41");
    assert_no_error(&set);
    assert!(set.results.is_empty(), "an assignment has no result: {set:?}");
    assert_eq!(set.execution_count, Some(1));
    let get = k.run("x + 1");
    assert_no_error(&get);
    assert_eq!(get.main_text(), Some("42"));
    assert_eq!(get.execution_count, Some(2));
    assert_eq!(k.close().map(|s| s.code()), Some(Some(0)), "EOF must end the kernel with status 0");
}

#[test]
fn python_error_keeps_earlier_output_and_points_at_the_cell() {
    let mut k = Kernel::python();
    let exec = k.run("print(\"a\"); 1/0");
    assert_eq!(exec.stdout, "a\n");
    let error = exec.error.as_ref().expect("an error event");
    assert_eq!(error["name"], "ZeroDivisionError");
    assert_eq!(error["value"], "division by zero");
    let tb = error["traceback"].as_str().unwrap();
    assert!(tb.contains("1/0"), "traceback shows the cell line: {tb}");
    assert!(tb.contains("<cell-1>"), "traceback names the cell: {tb}");
    assert!(!tb.contains("python_kernel"), "traceback hides the kernel: {tb}");
    let out = exec.position(|e| e["type"] == "stdout").unwrap();
    let err = exec.position(|e| e["type"] == "error").unwrap();
    assert!(out < err, "stdout before the error: {:?}", exec.events);
    assert_eq!(exec.execution_count, Some(1));
    // The execution count goes on after an error.
    assert_eq!(k.run("1").execution_count, Some(2));
}

#[test]
fn python_syntax_error() {
    let mut k = Kernel::python();
    let exec = k.run("x = (1,\ny = 2 +");
    assert_eq!(exec.error_name(), Some("SyntaxError"), "{exec:?}");
    let tb = exec.error.as_ref().unwrap()["traceback"].as_str().unwrap();
    assert!(tb.contains("<cell-1>"), "{tb}");
    assert!(!tb.contains("python_kernel"), "{tb}");
    assert_eq!(exec.execution_count, Some(1));
}

#[test]
fn python_captures_child_process_output() {
    let mut k = Kernel::python();
    let exec = k.run("import os; os.system(\"echo from-child; echo child-err >&2\")");
    assert_no_error(&exec);
    assert!(exec.stdout.contains("from-child"), "{exec:?}");
    assert!(exec.stderr.contains("child-err"), "{exec:?}");
}

#[test]
fn python_display_gives_non_main_rich_results() {
    let mut k = Kernel::python();
    let exec = k.run(
        "class Bold:\n    def _repr_html_(self):\n        return '<b>hi</b>'\n\ndisplay(Bold())\nprint('after')\n'last'",
    );
    assert_no_error(&exec);
    assert_eq!(exec.results.len(), 2, "{exec:?}");
    let shown = &exec.results[0];
    assert_eq!(shown["is_main_result"], false);
    assert_eq!(shown["data"]["text/html"], "<b>hi</b>");
    assert!(shown["data"]["text/plain"].is_string());
    assert_eq!(exec.main_text(), Some("'last'"));
    let display = exec.position(|e| e["type"] == "result").unwrap();
    let printed = exec.position(|e| e["type"] == "stdout").unwrap();
    assert!(display < printed, "display() is emitted in order: {:?}", exec.events);
}

#[test]
fn python_matplotlib_histogram_is_a_png() {
    if !python_has("matplotlib") {
        println!("skip python_matplotlib_histogram_is_a_png: {} has no matplotlib", python());
        return;
    }
    let mut k = Kernel::python_with(&[("GLOVEBOX_PRELOAD", "matplotlib.pyplot")]);
    let exec = k.run(
        "import matplotlib.pyplot as plt\nplt.hist([1, 2, 2, 3, 3, 3])\nplt.show()\nprint('shown')\nplt.plot([1, 2, 3]);",
    );
    assert_no_error(&exec);
    let images: Vec<&Value> = exec.results.iter().filter(|r| r["data"]["image/png"].is_string()).collect();
    assert_eq!(images.len(), 2, "plt.show() and the figure left open: {exec:?}");
    for image in &images {
        assert_eq!(image["is_main_result"], false);
        assert_png(image);
    }
    let first = exec.position(|e| e["data"]["image/png"].is_string()).unwrap();
    let printed = exec.position(|e| e["type"] == "stdout").unwrap();
    assert!(first < printed, "plt.show() emits before later output: {:?}", exec.events);
    assert!(exec.main_result().is_none(), "a trailing ';' hides the value");
    // Figures were closed: the next cell emits none.
    assert!(k.run("1").results.iter().all(|r| r["data"]["image/png"].is_null()));
}

#[test]
fn python_dataframe_is_html_and_text() {
    if !python_has("pandas") {
        println!("skip python_dataframe_is_html_and_text: {} has no pandas", python());
        return;
    }
    let mut k = Kernel::python();
    let exec = k.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})");
    assert_no_error(&exec);
    let data = &exec.main_result().expect("a main result")["data"];
    assert!(data["text/html"].as_str().unwrap().contains("<table"), "{data}");
    assert!(data["text/plain"].as_str().unwrap().contains('a'), "{data}");
}

#[test]
fn python_interrupt_keeps_the_kernel_and_its_state() {
    let mut k = Kernel::python();
    assert_no_error(&k.run("x = 7"));
    // A SIGINT while idle is ignored.
    k.sigint();
    assert_eq!(k.run("x").main_text(), Some("7"));
    let exec = k.run_and_interrupt("print('started', flush=True)\nwhile True:\n    pass");
    assert_eq!(exec.error_name(), Some("KeyboardInterrupt"), "{exec:?}");
    let tb = exec.error.as_ref().unwrap()["traceback"].as_str().unwrap();
    assert!(!tb.contains("python_kernel"), "{tb}");
    assert_eq!(k.run("x").main_text(), Some("7"));
}

#[test]
fn python_kernels_do_not_share_state() {
    let mut a = Kernel::python();
    let mut b = Kernel::python();
    assert_no_error(&a.run("only_in_a = 1"));
    assert_eq!(b.run("only_in_a").error_name(), Some("NameError"));
    assert_eq!(a.run("only_in_a").main_text(), Some("1"));
}

#[test]
fn python_env_is_set_and_kept() {
    let mut k = Kernel::python();
    let exec = k.run_with_env("import os\nos.system('echo $GB_TEST_VAR')", json!({"GB_TEST_VAR": "from-request"}));
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "from-request\n");
    assert_eq!(k.run("os.environ['GB_TEST_VAR']").main_text(), Some("'from-request'"), "kept for later cells");
}

#[test]
fn python_malformed_request_is_reported_and_skipped() {
    let mut k = Kernel::python();
    k.send_line("this is not json");
    let event = k.next_event(Instant::now() + CELL_TIMEOUT);
    assert_eq!(event["type"], "error");
    assert!(event["id"].is_null(), "{event}");
    assert_eq!(event["name"], "ProtocolError");
    // With a usable id the caller is also told the request is over.
    k.send_line(r#"{"id": "no-code"}"#);
    let exec = k.finish("no-code", Execution::default(), CELL_TIMEOUT);
    assert_eq!(exec.error_name(), Some("ProtocolError"), "{exec:?}");
    assert_eq!(exec.execution_count, Some(0));
    let exec = k.run("2 * 21");
    assert_eq!(exec.main_text(), Some("42"));
    assert_eq!(exec.execution_count, Some(1), "a malformed request is not a cell");
    assert!(k.unaddressed.is_empty(), "{:?}", k.unaddressed);
}

#[test]
fn python_top_level_await() {
    let mut k = Kernel::python();
    let exec = k.run("import asyncio\nawait asyncio.sleep(0.01)\nawait asyncio.sleep(0, result=42)");
    assert_no_error(&exec);
    assert_eq!(exec.main_text(), Some("42"));
}

// ---- Node -----------------------------------------------------------------------------

#[test]
fn node_last_expression_is_inspected() {
    if !node_available("node_last_expression_is_inspected") {
        return;
    }
    let mut k = Kernel::node();
    let exec = k.run("[1,2,3].map(x => x*2)");
    assert_no_error(&exec);
    assert_eq!(exec.main_text(), Some("[ 2, 4, 6 ]"));
    assert_eq!(exec.execution_count, Some(1));
    assert_eq!(k.close().map(|s| s.code()), Some(Some(0)), "EOF must end the kernel with status 0");
}

#[test]
fn node_let_and_const_persist_and_can_be_redeclared() {
    if !node_available("node_let_and_const_persist_and_can_be_redeclared") {
        return;
    }
    let mut k = Kernel::node();
    let set = k.run("let a = 5");
    assert_no_error(&set);
    assert!(set.results.is_empty(), "a declaration has no value: {set:?}");
    assert_eq!(k.run("a * 2").main_text(), Some("10"));
    // Re-running a cell must not fail with "Identifier 'a' has already been declared".
    assert_no_error(&k.run("let a = 6; const b = 1\nclass K { get v() { return a + b } }"));
    assert_eq!(k.run("new K().v").main_text(), Some("7"));
    assert_no_error(&k.run("class K {}"));
}

#[test]
fn node_console_log_is_stdout() {
    if !node_available("node_console_log_is_stdout") {
        return;
    }
    let mut k = Kernel::node();
    let exec = k.run("console.log('hi', {a: 1}); console.error('oops')");
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "hi { a: 1 }\n");
    assert_eq!(exec.stderr, "oops\n");
    assert!(exec.results.is_empty(), "console.log returns undefined: {exec:?}");
    let child = k.run("require('child_process').execSync('echo from-child', {stdio: 'inherit'}); 1");
    assert_no_error(&child);
    assert!(child.stdout.contains("from-child"), "{child:?}");
}

#[test]
fn node_errors_have_name_message_and_trimmed_stack() {
    if !node_available("node_errors_have_name_message_and_trimmed_stack") {
        return;
    }
    let mut k = Kernel::node();
    let exec = k.run("console.log('before')\nnope + 1");
    assert_eq!(exec.stdout, "before\n");
    let error = exec.error.as_ref().expect("an error event");
    assert_eq!(error["name"], "ReferenceError");
    assert_eq!(error["value"], "nope is not defined");
    let tb = error["traceback"].as_str().unwrap();
    assert!(tb.contains("<cell-1>:2"), "{tb}");
    assert!(!tb.contains("node_kernel"), "{tb}");
    assert!(!tb.contains("node:vm"), "{tb}");
    let syntax = k.run("x = (");
    assert_eq!(syntax.error_name(), Some("SyntaxError"), "{syntax:?}");
    assert_eq!(syntax.execution_count, Some(2));
}

#[test]
fn node_interrupt_stops_a_busy_loop() {
    if !node_available("node_interrupt_stops_a_busy_loop") {
        return;
    }
    let mut k = Kernel::node();
    assert_no_error(&k.run("var kept = 3"));
    k.sigint();
    let exec = k.run_and_interrupt("console.log('started'); while (true) {}");
    assert_eq!(exec.error_name(), Some("KeyboardInterrupt"), "{exec:?}");
    assert_eq!(k.run("kept").main_text(), Some("3"));
}

#[test]
fn node_top_level_await_keeps_declarations() {
    if !node_available("node_top_level_await_keeps_declarations") {
        return;
    }
    let mut k = Kernel::node();
    let exec = k.run("const v = await new Promise(r => setTimeout(() => r(41), 10))\nv + 1");
    assert_no_error(&exec);
    assert_eq!(exec.main_text(), Some("42"));
    assert_eq!(k.run("v").main_text(), Some("41"));
}

#[test]
fn node_kernels_do_not_share_state() {
    if !node_available("node_kernels_do_not_share_state") {
        return;
    }
    let mut a = Kernel::node();
    let mut b = Kernel::node();
    assert_no_error(&a.run("var onlyInA = 1"));
    assert_eq!(b.run("onlyInA").error_name(), Some("ReferenceError"));
}

#[test]
fn node_env_of_a_cell_is_scoped_and_the_sandbox_env_kept() {
    if !node_available("node_env_of_a_cell_is_scoped_and_the_sandbox_env_kept") {
        return;
    }
    let mut k = Kernel::node();
    let exec = k.run_with_envs(
        "[process.env.GB_BASE, process.env.GB_CELL]",
        json!({"GB_BASE": "base", "GB_CELL": "base-too"}),
        json!({"GB_CELL": "cell"}),
    );
    assert_eq!(exec.main_text(), Some("[ 'base', 'cell' ]"));
    // A string value's text is the string itself.
    assert_eq!(k.run("process.env.GB_CELL").main_text(), Some("base-too"));
    let exec = k.run_with_envs("process.env.GB_ONLY_CELL", json!({}), json!({"GB_ONLY_CELL": "x"}));
    assert_eq!(exec.main_text(), Some("x"));
    assert_eq!(k.run("process.env.GB_ONLY_CELL || 'unset'").main_text(), Some("unset"));
}

#[test]
fn node_esm_imports_become_dynamic_imports() {
    if !node_available("node_esm_imports_become_dynamic_imports") {
        return;
    }
    let mut k = Kernel::node();
    let exec = k.run("\n  import { readFileSync } from 'fs'\n  console.log(typeof readFileSync)\n");
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "function\n");
    let exec = k.run("import path, { join as j } from 'node:path'\nimport * as os from 'os'\nj('a', 'b') + path.sep + typeof os.cpus");
    assert_no_error(&exec);
    assert_eq!(exec.main_text(), Some("a/b/function"));
    // The imported names stay for later cells.
    assert_eq!(k.run("typeof readFileSync").main_text(), Some("function"));
    assert_eq!(k.run("await Promise.resolve('Hello World!')").main_text(), Some("Hello World!"));
}

/// Where the `typescript` package is, if anywhere the kernel looks.
fn typescript_available(test: &str) -> bool {
    let ok = works(
        "node",
        &["-e", "for (const p of ['typescript', '/usr/local/lib/node_modules/typescript', '/usr/lib/node_modules/typescript']) { try { require.resolve(p); process.exit(0) } catch {} } process.exit(1)"],
    );
    if !ok {
        println!("skip {test}: the typescript package is not installed (npm install -g typescript)");
    }
    ok
}

#[test]
fn typescript_cells_are_transpiled() {
    if !node_available("typescript_cells_are_transpiled") || !typescript_available("typescript_cells_are_transpiled") {
        return;
    }
    let mut k = Kernel::typescript();
    let exec = k.run("const message: string = 'Hello, World!'; console.log(message)");
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "Hello, World!\n");
    let exec = k.run("interface P { x: number }\nconst p: P = { x: 41 }\nawait Promise.resolve(p.x + 1)");
    assert_no_error(&exec);
    assert_eq!(exec.main_text(), Some("42"));
    assert_eq!(k.run("nope()").error_name(), Some("ReferenceError"));
}

#[test]
fn r_values_print_as_at_the_console() {
    if !works("Rscript", &["-e", "library(jsonlite)"]) {
        println!("skip r_values_print_as_at_the_console: Rscript with jsonlite is not installed");
        return;
    }
    let mut k = Kernel::r();
    let exec = k.run("print(\"Hello, World!\")");
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "[1] \"Hello, World!\"\n");
    assert!(exec.results.is_empty(), "print() returns invisibly: {exec:?}");
    let exec =
        k.run_with_envs("x <- 1:3\nx * 2\nSys.getenv('GB_CELL')", json!({"GB_BASE": "b"}), json!({"GB_CELL": "c"}));
    assert_no_error(&exec);
    assert_eq!(exec.results.len(), 2, "{exec:?}");
    assert_eq!(exec.results[0]["data"]["text/plain"], "[1] 2 4 6");
    assert_eq!(exec.main_text(), Some("[1] \"c\""));
    assert_eq!(k.run("Sys.getenv('GB_CELL', unset = 'default')").main_text(), Some("[1] \"default\""));
    assert_eq!(k.run("Sys.getenv('GB_BASE')").main_text(), Some("[1] \"b\""));
    let exec = k.run("stop('boom')");
    assert_eq!(exec.error_name(), Some("Error"));
    assert_eq!(exec.error.as_ref().unwrap()["value"], "boom");
    assert_eq!(k.run("f <- function( {").error_name(), Some("SyntaxError"));
    assert_eq!(k.run("x").main_text(), Some("[1] 1 2 3"), "state survives errors");
    assert_eq!(exec.execution_count, Some(5));
}

#[test]
fn r_and_java_interrupts_keep_state() {
    if works("Rscript", &["-e", "library(jsonlite)"]) {
        let mut k = Kernel::r();
        assert_no_error(&k.run("kept <- 3"));
        k.sigint();
        let exec = k.run_and_interrupt("cat('started\\n')\nrepeat { x <- 1 }");
        assert_eq!(exec.error_name(), Some("KeyboardInterrupt"), "{exec:?}");
        assert_eq!(k.run("kept").main_text(), Some("[1] 3"));
    }
    if works("java", &["-version"]) {
        let mut k = Kernel::java();
        assert_no_error(&k.run("int kept = 3;"));
        k.sigint();
        // The JVM handles signals on a thread of its own, a moment after they arrive: let the
        // idle SIGINT be handled (and ignored) before the next cell starts.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let exec = k.run_and_interrupt("System.out.println(\"started\"); while (true) {}");
        assert_eq!(exec.error_name(), Some("KeyboardInterrupt"), "{exec:?}");
        let after = k.run("kept");
        assert_eq!(after.main_text(), Some("3"), "{after:?}");
    }
}

#[test]
fn java_snippets_run_in_one_jshell() {
    if !works("java", &["-version"]) {
        println!("skip java_snippets_run_in_one_jshell: no JDK");
        return;
    }
    let mut k = Kernel::java();
    let exec = k.run("System.out.println(\"Hello, World!\")");
    assert_no_error(&exec);
    assert_eq!(exec.events[0]["text"], "Hello, World!", "one event per line, without its newline");
    let exec = k.run_with_envs("System.getProperty(\"GB_CELL\")", json!({"GB_BASE": "b"}), json!({"GB_CELL": "c"}));
    assert_eq!(exec.main_text(), Some("c"), "a String value without its quotes");
    assert_eq!(k.run("System.getProperty(\"GB_CELL\", \"default\")").main_text(), Some("default"));
    assert_eq!(k.run("System.getProperty(\"GB_BASE\")").main_text(), Some("b"));
    assert_eq!(k.run("int x = 5;\nList<Integer> l = new ArrayList<>(List.of(x));\nl").main_text(), Some("[5]"));
    assert_eq!(k.run("1/0").error_name(), Some("ArithmeticException"));
    assert_eq!(k.run("int y = \"s\";").error_name(), Some("CompilationError"));
    assert_eq!(k.run("x * 2").main_text(), Some("10"));
}

// ---- bash -----------------------------------------------------------------------------

#[test]
fn bash_echo_is_stdout_without_result() {
    let mut k = Kernel::bash();
    let exec = k.run("echo $((6*7))");
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "42\n");
    assert!(exec.results.is_empty());
    assert_eq!(exec.execution_count, Some(1));
    let split = k.run("echo out; echo err >&2");
    assert_eq!(split.stdout, "out\n");
    assert_eq!(split.stderr, "err\n");
    assert_eq!(k.close().map(|s| s.code()), Some(Some(0)), "EOF must end the kernel with status 0");
}

#[test]
fn bash_keeps_variables_functions_and_cwd() {
    let mut k = Kernel::bash();
    assert_no_error(&k.run("X=5"));
    assert_eq!(k.run("echo $X").stdout, "5\n");
    assert_no_error(&k.run("cd /tmp"));
    assert_eq!(k.run("pwd").stdout, "/tmp\n");
    assert_no_error(&k.run("greet() { echo \"hello $1\"; }"));
    assert_eq!(k.run("greet you").stdout, "hello you\n");
}

#[test]
fn bash_failing_last_command_is_an_exit_code_error() {
    let mut k = Kernel::bash();
    let exec = k.run("echo partial; false");
    assert_eq!(exec.stdout, "partial\n");
    assert_eq!(exec.error_name(), Some("ExitCode"), "{exec:?}");
    assert_eq!(exec.error.as_ref().unwrap()["value"], "exit status 1");
    assert_eq!(k.run("if then").error_name(), Some("SyntaxError"));
    assert_no_error(&k.run("true"));
}

#[test]
fn bash_interrupt_stops_the_command_and_keeps_state() {
    let mut k = Kernel::bash();
    assert_no_error(&k.run("X=5"));
    k.sigint();
    let exec = k.run_and_interrupt("echo started; sleep 100; echo not-reached");
    assert_eq!(exec.error_name(), Some("KeyboardInterrupt"), "{exec:?}");
    assert!(!exec.stdout.contains("not-reached"), "the rest of the cell is abandoned: {exec:?}");
    assert_eq!(k.run("echo $X").stdout, "5\n");
}

#[test]
fn bash_env_of_a_cell_is_exported_for_that_cell() {
    let mut k = Kernel::bash();
    let exec = k.run_with_envs(
        "sh -c 'echo $GB_TEST_VAR $GB_BASE'",
        json!({"GB_BASE": "base", "GB_TEST_VAR": "before"}),
        json!({"GB_TEST_VAR": "a b'c"}),
    );
    assert_no_error(&exec);
    assert_eq!(exec.stdout, "a b'c base\n");
    assert_eq!(k.run("echo \"$GB_TEST_VAR\"").stdout, "before\n");
    assert_no_error(&k.run_with_envs("true", json!({}), json!({"GB_NEW": "x"})));
    assert_eq!(k.run("echo \"${GB_NEW:-unset}\"").stdout, "unset\n");
}
