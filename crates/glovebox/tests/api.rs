//! End to end over HTTP: command timeouts, NDJSON streaming, background commands, and bad
//! input, against a real `glovebox serve`.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{sandbox_body, Daemon};
use reqwest::Method;
use serde_json::{json, Value};

fn no_sleep_left(d: &Daemon, id: &str) {
    let ps = d.sh_ok(id, "ps -eo pid,comm");
    assert!(!ps.contains("sleep"), "a sleep survived the timeout:\n{ps}");
    assert!(ps.contains("glovebox-agent"), "the sandbox still works:\n{ps}");
    // On the host: a jailed sandbox's processes run in its uid range; a gVisor sandbox's
    // run on the sentry (none of its host processes is a `sleep`, then or ever).
    let host: Vec<_> = match common::under_gvisor() {
        false => common::processes_in_range(d.uid_range(id).expect("uid range of a live sandbox")),
        true => common::processes_of(id),
    };
    let sleeps: Vec<_> = host.into_iter().filter(|p| p.comm == "sleep").collect();
    assert!(sleeps.is_empty(), "host still sees the sandbox's sleeps: {sleeps:?}");
}

#[test]
fn command_timeout_kills_the_whole_tree() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));

    // Children that ignore SIGTERM, in the command's process group.
    let t = Instant::now();
    let r = d.exec(
        &id,
        json!({
            "cmd": ["sh", "-c", "for i in 1 2 3; do (trap '' TERM; sleep 300) & done; sleep 300"],
            "timeout_ms": 1000
        }),
    );
    let took = t.elapsed();
    assert_eq!(r["timed_out"], true, "{r}");
    assert!(r["exit_code"] == 137 || r["signal"] == 9, "killed by SIGKILL: {r}");
    assert!(took >= Duration::from_millis(1000), "ended before its budget: {took:?}");
    assert!(took < Duration::from_secs(3), "took {took:?} for a 1 s budget");
    no_sleep_left(&d, &id);

    // A grandchild in its own session (out of the process group) goes too.
    let t = Instant::now();
    let r = d.exec(&id, json!({ "cmd": ["sh", "-c", "setsid sh -c 'sleep 300' & sleep 300"], "timeout_ms": 1000 }));
    assert_eq!(r["timed_out"], true, "{r}");
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    no_sleep_left(&d, &id);

    // A daemonised double fork that closes its output does not hold the result back either.
    let t = Instant::now();
    let r = d.exec(
        &id,
        json!({ "cmd": ["sh", "-c", "(setsid sleep 300 >/dev/null 2>&1 </dev/null &) ; echo done"], "timeout_ms": 5000 }),
    );
    assert_eq!((r["exit_code"].as_i64(), r["stdout"].as_str()), (Some(0), Some("done\n")), "{r}");
    assert!(t.elapsed() < Duration::from_secs(4), "took {:?}", t.elapsed());
    d.shutdown_and_check_leaks();
}

#[test]
fn ndjson_stream_is_ordered_and_incremental() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let t0 = Instant::now();
    let resp = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "cmd": ["sh", "-c", "echo a; sleep 0.3; echo b >&2; exit 5"], "timeout_ms": 10_000 }))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut lines: Vec<(Duration, Value)> = Vec::new();
    for l in BufReader::new(resp).lines() {
        let l = l.expect("stream line");
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad NDJSON line {l:?}: {e}"));
        lines.push((t0.elapsed(), v));
    }
    let types: Vec<&str> = lines.iter().map(|(_, v)| v["type"].as_str().unwrap_or("?")).collect();
    assert_eq!(types, ["started", "stdout", "stderr", "exited"], "{lines:?}");
    assert!(lines[0].1["pid"].as_i64().is_some_and(|p| p > 1), "{lines:?}");
    assert_eq!(lines[1].1["data"], "a\n");
    assert_eq!(lines[2].1["data"], "b\n");
    let exited = &lines[3].1;
    assert_eq!(exited["exit_code"], 5, "{exited}");
    assert_eq!(exited["timed_out"], false);
    assert_eq!((exited["stdout_bytes"].as_u64(), exited["stderr_bytes"].as_u64()), (Some(2), Some(2)));
    // Streamed as it happens: "a" arrives well before the command's end.
    let (ta, te) = (lines[1].0, lines[3].0);
    assert!(te >= ta + Duration::from_millis(200), "stdout was buffered: a at {ta:?}, exit at {te:?}");

    // An error before the start is a plain JSON error, not a stream.
    let (st, v) = d.send(
        d.req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .header("accept", "application/x-ndjson")
            .json(&json!({ "cmd": [] })),
    );
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");
    d.shutdown_and_check_leaks();
}

