//! The code interpreter end to end: stateful contexts, rich results, errors, timeouts,
//! languages — through `POST /v1/sandboxes/{id}/code` on a real daemon.
//!
//! Tests that need numpy/pandas/matplotlib use the `code-interpreter` template, which
//! `scripts/test` builds and points `GLOVEBOX_TEMPLATES_DIR` at; without it they say so and
//! stop (the rest run on the base template's stdlib Python).

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{sandbox_body, Daemon};
use reqwest::Method;
use serde_json::{json, Value};

fn code(d: &Daemon, id: &str, body: Value) -> Value {
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/code"), &body);
    assert_eq!(st, 200, "run_code: {v}");
    v
}

fn main_text(ex: &Value) -> Option<String> {
    ex["results"]
        .as_array()?
        .iter()
        .find(|r| r["is_main_result"] == true)
        .and_then(|r| r["data"]["text/plain"].as_str().map(str::to_string))
}

fn stdout(ex: &Value) -> String {
    ex["logs"]["stdout"].as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect()).unwrap_or_default()
}

fn have_ci_template() -> bool {
    let ok = std::env::var_os("GLOVEBOX_TEMPLATES_DIR")
        .map(|d| std::path::Path::new(&d).join("templates/code-interpreter.json").is_file())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: no code-interpreter template (scripts/test builds it: scripts/build-code-interpreter)");
    }
    ok
}

#[test]
fn state_persists_and_errors_are_structured() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));

    let ex = code(&d, &id, json!({ "code": "x = 41" }));
    assert!(ex["error"].is_null(), "{ex}");
    let ex = code(&d, &id, json!({ "code": "x + 1" }));
    assert_eq!(main_text(&ex).as_deref(), Some("42"), "{ex}");
    assert!(ex["execution_count"].as_u64().unwrap_or(0) >= 2, "{ex}");

    let ex = code(&d, &id, json!({ "code": "print(\"a\")\n1/0" }));
    assert_eq!(stdout(&ex), "a\n", "output before the error is kept: {ex}");
    assert_eq!(ex["error"]["name"], "ZeroDivisionError", "{ex}");
    let tb = ex["error"]["traceback"].as_str().unwrap_or_default();
    assert!(tb.contains("1/0"), "the traceback names the user's line: {tb}");
    assert!(!tb.contains("python_kernel"), "no kernel internals in the traceback: {tb}");

    let ex = code(&d, &id, json!({ "code": "def f(:\n  pass" }));
    assert_eq!(ex["error"]["name"], "SyntaxError", "{ex}");

    // Output of child processes is captured too.
    let ex = code(&d, &id, json!({ "code": "import os; os.system('echo from-child')" }));
    assert!(stdout(&ex).contains("from-child"), "{ex}");
    d.shutdown_and_check_leaks();
}

#[test]
fn timeout_interrupts_the_cell_and_keeps_the_context() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    code(&d, &id, json!({ "code": "kept = 'yes'" }));
    let t = Instant::now();
    let ex = code(&d, &id, json!({ "code": "while True: pass", "timeout_ms": 1000 }));
    let took = t.elapsed();
    assert_eq!(ex["error"]["name"], "TimeoutError", "{ex}");
    assert!(took < Duration::from_millis(2500), "a 1 s budget took {took:?}");
    let ex = code(&d, &id, json!({ "code": "kept" }));
    if ex["context_restarted"] != true {
        assert_eq!(main_text(&ex).as_deref(), Some("'yes'"), "state survives an interrupt: {ex}");
    }
    // A cell that ignores the interrupt gets its kernel killed and the context restarted.
    let ex = code(
        &d,
        &id,
        json!({ "code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.01)", "timeout_ms": 500 }),
    );
    assert_eq!(ex["error"]["name"], "TimeoutError", "{ex}");
    assert_eq!(ex["context_restarted"], true, "{ex}");
    let ex = code(&d, &id, json!({ "code": "1 + 1" }));
    assert_eq!(main_text(&ex).as_deref(), Some("2"), "the restarted context works: {ex}");
    d.shutdown_and_check_leaks();
}

