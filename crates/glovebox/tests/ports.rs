//! Exposed ports on the real jail: a deny-all sandbox runs a small Python web server on
//! port 8000 (a directory listing, a response that streams in two parts, a hand-written
//! WebSocket handshake that then echoes bytes); the host reaches it by path and by preview
//! host, private until made public, chunk by chunk and through an upgrade; nothing
//! listening answers 502; another tenant sees 404; the daemon opens no listening socket for
//! it; the sandbox itself still reaches nothing outside. Under gVisor (the contract run of
//! scripts/test) the agent relays the port, the rest holds the same.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{poll, sandbox_body, Daemon};
use reqwest::Method;
use serde_json::{json, Value};

const SERVER: &str = r#"
import base64, functools, hashlib, http.server, os, time
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"first-part\n")
            self.wfile.flush()
            for _ in range(600):
                if os.path.exists("/tmp/go"):
                    break
                time.sleep(0.05)
            self.wfile.write(b"second-part\n")
            return
        if self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"].encode()
            accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            self.wfile.flush()
            while True:
                b = self.connection.recv(4096)
                if not b:
                    break
                self.connection.sendall(b)
            self.close_connection = True
            return
        return super().do_GET()
os.makedirs("/tmp/www", exist_ok=True)
open("/tmp/www/hello-from-inside.txt", "w").write("hi\n")
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), functools.partial(H, directory="/tmp/www")).serve_forever()
"#;

/// Listening TCP sockets held by process `pid` (its fds matched against /proc/net/tcp{,6}).
fn listening_sockets_of(pid: u32) -> usize {
    let mut inodes = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("daemon fds").flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            if let Some(n) = t.to_string_lossy().strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                inodes.insert(n.to_string());
            }
        }
    }
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                n += 1;
            }
        }
    }
    n
}

