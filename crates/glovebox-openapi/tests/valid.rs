//! The committed document is a well-formed OpenAPI 3.0 description of the daemon as it is:
//! it parses, every `$ref` resolves, every route and method of the daemon's router
//! (`.route("…", …)` in crates/glovebox-daemon/src/http/mod.rs, read at test time) is in `paths`
//! and nothing else is, path parameters are declared, and errors use `ErrorBody`. Then the
//! `openapi-spec-validator` Python package checks it against the OpenAPI meta-schema.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options", "trace"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn spec() -> Value {
    let path = repo().join("docs/api/openapi.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()))
}

fn walk<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    out.push((at.clone(), x.as_str().unwrap_or_else(|| panic!("non-string $ref at {at}"))));
                } else {
                    walk(x, format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn parses_as_openapi_3_0() {
    let s = spec();
    assert!(s["openapi"].as_str().is_some_and(|v| v.starts_with("3.0.")), "openapi: {}", s["openapi"]);
    assert!(s["info"]["title"].is_string() && s["info"]["version"].is_string());
    assert!(s["paths"].as_object().is_some_and(|p| !p.is_empty()));
}

#[test]
fn every_ref_resolves() {
    let s = spec();
    let mut refs = Vec::new();
    walk(&s, String::new(), &mut refs);
    assert!(refs.len() > 100, "suspiciously few $refs: {}", refs.len());
    for (at, r) in refs {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{at}: external $ref {r}"));
        assert!(s.pointer(pointer).is_some(), "{at}: $ref {r} does not resolve");
    }
}

#[test]
fn the_api_types_are_components() {
    let s = spec();
    let schemas = s["components"]["schemas"].as_object().expect("components/schemas");
    for name in [
        "CreateSandbox",
        "Sandbox",
        "SandboxList",
        "SetTimeout",
        "Resources",
        "Limits",
        "NetworkPolicy",
        "ExecRequest",
        "ExecResult",
        "ExecStreamLine",
        "Started",
        "CommandList",
        "SignalRequest",
        "MakeDir",
        "Rename",
        "Entries",
        "FileInfo",
        "ErrorBody",
        "RunCode",
        "Execution",
        "CodeStreamLine",
        "CreateContext",
        "Context",
        "ContextList",
        "SandboxMetrics",
        "EgressLog",
        "Command",
    ] {
        assert!(schemas.contains_key(name), "components/schemas/{name} is missing");
    }
    // Spot checks that the schemas are the Rust types, not stubs.
    let exec = &schemas["ExecRequest"];
    assert_eq!(exec["additionalProperties"], false, "requests reject unknown fields");
    assert_eq!(exec["required"], serde_json::json!(["cmd"]));
    assert_eq!(exec["properties"]["cmd"]["allOf"][0]["$ref"], "#/components/schemas/Command");
    let result_fields: BTreeSet<&str> = schemas["ExecResult"]["properties"]
        .as_object()
        .expect("ExecResult properties")
        .keys()
        .map(|k| k.as_str())
        .collect();
    for f in ["exit_code", "stdout", "stderr", "timed_out", "stdout_truncated", "duration_ms"] {
        assert!(result_fields.contains(f), "ExecResult.{f}");
    }
}

/// (method, full path) of every route in the daemon's router, read from its source.
fn router_routes() -> BTreeSet<(String, String)> {
    let path = repo().join("crates/glovebox-daemon/src/http/mod.rs");
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let start = src.find("pub fn router(").expect("`pub fn router(` in the daemon's http/mod.rs");
    let body = &src[start..];
    let body = &body[..body.find("\n}\n").expect("end of fn router")];
    // Routes in the `let v1 = …;` statement are nested under `/v1`; the rest are at the root.
    let v1_start = body.find("let v1 = ").expect("`let v1 = ` in fn router");
    let v1_end = v1_start + body[v1_start..].find(";\n").expect("end of the v1 statement");
    let mut routes = BTreeSet::new();
    for (at, _) in body.match_indices(".route(") {
        // rustfmt may break a long call after `.route(`.
        let Some(rest) = body[at + 7..].trim_start().strip_prefix('"') else { continue };
        let route = &rest[..rest.find('"').expect("closing quote")];
        // The handler expression: up to the `)` that closes `.route(`.
        let (mut depth, mut end) = (1, 0);
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = i;
                break;
            }
        }
        let handlers = &rest[route.len() + 1..end];
        let prefix = if (v1_start..v1_end).contains(&at) { "/v1" } else { "" };
        let mut found = false;
        for m in METHODS {
            for (i, _) in handlers.match_indices(&format!("{m}(")) {
                let before = handlers[..i].chars().last();
                if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
                    routes.insert((m.to_string(), format!("{prefix}{route}")));
                    found = true;
                }
            }
        }
        assert!(found, "no method found for route {route:?} in {handlers:?}");
    }
    assert!(routes.len() >= 20, "parsed only {} routes from the router: {routes:?}", routes.len());
    routes
}