/// A caller that gives up on a cell (its own HTTP timeout) does not leave the context busy:
/// the next cell interrupts the abandoned one, keeps the state, and runs at once — whether
/// or not the daemon noticed the dropped connection first.
#[test]
fn a_cell_whose_caller_left_does_not_hold_up_the_next() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "timeout_s": 120 })));
    code(&d, &id, json!({ "code": "kept = 'yes'" }));
    for round in 0..3 {
        let gave_up = d
            .req(Method::POST, &format!("/v1/sandboxes/{id}/code"))
            .json(&json!({ "code": "import time\ntime.sleep(300)", "timeout_ms": 0 }))
            .timeout(Duration::from_millis(700))
            .send();
        assert!(gave_up.is_err(), "round {round}: a 300 s cell answered within 0.7 s: {gave_up:?}");
        let t = Instant::now();
        let ex = code(&d, &id, json!({ "code": "kept" }));
        let took = t.elapsed();
        assert_eq!(main_text(&ex).as_deref(), Some("'yes'"), "round {round}: {ex}");
        assert!(ex["error"].is_null() && ex["context_restarted"] != true, "round {round}: {ex}");
        assert!(took < Duration::from_secs(5), "round {round}: the next cell waited {took:?}");
    }
    d.shutdown_and_check_leaks();
}
/// A cell's time budget means what a command's does: `0` is no budget of its own (the
/// sandbox's lifetime bounds it), and a budget longer than any sandbox lives is a 400.
#[test]
fn a_zero_budget_means_no_limit_of_its_own_as_for_commands() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "timeout_s": 30 })));
    let ex = code(&d, &id, json!({ "code": "import time\ntime.sleep(1.5)\n6 * 7", "timeout_ms": 0 }));
    assert!(ex["error"].is_null(), "{ex}");
    assert_eq!(main_text(&ex).as_deref(), Some("42"), "{ex}");
    let r = d.exec(&id, json!({ "cmd": ["sh", "-c", "sleep 1.5; echo done"], "timeout_ms": 0 }));
    assert_eq!((r["stdout"].as_str(), r["timed_out"].as_bool()), (Some("done\n"), Some(false)), "{r}");
    for path in ["code", "exec"] {
        let body = json!({ "code": "1", "cmd": ["true"], "timeout_ms": 86_400_001u64 });
        let mut body = body.as_object().unwrap().clone();
        body.remove(if path == "code" { "cmd" } else { "code" });
        let (st, v) = d.post(&format!("/v1/sandboxes/{id}/{path}"), &Value::Object(body));
        assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{path}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("longer than any sandbox can live"), "{v}");
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn contexts_are_isolated_and_restart_clears_them() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let (st, a) = d.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({ "language": "python" }));
    assert_eq!(st, 201, "{a}");
    let (_, b) = d.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({ "language": "python", "cwd": "/tmp" }));
    let (a, b) = (a["id"].as_str().unwrap_or_default().to_string(), b["id"].as_str().unwrap_or_default().to_string());
    code(&d, &id, json!({ "code": "v = 'in-a'", "context_id": a }));
    let ex = code(&d, &id, json!({ "code": "v", "context_id": b }));
    assert_eq!(ex["error"]["name"], "NameError", "contexts share no variables: {ex}");
    let ex = code(&d, &id, json!({ "code": "import os; os.getcwd()", "context_id": b }));
    assert_eq!(main_text(&ex).as_deref(), Some("'/tmp'"), "{ex}");

    let (st, l) = d.get(&format!("/v1/sandboxes/{id}/contexts"));
    assert_eq!(st, 200);
    assert!(l["contexts"].as_array().map(|c| c.len() >= 2).unwrap_or(false), "{l}");

    let (st, _) = d.post(&format!("/v1/sandboxes/{id}/contexts/{a}/restart"), &json!({}));
    assert_eq!(st, 200);
    let ex = code(&d, &id, json!({ "code": "v", "context_id": a }));
    assert_eq!(ex["error"]["name"], "NameError", "restart clears state: {ex}");

    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}/contexts/{b}"));
    assert_eq!(st, 204);
    let (st, e) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": "1", "context_id": b }));
    assert_eq!((st, e["error"]["code"].as_str()), (404, Some("context_not_found")), "{e}");
    d.shutdown_and_check_leaks();
}

#[test]
fn javascript_and_bash_contexts() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let ex = code(&d, &id, json!({ "code": "[1,2,3].map(x => x*2)", "language": "javascript" }));
    assert_eq!(main_text(&ex).as_deref(), Some("[ 2, 4, 6 ]"), "{ex}");
    code(&d, &id, json!({ "code": "let a = 5", "language": "javascript" }));
    let ex = code(&d, &id, json!({ "code": "a * 2", "language": "javascript" }));
    assert_eq!(main_text(&ex).as_deref(), Some("10"), "{ex}");
    let ex = code(&d, &id, json!({ "code": "nope()", "language": "javascript" }));
    assert_eq!(ex["error"]["name"], "ReferenceError", "{ex}");

    let ex = code(&d, &id, json!({ "code": "echo $((6*7))", "language": "bash" }));
    assert_eq!(stdout(&ex), "42\n", "{ex}");
    code(&d, &id, json!({ "code": "X=5; cd /tmp", "language": "bash" }));
    let ex = code(&d, &id, json!({ "code": "echo $X; pwd", "language": "bash" }));
    assert_eq!(stdout(&ex), "5\n/tmp\n", "bash state persists: {ex}");
    d.shutdown_and_check_leaks();
}