/// Sends `head` on a raw connection to the daemon and reads until `until` is in what came
/// back (bounded); returns everything read.
fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, until: &str, within: Duration) -> bool {
    let end = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        if String::from_utf8_lossy(got).contains(until) {
            return true;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    String::from_utf8_lossy(got).contains(until)
}

fn raw(d: &Daemon, head: &str) -> TcpStream {
    let addr = d.url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect to the daemon");
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s
}

fn as_host(d: &Daemon, host: &str, path: &str) -> reqwest::blocking::RequestBuilder {
    d.req_noauth(Method::GET, path).header("host", host)
}

#[test]
fn a_port_inside_a_deny_all_sandbox_is_reached_from_the_host() {
    require_root!();
    let d = Daemon::start();
    let mut listening = listening_sockets_of(d.pid());
    assert_eq!(listening, 1, "the daemon listens on its API socket only");
    let id = d.create(sandbox_body(json!({})));
    if common::under_gvisor() {
        // A gVisor sandbox is linked even when deny-all (docs/gvisor.md, "The network"): its
        // egress proxy listens on the host end of its own link, made with it.
        listening = listening_sockets_of(d.pid());
        assert_eq!(listening, 2, "the API socket and the sandbox's own egress proxy");
    }
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!((st, v["network"]["mode"].as_str()), (200, Some("deny-all")), "{v}");
    d.sh_ok(&id, &format!("cat > /tmp/server.py <<'EOF'\n{SERVER}\nEOF"));
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["python3", "/tmp/server.py"], "background": true, "timeout_ms": 0 }),
    );
    assert_eq!(st, 202, "{v}");

    // By path, with the owner's key: the listing.
    let base = format!("/v1/sandboxes/{id}/ports/8000");
    let listing = poll(Duration::from_secs(20), Duration::from_millis(100), || {
        let (st, v) = d.get(&format!("{base}/"));
        (st == 200).then_some(v)
    })
    .expect("the server answered through the daemon");
    assert!(listing.to_string().contains("hello-from-inside.txt"), "{listing}");
    let (st, v) = d.get(&format!("{base}/hello-from-inside.txt"));
    assert_eq!((st, v.as_str()), (200, Some("hi\n")));

    // Exposing it: a preview URL and a token.
    let (st, p) = d.post(&base, &json!({}));
    assert_eq!(st, 200, "{p}");
    let daemon_port = d.url.rsplit(':').next().unwrap();
    let host = format!("8000-{id}.localhost:{daemon_port}");
    assert_eq!(p["url"], format!("http://{host}/"));
    assert_eq!(p["public"], false);
    let token = p["token"].as_str().expect("token").to_string();
    let (st, list) = d.get(&format!("/v1/sandboxes/{id}/ports"));
    assert_eq!((st, list["ports"][0]["port"].as_u64()), (200, Some(8000)), "{list}");

    // By host: private without the token, open with it (then by its cookie).
    let (st, v) = d.send(as_host(&d, &host, "/"));
    assert_eq!((st, v["error"]["code"].as_str()), (401, Some("unauthorized")), "{v}");
    let (st, _) = d.send(as_host(&d, &host, "/?gb_token=gbp_00"));
    assert_eq!(st, 401, "a wrong token");
    let resp = as_host(&d, &host, &format!("/?gb_token={token}")).send().unwrap();
    assert_eq!(resp.status(), 200);
    let cookie = resp.headers().get("set-cookie").expect("the token is kept in a cookie").to_str().unwrap().to_string();
    assert!(resp.text().unwrap().contains("hello-from-inside.txt"));
    let cookie = cookie.split(';').next().unwrap().to_string();
    let (st, v) = d.send(as_host(&d, &host, "/hello-from-inside.txt").header("cookie", cookie));
    assert_eq!((st, v.as_str()), (200, Some("hi\n")));
    // The token opens this port only.
    let (st, _) = d.send(as_host(&d, &format!("8001-{id}.localhost"), &format!("/?gb_token={token}")));
    assert_eq!(st, 401);
    // By path without the key: private too; with the token: open.
    let (st, _) = d.send(d.req_noauth(Method::GET, &format!("{base}/")));
    assert_eq!(st, 401);
    let (st, _) = d.send(d.req_noauth(Method::GET, &format!("{base}/?gb_token={token}")));
    assert_eq!(st, 200);

    // The E2B front-end: `connect` answers the preview domain (so the SDKs' `get_host(8000)`
    // is this port's preview host) and a traffic token that opens the sandbox's ports.
    let (st, c) = d.send(
        d.req_noauth(Method::POST, &format!("/sandboxes/{id}/connect"))
            .header("x-api-key", &d.key)
            .json(&json!({ "timeout": 120 })),
    );
    assert!(st == 200 || st == 201, "{st} {c}");
    let e2b_host = format!("8000-{id}.{}", c["domain"].as_str().expect("domain"));
    assert_eq!(e2b_host, host);
    let traffic = c["trafficAccessToken"].as_str().expect("traffic token");
    let (st, v) = d.send(as_host(&d, &e2b_host, "/hello-from-inside.txt").header("e2b-traffic-access-token", traffic));
    assert_eq!((st, v.as_str()), (200, Some("hi\n")));
    let (st, _) = d.send(as_host(&d, &e2b_host, "/").header("e2b-traffic-access-token", "gbe2b_wrong"));
    assert_eq!(st, 401);

    // Another tenant's key: no such sandbox.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "other", "name": "ports" }));
    assert_eq!(st, 201, "{k}");
    let other = k["key"].as_str().unwrap();
    let (st, v) = d.send(d.req_noauth(Method::GET, &format!("{base}/")).bearer_auth(other));
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("sandbox_not_found")), "{v}");
    let (st, v) = d.send(d.req_noauth(Method::POST, &base).bearer_auth(other).json(&json!({})));
    assert_eq!(st, 404, "{v}");

    // Public: no token needed, by host or path.
    let (st, p) = d.post(&base, &json!({ "public": true }));
    assert_eq!((st, p["public"].as_bool()), (200, Some(true)), "{p}");
    let (st, v) = d.send(as_host(&d, &host, "/hello-from-inside.txt"));
    assert_eq!((st, v.as_str()), (200, Some("hi\n")));
    let (st, _) = d.send(d.req_noauth(Method::GET, &format!("{base}/")));
    assert_eq!(st, 200);

    // The Python SDK's `expose` gives the same preview URL (public: no token in it).
    let sdk = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python/src");
    let script = format!(
        "import glovebox; s = glovebox.Sandbox.connect('{id}', url='{}', api_key='{}'); print(s.expose(8000, public=True))",
        d.url, d.key
    );
    let out = common::run_bounded(
        std::process::Command::new("python3").arg("-c").arg(&script).env("PYTHONPATH", &sdk),
        None,
        Duration::from_secs(30),
    );
    assert_eq!(out.stdout_str().trim(), format!("http://{host}/"), "{}", out.stderr_str());

    let out = common::run_bounded(
        d.cli().args(["sandbox", "expose", &id, "8000", "--public"]),
        None,
        Duration::from_secs(30),
    );
    assert_eq!(
        (out.code(), out.stdout_str().trim()),
        (Some(0), format!("http://{host}/").as_str()),
        "{}",
        out.stderr_str()
    );

    // Streaming: the first part arrives while the server still holds the second back.
    let mut s = raw(&d, &format!("GET /stream HTTP/1.1\r\nHost: {host}\r\n\r\n"));
    let mut got = Vec::new();
    assert!(read_until(&mut s, &mut got, "first-part", Duration::from_secs(20)), "{}", String::from_utf8_lossy(&got));
    assert!(!String::from_utf8_lossy(&got).contains("second-part"));
    d.sh_ok(&id, "touch /tmp/go");
    assert!(read_until(&mut s, &mut got, "second-part", Duration::from_secs(20)), "{}", String::from_utf8_lossy(&got));
    drop(s);

    // WebSocket: the 101 with the accept key computed inside, then bytes echoed both ways.
    let mut s = raw(
        &d,
        &format!(
            "GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ),
    );
    let mut got = Vec::new();
    assert!(read_until(&mut s, &mut got, "\r\n\r\n", Duration::from_secs(20)), "{}", String::from_utf8_lossy(&got));
    let head = String::from_utf8_lossy(&got).to_string();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    for msg in ["echo-one", "echo-two"] {
        s.write_all(msg.as_bytes()).unwrap();
        let mut echoed = Vec::new();
        assert!(
            read_until(&mut s, &mut echoed, msg, Duration::from_secs(10)),
            "{msg}: {}",
            String::from_utf8_lossy(&echoed)
        );
    }
    drop(s);

    // Nothing listening: 502 with its own code.
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}/ports/8001/"));
    assert_eq!((st, v["error"]["code"].as_str()), (502, Some("port_not_listening")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("8001"), "{v}");

    // No socket was opened on the host for any of it.
    assert_eq!(listening_sockets_of(d.pid()), listening, "the daemon opened a listening socket");

    // The sandbox's own network is still deny-all: only loopback, and a host canary hears
    // nothing from it.
    let ifaces = d.sh_ok(&id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort");
    // Under gVisor its link exists from boot, held shut by the deny-all rules on the host side.
    let want = if common::under_gvisor() { "eth0\nlo" } else { "lo" };
    assert_eq!(ifaces.trim(), want, "{ifaces}");
    let canary = TcpListener::bind("0.0.0.0:0").unwrap();
    canary.set_nonblocking(true).unwrap();
    let cport = canary.local_addr().unwrap().port();
    let host_ips = common::run_bounded(std::process::Command::new("hostname").arg("-I"), None, Duration::from_secs(5));
    for ip in host_ips.stdout_str().split_whitespace().filter(|ip| !ip.contains(':')).take(2) {
        let r = d.sh(
            &id,
            &format!(
                "python3 -c 'import socket; socket.create_connection((\"{ip}\", {cport}), 2); print(\"reached\")'"
            ),
        );
        assert!(!r["stdout"].as_str().unwrap_or_default().contains("reached"), "{ip}: {r}");
    }
    assert!(canary.accept().is_err_and(|e| e.kind() == ErrorKind::WouldBlock), "the canary heard the sandbox");

    // Ended: 410; unknown: 404.
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
    let (st, v) = d.get(&format!("{base}/"));
    assert_eq!((st, v["error"]["code"].as_str()), (410, Some("sandbox_gone")), "{v}");
    let (st, v): (u16, Value) = d.get("/v1/sandboxes/nosuchsandbox0000/ports/8000/");
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("sandbox_not_found")), "{v}");
    d.shutdown_and_check_leaks();
}