fn start_background(d: &Daemon, id: &str, body: Value) -> u64 {
    let (st, started) = d.post(&format!("/v1/sandboxes/{id}/exec"), &body);
    assert_eq!(st, 202, "{body}: {started}");
    assert!(started["pid"].as_i64().is_some_and(|p| p > 1), "{started}");
    started["id"].as_u64().expect("command id")
}

/// The brief's flow: a background command reading stdin, fed through the stdin endpoint.
#[test]
fn background_command_gets_stdin_from_the_endpoint() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let base = format!("/v1/sandboxes/{id}/commands");
    let cid = start_background(
        &d,
        &id,
        json!({ "cmd": ["sh", "-c", "read x; echo got:$x"], "background": true, "timeout_ms": 30_000 }),
    );
    let (st, list) = d.get(&base);
    assert_eq!(st, 200, "{list}");
    let me = list["commands"].as_array().unwrap().iter().find(|c| c["id"] == cid).cloned();
    assert_eq!(
        me.as_ref().map(|c| c["running"].clone()),
        Some(json!(true)),
        "a background command waiting for stdin is running: {list}"
    );

    // Not finished yet: asking without wait is a conflict, not a fake result.
    let (st, v) = d.get(&format!("{base}/{cid}"));
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("conflict")), "{v}");

    let (st, v) = d.send(d.req(Method::POST, &format!("{base}/{cid}/stdin?close=true")).body("hello\n"));
    assert_eq!(st, 204, "{v}");
    let (st, r) = d.get(&format!("{base}/{cid}?wait=true"));
    assert_eq!(st, 200, "{r}");
    assert_eq!((r["stdout"].as_str(), r["exit_code"].as_i64()), (Some("got:hello\n"), Some(0)), "{r}");
    let (st, r2) = d.get(&format!("{base}/{cid}"));
    assert_eq!((st, &r2["stdout"]), (200, &r["stdout"]), "a finished result can be fetched again: {r2}");
    d.shutdown_and_check_leaks();
}