#[test]
fn streaming_delivers_events_as_they_happen() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let resp = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/code"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "code": "import time\nprint('first', flush=True)\ntime.sleep(0.5)\nprint('second')\n6*7" }))
        .send()
        .expect("stream");
    assert_eq!(resp.status().as_u16(), 200);
    let t = Instant::now();
    let mut seen: Vec<(Duration, Value)> = Vec::new();
    for line in BufReader::new(resp).lines() {
        let line = line.expect("line");
        seen.push((t.elapsed(), serde_json::from_str(&line).expect("json line")));
    }
    let types: Vec<&str> = seen.iter().filter_map(|(_, v)| v["type"].as_str()).collect();
    assert_eq!(types.last(), Some(&"end"), "{types:?}");
    let first = seen.iter().find(|(_, v)| v["type"] == "stdout").expect("stdout line");
    let end = seen.last().expect("end");
    assert!(first.1["text"].as_str().unwrap_or_default().contains("first"), "{seen:?}");
    assert!(end.0 - first.0 >= Duration::from_millis(300), "output streamed before the cell ended: {seen:?}");
    let result = seen.iter().find(|(_, v)| v["type"] == "result").expect("result line");
    assert_eq!(result.1["data"]["text/plain"], "42");
    d.shutdown_and_check_leaks();
}

const SEED: &str = r#"
import numpy as np
import matplotlib.pyplot as plt
data = np.random.default_rng(7).normal(size=100)
print(f"mean={data.mean():.3f} median={np.median(data):.3f} std={data.std():.3f}")
plt.hist(data, bins=10)
plt.title("histogram")
plt.savefig("/home/user/histogram.png")
plt.show()
"#;

#[test]
fn seed_example_plots_and_dataframes() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "template": "code-interpreter", "resources": { "memory_mb": 1024 } })));
    let ex = code(&d, &id, json!({ "code": SEED, "timeout_ms": 60000 }));
    assert!(ex["error"].is_null(), "{ex}");
    let out = stdout(&ex);
    assert!(out.contains("mean=") && out.contains("median=") && out.contains("std="), "{out}");
    let png = ex["results"]
        .as_array()
        .and_then(|r| r.iter().find_map(|r| r["data"]["image/png"].as_str()))
        .expect("a PNG result");
    let bytes = base64::engine::general_purpose::STANDARD.decode(png).expect("base64 PNG");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "PNG signature");
    assert!(bytes.len() > 1000, "a real image, {} bytes", bytes.len());
    // Width/height from the IHDR chunk.
    let w = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    let h = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    assert!(w >= 100 && h >= 100, "{w}x{h}");

    // The saved figure is a file the files API can download.
    let resp = d
        .req(Method::GET, &format!("/v1/sandboxes/{id}/files"))
        .query(&[("path", "/home/user/histogram.png")])
        .send()
        .expect("download");
    assert_eq!(resp.status().as_u16(), 200);
    let file = resp.bytes().expect("bytes");
    assert!(file.starts_with(b"\x89PNG"), "saved PNG");

    let ex = code(&d, &id, json!({ "code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})" }));
    let main = ex["results"].as_array().and_then(|r| r.iter().find(|r| r["is_main_result"] == true)).expect("main");
    assert!(main["data"]["text/html"].as_str().unwrap_or_default().contains("<table"), "{main}");
    assert!(main["data"]["text/plain"].as_str().unwrap_or_default().contains('a'), "{main}");
    d.shutdown_and_check_leaks();
}

#[test]
fn warm_pool_hands_out_ready_kernels() {
    require_root!();
    skip_under_gvisor!("the warm pool's sandboxes are jailed ones", "What the tier does not do");
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start_with_pool(1);
    // Wait (bounded) until the pool has booted the code-interpreter sandbox and its kernel.
    let ready = common::poll(Duration::from_secs(60), Duration::from_millis(200), || {
        d.log().contains("warm sandbox ready: code-interpreter").then_some(())
    });
    assert!(ready.is_some(), "the pool never reported a warm code-interpreter sandbox:\n{}", d.log());
    let id = d.create(sandbox_body(json!({ "template": "code-interpreter" })));
    let t = Instant::now();
    let ex = code(&d, &id, json!({ "code": SEED }));
    let took = t.elapsed();
    assert!(ex["error"].is_null(), "{ex}");
    assert!(ex["results"].as_array().map(|r| !r.is_empty()).unwrap_or(false), "{ex}");
    // Not a timing test (those live in bench/): a cold kernel importing pandas and
    // matplotlib takes seconds here, a warm one far less.
    eprintln!("first plot from a warm sandbox took {took:?}");
    d.shutdown_and_check_leaks();
}