fn spec_operations(s: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in s["paths"].as_object().expect("paths") {
        for (m, _) in item.as_object().expect("path item") {
            if METHODS.contains(&m.as_str()) {
                ops.insert((m.clone(), path.clone()));
            }
        }
    }
    ops
}

#[test]
fn paths_match_the_daemon_router() {
    let routes = router_routes();
    let ops = spec_operations(&spec());
    let missing: Vec<_> = routes.difference(&ops).collect();
    assert!(missing.is_empty(), "routes of the daemon missing from docs/api/openapi.yaml (add them to crates/glovebox-openapi/src/paths.rs): {missing:?}");
    let extra: Vec<_> = ops.difference(&routes).collect();
    assert!(extra.is_empty(), "operations in docs/api/openapi.yaml the daemon does not serve: {extra:?}");
}

#[test]
fn operations_are_complete() {
    let s = spec();
    for (method, path) in spec_operations(&s) {
        let op = &s["paths"][&path][&method];
        let what = format!("{} {path}", method.to_uppercase());
        assert!(op["operationId"].is_string(), "{what}: operationId");
        // Every `{param}` of the template is declared as a required path parameter.
        let declared: BTreeSet<&str> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "path" && p["required"] == true)
            .filter_map(|p| p["name"].as_str())
            .collect();
        let template: BTreeSet<&str> =
            path.split('/').filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}')).collect();
        assert_eq!(declared, template, "{what}: path parameters");
        let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{what}: responses"));
        // A WebSocket route succeeds with 101 Switching Protocols.
        assert!(responses.keys().any(|k| k.starts_with('2') || k == "101"), "{what}: no success response");
        let public = op["security"].as_array().is_some_and(|a| a.is_empty());
        if !public {
            assert!(responses.contains_key("401"), "{what}: needs the key, so documents 401");
        }
        for (status, r) in responses {
            if status.starts_with('4') || status.starts_with('5') {
                let name = r["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/responses/"));
                let name = name.unwrap_or_else(|| panic!("{what} {status}: not a shared error response"));
                assert_eq!(
                    s["components"]["responses"][name]["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{what} {status}"
                );
            }
        }
    }
    assert_eq!(s["components"]["securitySchemes"]["bearerAuth"]["scheme"], "bearer");
    // The streaming and raw variants.
    let content = |m: &str, p: &str, st: &str| s["paths"][p][m]["responses"][st]["content"].clone();
    for p in ["/v1/sandboxes/{id}/exec", "/v1/sandboxes/{id}/code"] {
        assert!(content("post", p, "200")["application/x-ndjson"]["schema"]["$ref"].is_string(), "{p}: ndjson");
    }
    assert_eq!(
        content("get", "/v1/sandboxes/{id}/files", "200")["application/octet-stream"]["schema"]["format"],
        "binary"
    );
    assert!(
        s["paths"]["/v1/sandboxes/{id}/files"]["put"]["requestBody"]["content"]["application/octet-stream"].is_object()
    );
}

// ---------------------------------------------------------------------------------------
// The reference validator
// ---------------------------------------------------------------------------------------

fn run(cmd: &mut Command, timeout: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {timeout:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

const VALIDATE: &str = "import sys\n\
from openapi_spec_validator import validate\n\
from openapi_spec_validator.readers import read_from_filename\n\
spec, _ = read_from_filename(sys.argv[1])\n\
validate(spec)\n\
print('valid OpenAPI', spec['openapi'])\n";

/// `python3` able to import `openapi_spec_validator`: as installed, or with the package
/// installed once with `pip --target` into the target dir (Debian's Python refuses plain
/// installs).
fn python_with_validator() -> Command {
    let site = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("openapi-spec-validator");
    let python = |extra: Option<&Path>| {
        let mut c = Command::new("python3");
        if let Some(p) = extra {
            c.env("PYTHONPATH", p);
        }
        c
    };
    let can_import = |extra: Option<&Path>| {
        run(python(extra).args(["-c", "import openapi_spec_validator"]), Duration::from_secs(60)).status.success()
    };
    if can_import(None) {
        return python(None);
    }
    if !can_import(Some(&site)) {
        eprintln!("installing openapi-spec-validator with pip into {}", site.display());
        let o = run(
            Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
                .arg(&site)
                .arg("openapi-spec-validator>=0.7"),
            Duration::from_secs(600),
        );
        assert!(
            o.status.success() && can_import(Some(&site)),
            "this test needs the `openapi-spec-validator` Python package and `pip install --target` failed \
             (is python3-pip installed, is PyPI reachable?):\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    python(Some(&site))
}

#[test]
fn openapi_spec_validator_accepts_it() {
    let mut py = python_with_validator();
    let o = run(py.args(["-c", VALIDATE]).arg(repo().join("docs/api/openapi.yaml")), Duration::from_secs(120));
    assert!(
        o.status.success(),
        "openapi-spec-validator rejects docs/api/openapi.yaml:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("valid OpenAPI 3.0"));
}
