//! Credential brokering end to end, against the test's own internet (see `inet`): the HTTPS
//! server there has a certificate from a test CA that only the daemon trusts (upstream
//! verification); code in the sandbox calls it without credentials and the server logs the
//! headers it received. The secret is then searched for everywhere the sandbox could see it:
//! its processes' environment and memory (read from the host through /proc), its filesystem,
//! every API response and the daemon log.

mod common;
mod inet;

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::process::Command;
use std::time::Duration;

use common::{processes_of, rand_token, run_bounded, sandbox_body, Daemon};
use inet::{Internet, NET};
use serde_json::{json, Value};

/// Every occurrence-free check needs the whole text of what was seen: responses go here.
struct Seen(String);

impl Seen {
    fn add(&mut self, v: &Value) -> Value {
        self.0.push_str(&v.to_string());
        v.clone()
    }
}

fn put(d: &Daemon, path: &str, body: &Value) -> (u16, Value) {
    d.send(d.req(reqwest::Method::PUT, path).json(body))
}

/// Whether `needle` occurs in the readable memory of process `pid`.
fn in_memory(pid: u32, needle: &[u8]) -> bool {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else { return false };
    let Ok(mut mem) = fs::File::open(format!("/proc/{pid}/mem")) else { return false };
    for l in maps.lines() {
        let mut it = l.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else { continue };
        if !perms.starts_with('r') || l.ends_with("[vvar]") || l.ends_with("[vsyscall]") || l.ends_with("[vvar_vclock]")
        {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else { continue };
        let (a, b) = (u64::from_str_radix(a, 16).unwrap_or(0), u64::from_str_radix(b, 16).unwrap_or(0));
        if b <= a || b - a > 512 << 20 {
            continue;
        }
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(SeekFrom::Start(a)).is_err() {
            continue;
        }
        let mut got = 0;
        while got < buf.len() {
            match mem.read(&mut buf[got..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        if buf[..got].windows(needle.len()).any(|w| w == needle) {
            return true;
        }
    }
    false
}

/// Files under the sandbox's root (seen from the host through its PID 1's /proc root) that
/// contain `needle`: everything the sandbox can write (/usr is the host's, read-only).
fn files_containing(agent_pid: u32, needle: &str) -> String {
    let root = format!("/proc/{agent_pid}/root");
    let dirs: Vec<String> = ["etc", "tmp", "home", "root", "var", "run", "opt", "srv", "mnt", "dev/shm"]
        .iter()
        .map(|d| format!("{root}/{d}"))
        .filter(|d| std::path::Path::new(d).exists())
        .collect();
    let mut cmd = Command::new("grep");
    cmd.args(["-r", "-l", "-F", "-s", "--", needle]).args(&dirs);
    run_bounded(&mut cmd, None, Duration::from_secs(60)).stdout_str()
}

fn fingerprint_of_pem(path: &std::path::Path) -> String {
    let o = run_bounded(
        Command::new("openssl").args(["x509", "-noout", "-fingerprint", "-sha256", "-in"]).arg(path),
        None,
        Duration::from_secs(10),
    );
    o.stdout_str().trim().rsplit('=').next().unwrap_or_default().replace(':', "").to_ascii_lowercase()
}

/// Prints `sha256-of-peer-cert issuer-CN` (or `verify-failed …` when `verify`).
const PEER: &str = r#"
import hashlib, socket, ssl, sys
host, verify = sys.argv[1], sys.argv[2] == "1"
ctx = ssl.create_default_context() if verify else ssl._create_unverified_context()
try:
    s = socket.create_connection((host, 8443), timeout=5)
    t = ctx.wrap_socket(s, server_hostname=host)
    der = t.getpeercert(binary_form=True)
    print(hashlib.sha256(der).hexdigest(), "verified" if verify else "unverified")
except ssl.SSLCertVerificationError as e:
    print("verify-failed", e.verify_message)
except Exception as e:
    print("blocked", type(e).__name__, e)
"#;

/// Three requests on one keep-alive connection, then it sleeps holding its memory.
const KEEPALIVE: &str = r#"
import http.client, ssl, sys, time
c = http.client.HTTPSConnection("api.good.test", 8443, context=ssl.create_default_context(), timeout=5)
for i in range(3):
    c.request("GET", "/keepalive/%d" % i, headers={"Authorization": "Bearer made-up-in-the-sandbox"})
    r = c.getresponse()
    print(r.status, r.read().decode(), flush=True)
print("done", sys.argv[1], flush=True)
time.sleep(60)
"#;

#[test]
fn brokered_credentials_never_enter_the_sandbox() {
    require_root!();
    let inet = Internet::start();
    std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
    std::env::set_var("GLOVEBOX_UPSTREAM_CA", &inet.ca);
    let d = Daemon::start();
    let mut seen = Seen(String::new());
    let secret = format!("sk-test-{}", rand_token(24));
    let literal = format!("lit-{}", rand_token(16));

    // --- The secrets API: write-only values, clear errors.
    let (st, v) = put(&d, "/v1/secrets/api_token", &json!({ "value": "first-value-replaced-below" }));
    assert_eq!(st, 201, "{v}");
    let (st, v) = put(&d, "/v1/secrets/api_token", &json!({ "value": secret }));
    assert_eq!(st, 200, "replacing is a 200: {v}");
    assert_eq!(seen.add(&v)["name"], "api_token");
    let (st, v) = d.post("/v1/secrets", &json!({ "name": "other.key-2", "value": "v" }));
    assert_eq!(st, 201, "{v}");
    let (st, v) = d.get("/v1/secrets");
    assert_eq!(st, 200);
    let names: Vec<&str> = v["secrets"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["api_token", "other.key-2"], "{v}");
    seen.add(&v);
    let (st, v) = d.get("/v1/secrets/api_token");
    assert_eq!(st, 200);
    assert!(v.get("value").is_none() && v["updated_at"].is_string(), "{v}");
    seen.add(&v);
    for (path, body, want, code) in [
        ("/v1/secrets/nope", None, 404, "secret_not_found"),
        ("/v1/secrets/bad%20name", Some(json!({ "value": "x" })), 400, "invalid_request"),
        ("/v1/secrets/9starts-with-digit", Some(json!({ "value": "x" })), 400, "invalid_request"),
        ("/v1/secrets/okname", Some(json!({ "value": "a\r\nInjected: yes" })), 400, "invalid_request"),
        ("/v1/secrets/okname", Some(json!({ "value": "" })), 400, "invalid_request"),
        ("/v1/secrets/okname", Some(json!({ "name": "different", "value": "x" })), 400, "invalid_request"),
    ] {
        let (st, v) = match body {
            Some(b) => put(&d, path, &b),
            None => d.get(path),
        };
        assert_eq!((st, v["error"]["code"].as_str().unwrap_or_default()), (want, code), "{path}: {v}");
    }
    let (st, v) = d.post("/v1/secrets", &json!({ "value": "no name" }));
    assert_eq!(st, 400, "{v}");
    let (st, _) = d.delete("/v1/secrets/other.key-2");
    assert_eq!(st, 204);
    let (st, v) = d.delete("/v1/secrets/other.key-2");
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("secret_not_found")));
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(d.data_dir.join("secrets.json")).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode, 0o600, "the store file is private");

    // --- Bad brokering policies are 400s that say why.
    let broker = |domain: &str, headers: Value| json!({ "mode": "allow-list", "allow": [{ "domain": domain, "inject_headers": headers }, "pypi.good.test:8443"] });
    for (bad, why) in [
        (broker("api.good.test:8443", json!({ "Authorization": "Bearer ${secret:missing}" })), "does not exist"),
        (broker("*.good.test:8443", json!({ "Authorization": "x" })), "exact domain"),
        (broker("api.good.test:8443", json!({ "Bad Header": "x" })), "not a valid header name"),
        (broker("api.good.test:8443", json!({ "X-A": "a\r\nX-B: b" })), "control characters"),
        (broker("api.good.test:8443", json!({ "Host": "evil.test" })), "cannot be injected"),
        (broker("pypi.good.test:8443", json!({ "X-A": "a" })), "more than one rule"),
    ] {
        let (st, e) = d.post("/v1/sandboxes", &sandbox_body(json!({ "network": bad })));
        let msg = e["error"]["message"].as_str().unwrap_or_default();
        assert!(st == 400 && msg.contains(why), "{bad} -> {st} {e}");
    }

    // --- A sandbox whose policy brokers api.good.test and passes pypi.good.test through.
    let policy = broker(
        "api.good.test:8443",
        json!({ "Authorization": "Bearer ${secret:api_token}", "X-Glovebox-Test": literal }),
    );
    let (st, v) = d.post("/v1/sandboxes", &sandbox_body(json!({ "network": policy })));
    assert_eq!(st, 201, "{v}");
    seen.add(&v);
    let id = v["id"].as_str().unwrap().to_string();
    d.register(&id);
    assert_eq!(
        v["network"]["allow"][0]["inject_headers"]["X-Glovebox-Test"], "<redacted>",
        "literal header values are not shown: {v}"
    );

    // curl and Python, no credentials of their own (or a made-up one that gets replaced).
    let out = d.sh_ok(
        &id,
        "curl -sS --max-time 10 https://api.good.test:8443/curl; echo; \
         curl -sS --max-time 10 -H 'Authorization: Bearer made-up' https://api.good.test:8443/curl-override",
    );
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["ok", "ok"], "{out}");
    let r = d.exec(
        &id,
        json!({ "cmd": ["python3", "-c", "import urllib.request; print(urllib.request.urlopen('https://api.good.test:8443/python', timeout=10).read().decode())"], "timeout_ms": 20000 }),
    );
    assert_eq!(seen.add(&r)["stdout"].as_str().unwrap_or_default().trim(), "ok", "{r}");
    let node = d.exec(
        &id,
        json!({ "cmd": ["node", "-e", "require('https').get('https://api.good.test:8443/node', r => { let b = ''; r.on('data', d => b += d); r.on('end', () => console.log(r.statusCode, b)); }).on('error', e => console.log('error', e.message))"], "timeout_ms": 30000 }),
    );
    assert_eq!(seen.add(&node)["stdout"].as_str().unwrap_or_default().trim(), "200 ok", "Node trusts the CA: {node}");

    // A keep-alive connection: every request on it gets the headers.
    let marker = format!("memory-marker-{}", rand_token(12));
    let (st, bg) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["python3", "-c", KEEPALIVE, marker], "background": true }),
    );
    assert_eq!(st, 202, "{bg}");
    let https = || -> Vec<Value> { inet.events().into_iter().filter(|e| e["kind"] == "https").collect() };
    let got = common::poll(Duration::from_secs(20), Duration::from_millis(100), || {
        let ev = https();
        (ev.iter().filter(|e| e["path"].as_str().unwrap_or_default().starts_with("/keepalive/")).count() == 3)
            .then_some(ev)
    });
    let ev = got.unwrap_or_else(|| panic!("the keep-alive requests did not arrive: {:?}", https()));
    let want = format!("Bearer {secret}");
    for p in ["/curl", "/curl-override", "/python", "/node", "/keepalive/0", "/keepalive/1", "/keepalive/2"] {
        let e = ev.iter().find(|e| e["path"] == p).unwrap_or_else(|| panic!("no request {p}: {ev:?}"));
        assert_eq!(e["authorization"], want.as_str(), "{p}: the server got {e}");
        assert_eq!(e["extra"], literal.as_str(), "{p}: {e}");
        assert_eq!(e["host"], "api.good.test:8443", "{p}: {e}");
    }
    let conns: std::collections::BTreeSet<String> = ev
        .iter()
        .filter(|e| e["path"].as_str().unwrap_or_default().starts_with("/keepalive/"))
        .map(|e| e["conn"].to_string())
        .collect();
    assert_eq!(conns.len(), 1, "the three requests shared one upstream connection: {ev:?}");

    // The secret is nowhere in the sandbox: environment and memory of every process (the
    // sleeping Python that made the requests among them), and its files.
    let range = d.uid_range(&id).expect("uid range of the sandbox");
    let procs: Vec<_> =
        processes_of(&id).into_iter().filter(|p| p.uid >= range.0 && p.uid < range.0 + range.1).collect();
    assert!(
        procs.len() >= 2,
        "the agent and the background python: {:?}",
        procs.iter().map(|p| &p.comm).collect::<Vec<_>>()
    );
    let holder = procs
        .iter()
        .find(|p| {
            fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|c| c.windows(marker.len()).any(|w| w == marker.as_bytes()))
        })
        .expect("the background python is a sandbox process");
    assert!(in_memory(holder.pid, marker.as_bytes()), "control: the memory scan finds what a process holds");
    for p in &procs {
        let env = fs::read(format!("/proc/{}/environ", p.pid)).unwrap_or_default();
        assert!(!env.windows(secret.len()).any(|w| w == secret.as_bytes()), "secret in the environment of {p:?}");
        assert!(!in_memory(p.pid, secret.as_bytes()), "secret in the memory of {p:?}");
        assert!(!in_memory(p.pid, literal.as_bytes()), "literal header value in the memory of {p:?}");
    }
    let agent = procs.iter().map(|p| p.pid).min().unwrap();
    d.sh_ok(&id, &format!("echo {marker} > /tmp/fs-control"));
    assert!(files_containing(agent, &marker).contains("fs-control"), "control: the file search finds a written file");
    let hits = files_containing(agent, &secret);
    assert!(hits.trim().is_empty(), "the secret is in the sandbox's files: {hits}");
    assert!(files_containing(agent, &literal).trim().is_empty(), "the literal value is in the sandbox's files");

    let cid = bg["id"].as_u64().expect("command id");
    let (st, _) = d.post(&format!("/v1/sandboxes/{id}/commands/{cid}/kill"), &json!({}));
    assert!(st == 200 || st == 204, "kill the background python: {st}");

    // The sandbox trusts its own CA and nothing else new: its bundle is the host's plus one
    // certificate, the sandbox CA (named after it); the test CA is not among them.
    let host_bundle = fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    let bundle = d.sh_ok(&id, "cat /etc/ssl/certs/ca-certificates.crt");
    let ca = d.sh_ok(&id, "cat /etc/glovebox/sandbox-ca.pem");
    assert!(bundle.starts_with(host_bundle.trim_end()), "the sandbox bundle starts with the host's");
    assert_eq!(bundle[host_bundle.trim_end().len()..].trim(), ca.trim(), "one certificate added");
    assert_eq!(ca.matches("BEGIN CERTIFICATE").count(), 1);
    let test_ca = fs::read_to_string(&inet.ca).unwrap();
    assert!(!bundle.contains(test_ca.trim()), "the upstream test CA is not trusted in the sandbox");
    let subject = run_bounded(
        Command::new("openssl").args(["x509", "-noout", "-subject", "-ext", "basicConstraints"]),
        Some(ca.as_bytes()),
        Duration::from_secs(10),
    )
    .stdout_str();
    assert!(subject.contains(&format!("Glovebox sandbox CA {id}")) && subject.contains("CA:TRUE"), "{subject}");
    assert!(!ca.contains("PRIVATE KEY") && !bundle.contains("PRIVATE KEY"), "no key in the sandbox");
    let env = d.sh_ok(&id, "env | sort");
    for k in [
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        "REQUESTS_CA_BUNDLE=",
        "CURL_CA_BUNDLE=",
        "NODE_EXTRA_CA_CERTS=/etc/glovebox/sandbox-ca.pem",
    ] {
        assert!(env.contains(k), "{k} missing from: {env}");
    }

    // Brokered: the sandbox sees a leaf of its own CA. Passed through: the real server's
    // certificate, which the sandbox cannot verify (it does not trust the test CA).
    let real = fingerprint_of_pem(&inet.cert);
    assert_eq!(real.len(), 64, "fingerprint of the server certificate");
    let mut peer = |host: &str, verify: bool| {
        let r = d.exec(
            &id,
            json!({ "cmd": ["python3", "-c", PEER, host, if verify { "1" } else { "0" }], "timeout_ms": 20000 }),
        );
        seen.0.push_str(&r.to_string());
        r["stdout"].as_str().unwrap_or_default().trim().to_string()
    };
    assert_eq!(peer("pypi.good.test", false), format!("{real} unverified"), "pass-through shows the real certificate");
    assert!(peer("pypi.good.test", true).starts_with("verify-failed"), "and the sandbox does not trust it");
    let brokered = peer("api.good.test", true);
    assert!(
        brokered.ends_with("verified") && !brokered.starts_with(&real),
        "brokered: a leaf of the sandbox CA: {brokered}"
    );

    // Credentials go only to the rule's name and only over TLS.
    let mis = d.sh_ok(
        &id,
        "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' -H 'Host: pypi.good.test:8443' https://api.good.test:8443/misdirected",
    );
    assert_eq!(mis, "421", "another Host on a brokered connection");
    let plain = d.sh(&id, "curl -sS --max-time 10 http://api.good.test:8443/plain");
    assert_ne!(plain["exit_code"], 0, "plain HTTP to a brokered name is refused: {plain}");
    assert!(!https().iter().any(|e| e["path"] == "/misdirected" || e["path"] == "/plain"));

    // A rotated secret applies to new connections.
    let rotated = format!("sk-rotated-{}", rand_token(20));
    assert_eq!(put(&d, "/v1/secrets/api_token", &json!({ "value": rotated })).0, 200);
    assert_eq!(d.sh_ok(&id, "curl -sS --max-time 10 https://api.good.test:8443/rotated"), "ok");
    let e = https().into_iter().find(|e| e["path"] == "/rotated").expect("rotated request");
    assert_eq!(e["authorization"], format!("Bearer {rotated}").as_str());

    // The audit names the brokered connections (header names, not values) and the refusals.
    let log = common::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let (_, log) = d.get(&format!("/v1/sandboxes/{id}/egress"));
        log.to_string().contains("3 request(s)").then_some(log)
    })
    .expect("the keep-alive connection's entry (recorded when it closes)");
    seen.add(&log);
    let entries = log["entries"].as_array().cloned().unwrap_or_default();
    let b = entries
        .iter()
        .find(|e| e["name"] == "api.good.test" && e["allowed"] == true && e["injected_headers"].is_array())
        .unwrap_or_else(|| panic!("no brokered entry: {log}"));
    assert_eq!(b["injected_headers"], json!(["authorization", "x-glovebox-test"]), "{b}");
    assert!(b["reason"].as_str().unwrap().contains("brokered by rule api.good.test"), "{b}");
    assert!(
        entries
            .iter()
            .any(|e| e["name"] == "api.good.test" && e["reason"].as_str().unwrap_or_default().contains("3 request(s)")),
        "keep-alive counted: {log}"
    );
    assert!(
        entries
            .iter()
            .any(|e| e["allowed"] == false && e["reason"].as_str().unwrap_or_default().contains("plain HTTP refused")),
        "{log}"
    );
    assert!(entries.iter().any(|e| e["name"] == "pypi.good.test" && e["reason"] == "allowed by name"), "{log}");
    assert!(
        entries.iter().any(|e| e["reason"].as_str().unwrap_or_default().contains("1 refused")),
        "421 counted: {log}"
    );

    // Live update: a pass-through sandbox gets brokering (and its CA) without a restart.
    let (st, v) = d.post(
        "/v1/sandboxes",
        &sandbox_body(json!({ "network": { "mode": "allow-list", "allow": ["api.good.test:8443"] } })),
    );
    assert_eq!(st, 201, "{v}");
    let live = v["id"].as_str().unwrap().to_string();
    d.register(&live);
    let before = d.sh(&live, "curl -sS --max-time 10 https://api.good.test:8443/before");
    assert_ne!(before["exit_code"], 0, "pass-through: the test CA is not trusted in the sandbox: {before}");
    let (st, v) = put(&d, &format!("/v1/sandboxes/{live}/network"), &policy);
    assert_eq!(st, 200, "{v}");
    seen.add(&v);
    assert_eq!(d.sh_ok(&live, "curl -sS --max-time 10 https://api.good.test:8443/after-update"), "ok");
    let e = https().into_iter().find(|e| e["path"] == "/after-update").expect("request after the update");
    assert_eq!(e["authorization"], format!("Bearer {rotated}").as_str());

    // A brokered connection does not outlive its rule: dropping inject_headers closes it.
    let hold = r#"