/// `stdin` given with `background: true` reaches the command (documented: given, then closed).
#[test]
fn background_command_with_inline_stdin() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    for i in 0..5 {
        let (st, v) = d.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({ "cmd": ["sh", "-c", "read x; echo got:$x"], "background": true, "stdin": format!("v{i}\n"), "timeout_ms": 5000 }),
        );
        assert_eq!(st, 202, "try {i}: {v}");
        let cid = v["id"].as_u64().unwrap();
        let (st, r) = d.get(&format!("/v1/sandboxes/{id}/commands/{cid}?wait=true"));
        assert_eq!((st, r["stdout"].as_str()), (200, Some(format!("got:v{i}\n").as_str())), "{r}");
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn background_commands_list_and_kill() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let base = format!("/v1/sandboxes/{id}/commands");

    let done = start_background(&d, &id, json!({ "cmd": ["sh", "-c", "echo early; exit 7"], "background": true }));
    let (st, r) = d.get(&format!("{base}/{done}?wait=true"));
    assert_eq!((st, r["stdout"].as_str(), r["exit_code"].as_i64()), (200, Some("early\n"), Some(7)), "{r}");

    let sid = start_background(&d, &id, json!({ "cmd": ["sleep", "300"], "background": true, "timeout_ms": 0 }));
    let (_, list) = d.get(&base);
    let cmds = list["commands"].as_array().unwrap();
    let find = |cid: u64| cmds.iter().find(|c| c["id"] == cid).cloned().unwrap_or_else(|| panic!("{list}"));
    assert_eq!((find(sid)["running"].clone(), find(done)["running"].clone()), (json!(true), json!(false)), "{list}");
    assert_eq!(find(done)["exit_code"], 7, "{list}");
    assert!(d.sh_ok(&id, "ps -eo comm").contains("sleep"));

    let t = Instant::now();
    let (st, v) = d.post(&format!("{base}/{sid}/kill"), &json!({}));
    assert_eq!(st, 204, "{v}");
    let (st, r) = d.get(&format!("{base}/{sid}?wait=true"));
    assert_eq!(st, 200, "{r}");
    assert!(r["signal"] == 9 || r["exit_code"] == 137, "{r}");
    assert!(t.elapsed() < Duration::from_secs(3), "kill took {:?}", t.elapsed());
    let (_, list) = d.get(&base);
    let s = list["commands"].as_array().unwrap().iter().find(|c| c["id"] == sid).cloned().unwrap();
    assert_eq!(s["running"], false, "{list}");
    assert!(!d.sh_ok(&id, "ps -eo comm").contains("sleep"), "the killed command is gone");

    // SIGTERM by number, to a command that handles it.
    let tid = start_background(
        &d,
        &id,
        json!({ "cmd": ["sh", "-c", "trap 'echo term; exit 0' TERM; while :; do sleep 0.05; done"], "background": true }),
    );
    // Give the shell its trap before signalling: poll until it shows in ps.
    let ready = common::poll(Duration::from_secs(5), Duration::from_millis(50), || {
        d.sh_ok(&id, "ps -eo args").contains("trap").then_some(())
    });
    assert!(ready.is_some());
    let (st, v) = d.post(&format!("{base}/{tid}/kill"), &json!({ "signal": 15 }));
    assert_eq!(st, 204, "{v}");
    let (_, r) = d.get(&format!("{base}/{tid}?wait=true"));
    assert_eq!((r["stdout"].as_str(), r["exit_code"].as_i64()), (Some("term\n"), Some(0)), "{r}");

    // Unknown command ids and bad signals.
    let (st, v) = d.get(&format!("{base}/999999?wait=true"));
    assert_eq!(st, 404, "{v}");
    let (st, v) = d.get(&format!("{base}/999999"));
    assert_eq!(st, 404, "{v}");
    let (st, v) = d.post(&format!("{base}/999999/kill"), &json!({}));
    assert_eq!(st, 404, "{v}");
    let (st, v) = d.post(&format!("{base}/{done}/kill"), &json!({ "signal": 0 }));
    assert_eq!(st, 400, "{v}");
    let (st, v) = d.post(&format!("{base}/{done}/kill"), &json!({ "signal": 9, "bogus": 1 }));
    assert_eq!(st, 400, "{v}");
    d.shutdown_and_check_leaks();
}

/// Stdin for a command that does not exist is a 404, every time (the agent answers and
/// hangs up before the daemon has written the data: the reply must win over the EPIPE).
#[test]
fn stdin_to_an_unknown_command_is_404() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let (st, v) =
            d.send(d.req(Method::POST, &format!("/v1/sandboxes/{id}/commands/999999/stdin")).body(vec![b'x'; 1 << 20]));
        seen.entry(st).or_insert(v);
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [404], "{seen:?}");
    d.shutdown_and_check_leaks();
}

/// The code-interpreter template before it is built: a 404 whose hint sits outside the
/// quoted name.
#[test]
fn an_unbuilt_code_interpreter_says_how_to_build_it() {
    require_root!();
    let d = Daemon::start_without_templates();
    let (st, v) = d.send(
        d.req(Method::POST, "/v1/sandboxes")
            .header("content-type", "application/json")
            .body(r#"{"template":"code-interpreter"}"#),
    );
    assert_error("template not built", (st, v.clone()), 404, Some("template_not_found"));
    assert_eq!(
        v["error"]["message"],
        "template \"code-interpreter\" not found (build it with glovebox template build -f templates/code-interpreter/Dockerfile -t code-interpreter)",
        "the hint sits outside the quoted name"
    );
    d.shutdown_and_check_leaks();
}

fn assert_error(what: &str, (st, v): (u16, Value), status: u16, code: Option<&str>) {
    assert_eq!(st, status, "{what}: {v}");
    let e = &v["error"];
    assert!(e["code"].is_string() && e["message"].is_string(), "{what}: error body shape: {v}");
    assert!(!e["message"].as_str().unwrap().is_empty(), "{what}: empty message");
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{what}: {v}");
    }
}

#[test]
fn bad_input_is_a_clear_4xx() {
    require_root!();
    let d = Daemon::start();
    let create = |body: &str| {
        d.send(d.req(Method::POST, "/v1/sandboxes").header("content-type", "application/json").body(body.to_string()))
    };
    assert_error("malformed JSON", create("{\"timeout_s\": 5"), 400, Some("invalid_request"));
    assert_error("not JSON", create("hello"), 400, Some("invalid_request"));
    let (st, v) = create(r#"{"timeout_s":5,"bogus":1}"#);
    assert_error("unknown field", (st, v.clone()), 400, Some("invalid_request"));
    assert!(v["error"]["message"].as_str().unwrap().contains("bogus"), "names the field: {v}");
    assert_error("unknown nested field", create(r#"{"resources":{"memroy_mb":64}}"#), 400, Some("invalid_request"));
    for (what, body) in [
        ("memory_mb 0", r#"{"resources":{"memory_mb":0}}"#),
        ("memory_mb 10^12", r#"{"resources":{"memory_mb":1000000000000}}"#),
        ("memory_mb negative", r#"{"resources":{"memory_mb":-1}}"#),
        ("cpus -1", r#"{"resources":{"cpus":-1}}"#),
        ("cpus 0", r#"{"resources":{"cpus":0}}"#),
        ("cpus 1000", r#"{"resources":{"cpus":1000}}"#),
        ("pids 0", r#"{"resources":{"pids":0}}"#),
        ("disk_mb 0", r#"{"resources":{"disk_mb":0}}"#),
        ("disk_mb huge", r#"{"resources":{"disk_mb":18446744073709551615}}"#),
        ("timeout_s 0", r#"{"timeout_s":0}"#),
        ("timeout_s huge", r#"{"timeout_s":99999999999}"#),
        ("timeout_s negative", r#"{"timeout_s":-5}"#),
        ("timeout_s string", r#"{"timeout_s":"5"}"#),
        ("env with =", r#"{"env":{"A=B":"c"}}"#),
        ("network mode", r#"{"network":{"mode":"allow-everything"}}"#),
    ] {
        assert_error(what, create(body), 400, Some("invalid_request"));
    }
    for (what, body) in [("an array", "[]"), ("an array of a field", "[5]"), ("null", "null"), ("a number", "5")] {
        let (st, v) = create(body);
        assert_error(what, (st, v.clone()), 400, Some("invalid_request"));
        assert!(v["error"]["message"].as_str().unwrap().contains("a JSON object"), "{what}: says what it wants: {v}");
    }
    assert_error("unknown template", create(r#"{"template":"nope"}"#), 404, Some("template_not_found"));
    assert_error(
        "no content type",
        d.send(d.req(Method::POST, "/v1/sandboxes").body("{}")),
        415,
        Some("invalid_request"),
    );
    let (_, list) = d.get("/v1/sandboxes");
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0), "nothing was created: {list}");

    // Auth.
    assert_error("no key", d.send(d.req_noauth(Method::GET, "/v1/sandboxes")), 401, Some("unauthorized"));
    assert_error(
        "wrong key",
        d.send(d.req_noauth(Method::GET, "/v1/sandboxes").bearer_auth("not-the-key")),
        401,
        Some("unauthorized"),
    );
    assert_error(
        "key prefix",
        d.send(d.req_noauth(Method::GET, "/v1/sandboxes").bearer_auth(&d.key[..d.key.len() - 1])),
        401,
        Some("unauthorized"),
    );
    assert_error(
        "wrong key, create",
        d.send(d.req_noauth(Method::POST, "/v1/sandboxes").bearer_auth("x").json(&json!({}))),
        401,
        Some("unauthorized"),
    );
    let (st, _) = d.send(d.req_noauth(Method::GET, "/v1/sandboxes").header("x-api-key", &d.key));
    assert_eq!(st, 200, "x-api-key works too");

    // Routes and ids.
    assert_error("unknown route", d.get("/v1/nope"), 404, Some("not_found"));
    assert_error("unknown top route", d.get("/nope"), 404, Some("not_found"));
    assert_error("unknown sandbox", d.get("/v1/sandboxes/doesnotexist0000"), 404, Some("sandbox_not_found"));
    assert_error(
        "exec in unknown sandbox",
        d.post("/v1/sandboxes/doesnotexist0000/exec", &json!({ "cmd": ["true"] })),
        404,
        Some("sandbox_not_found"),
    );
    assert_error("delete unknown sandbox", d.delete("/v1/sandboxes/doesnotexist0000"), 404, Some("sandbox_not_found"));
    assert_error("traversal-looking id", d.get("/v1/sandboxes/..%2F..%2Fetc"), 404, Some("sandbox_not_found"));

    // Exec requests.
    let id = d.create(sandbox_body(json!({})));
    let exec = |body: Value| d.post(&format!("/v1/sandboxes/{id}/exec"), &body);
    assert_error("exec unknown field", exec(json!({ "cmd": ["true"], "bogus": 1 })), 400, Some("invalid_request"));
    assert_error("exec empty argv", exec(json!({ "cmd": [] })), 400, Some("invalid_request"));
    assert_error("exec empty shell", exec(json!({ "cmd": "   " })), 400, Some("invalid_request"));
    assert_error("exec no cmd", exec(json!({})), 400, Some("invalid_request"));
    assert_error(
        "exec both stdins",
        exec(json!({ "cmd": ["cat"], "stdin": "a", "stdin_base64": "YQ==" })),
        400,
        Some("invalid_request"),
    );
    assert_error(
        "exec bad base64",
        exec(json!({ "cmd": ["cat"], "stdin_base64": "!!!" })),
        400,
        Some("invalid_request"),
    );
    assert_error(
        "exec huge output cap",
        exec(json!({ "cmd": ["true"], "max_output_bytes": 1u64 << 40 })),
        400,
        Some("invalid_request"),
    );
    assert_error(
        "exec huge timeout",
        exec(json!({ "cmd": ["true"], "timeout_ms": u64::MAX })),
        400,
        Some("invalid_request"),
    );
    assert_error(
        "exec bad encoding",
        exec(json!({ "cmd": ["true"], "encoding": "rot13" })),
        400,
        Some("invalid_request"),
    );
    assert_error(
        "set_timeout 0",
        d.post(&format!("/v1/sandboxes/{id}/timeout"), &json!({ "timeout_s": 0 })),
        400,
        None,
    );
    assert_error(
        "set_timeout bogus",
        d.post(&format!("/v1/sandboxes/{id}/timeout"), &json!({ "timeout_s": 5, "x": 1 })),
        400,
        None,
    );
    assert_error("list bad metadata filter", d.get("/v1/sandboxes?metadata=nokey"), 400, Some("invalid_request"));

    // A shell string works and the sandbox is fine after all that.
    let r = d.exec(&id, json!({ "cmd": "echo $((6*7))" }));
    assert_eq!(r["stdout"], "42\n", "{r}");
    let (st, body) = d.send(d.req_noauth(Method::GET, "/healthz"));
    assert_eq!((st, body), (200, Value::String("ok\n".into())));
    d.shutdown_and_check_leaks();
}

/// Path and query extractors reject with the same JSON error shape as everything else.
#[test]
fn bad_path_and_query_params_use_the_error_shape() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    assert_error("command id not a number", d.get(&format!("/v1/sandboxes/{id}/commands/abc")), 400, None);
    assert_error("wait not a bool", d.get(&format!("/v1/sandboxes/{id}/commands/1?wait=maybe")), 400, None);
    assert_error("files without path", d.get(&format!("/v1/sandboxes/{id}/files/stat")), 400, None);
    d.shutdown_and_check_leaks();
}

/// A request line hyper cannot parse (a raw quote and spaces in the path) is answered with a
/// 400, not a dropped connection; so is one with a body behind it.
#[test]
fn unparsable_request_line_is_a_400() {
    use std::io::{Read, Write};
    require_root!();
    let d = Daemon::start();
    let addr = d.url.trim_start_matches("http://").to_string();
    let key = &d.key;
    for req in [
        "GET /v1/sandboxes/a b\"c HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        format!("GET /v1/sandboxes/a b\"c HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"),
        format!(
            "POST /v1/sandboxes/a \"b\" c/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 12\r\n\r\n{{\"cmd\":\"ls\"}}"
        ),
    ] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let _ = s.take(4096).read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with("HTTP/1.1 400 "), "{req:?} got {text:?}");
    }
    let (st, _) = d.get("/v1/sandboxes");
    assert_eq!(st, 200, "the daemon still answers");
    d.shutdown_and_check_leaks();
}