import http.client, ssl, time
c = http.client.HTTPSConnection("api.good.test", 8443, context=ssl.create_default_context(), timeout=5)
c.request("GET", "/before-rule-change"); r = c.getresponse(); print(r.status, r.read().decode(), flush=True)
time.sleep(3)
try:
    c.request("GET", "/after-rule-change"); r = c.getresponse(); print("after:", r.status, r.read().decode())
except Exception as e:
    print("after:", type(e).__name__)
"#;
    let (st, bg) =
        d.post(&format!("/v1/sandboxes/{live}/exec"), &json!({ "cmd": ["python3", "-c", hold], "background": true }));
    assert_eq!(st, 202, "{bg}");
    let first = common::poll(Duration::from_secs(15), Duration::from_millis(50), || {
        https().iter().any(|e| e["path"] == "/before-rule-change").then_some(())
    });
    assert!(first.is_some(), "the held brokered connection made its first request");
    let plain_policy = json!({ "mode": "allow-list", "allow": ["api.good.test:8443"] });
    assert_eq!(put(&d, &format!("/v1/sandboxes/{live}/network"), &plain_policy).0, 200);
    let cid = bg["id"].as_u64().unwrap();
    let (_, res) = d.get(&format!("/v1/sandboxes/{live}/commands/{cid}?wait=true"));
    let out = res["stdout"].as_str().unwrap_or_default();
    assert!(out.starts_with("200 ok") && !out.contains("after: 200"), "the connection outlived its rule: {res}");
    assert!(!https().iter().any(|e| e["path"] == "/after-rule-change"), "a request went out after the rule change");

    // Nothing the API said and nothing the daemon logged holds a value.
    for (what, v) in [("secret", &secret), ("rotated secret", &rotated), ("literal header value", &literal)] {
        assert!(!seen.0.contains(v.as_str()), "the {what} appeared in an API response");
        assert!(!d.log().contains(v.as_str()), "the {what} appeared in the daemon log");
    }

    let pid = d.pid();
    assert!(!inet::links_of(pid).is_empty(), "control: the live sandboxes' links are found by their alias");
    d.shutdown_and_check_leaks();
    inet::assert_no_net_state(pid);
    drop(inet);
}
