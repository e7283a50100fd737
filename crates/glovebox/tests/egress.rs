//! Egress canaries: listeners on the host's loopback and inside a network namespace the test
//! creates, targeted from inside a deny-all sandbox. Nothing may arrive; a positive control
//! from outside proves each listener would have noticed. No packet targets anything but
//! loopback and the test's own namespace.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{rand_token, run_bounded, sandbox_body, Daemon, KillOnDrop, Netns};
use serde_json::json;

/// Listens on 127.0.0.1 (TCP and UDP) and reports every connection and datagram; prints the
/// ports first. Ends when its stdin closes.
const LISTENER: &str = r#"
import select, socket, sys
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", 0)); t.listen(16)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
print("ports", t.getsockname()[1], u.getsockname()[1], flush=True)
while True:
    r, _, _ = select.select([t, u, sys.stdin], [], [], 60)
    if not r or sys.stdin in r:
        break
    if t in r:
        c, a = t.accept(); print("tcp", a, flush=True); c.close()
    if u in r:
        d, a = u.recvfrom(65536); print("udp", a, d, flush=True)
print("end", flush=True)
"#;

/// A listener inside the test's own netns; its event lines arrive on a channel.
struct NsListener {
    child: KillOnDrop,
    lines: mpsc::Receiver<String>,
    tcp: u16,
    udp: u16,
}

impl NsListener {
    fn start(ns: &Netns) -> NsListener {
        let mut cmd = ns.command("python3");
        cmd.args(["-c", LISTENER]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = KillOnDrop(cmd.spawn().expect("spawn netns listener"));
        let out = child.0.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(10)).expect("netns listener did not start");
        let p: Vec<u16> = first.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        NsListener { child, lines: rx, tcp: p[0], udp: p[1] }
    }

    /// Event lines received so far (waiting up to `wait` for the first).
    fn events(&self, wait: Duration) -> Vec<String> {
        let mut v = Vec::new();
        if let Ok(l) = self.lines.recv_timeout(wait) {
            v.push(l);
            while let Ok(l) = self.lines.try_recv() {
                v.push(l);
            }
        }
        v
    }
}

impl Drop for NsListener {
    fn drop(&mut self) {
        if let Some(mut i) = self.child.0.stdin.take() {
            let _ = i.write_all(b"\n");
        }
    }
}

/// Tries TCP connect, UDP send and a name lookup to each (port, udp port); prints results.
const PROBE: &str = r#"
import socket, sys
targets = [int(x) for x in sys.argv[1:]]
for i in range(0, len(targets), 2):
    tp, up = targets[i], targets[i + 1]
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(("127.0.0.1", tp)); print("tcp", tp, "CONNECTED")
    except OSError as e:
        print("tcp", tp, "failed", type(e).__name__)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b"canary", ("127.0.0.1", up)); print("udp", up, "sent")
    except OSError as e:
        print("udp", up, "failed", type(e).__name__)
for name in ["example.test", "localhost.example.test", "metadata.google.internal"]:
    try:
        socket.getaddrinfo(name, 80); print("dns", name, "RESOLVED")
    except OSError as e:
        print("dns", name, "failed")
"#;

#[test]
fn nothing_leaves_a_deny_all_sandbox() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "network": { "mode": "deny-all" } })));

    // Host loopback listeners of our own.
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let (htp, hup) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());

    // And inside a namespace we own (deleted on drop, whatever happens).
    let ns = Netns::new();
    let nsl = NsListener::start(&ns);

    let args = [htp, hup, nsl.tcp, nsl.udp].map(|p| p.to_string());
    let mut cmd = vec!["python3".to_string(), "-c".into(), PROBE.into()];
    cmd.extend(args);
    let r = d.exec(&id, json!({ "cmd": cmd, "timeout_ms": 20_000 }));
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(out.matches("tcp ").count(), 2, "{out}");
    assert!(!out.contains("CONNECTED"), "a TCP connection left the sandbox:\n{out}");
    assert!(!out.contains("RESOLVED"), "a name resolved inside a deny-all sandbox:\n{out}");

    // The listeners saw nothing.
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        if let Ok((_, a)) = tcp.accept() {
            panic!("host TCP canary got a connection from {a}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut buf = [0u8; 64];
    if let Ok((n, a)) = udp.recv_from(&mut buf) {
        panic!("host UDP canary got {:?} from {a}", &buf[..n]);
    }
    let ev = nsl.events(Duration::from_millis(300));
    assert!(ev.is_empty(), "netns canary saw traffic: {ev:?}");

    // Positive controls: each listener notices traffic that really reaches it.
    TcpStream::connect(("127.0.0.1", htp)).unwrap();
    let got = common::poll(Duration::from_secs(5), Duration::from_millis(10), || tcp.accept().ok());
    assert!(got.is_some(), "host TCP canary cannot see connections (control)");
    UdpSocket::bind("127.0.0.1:0").unwrap().send_to(b"control", ("127.0.0.1", hup)).unwrap();
    assert!(udp.recv_from(&mut buf).is_ok(), "host UDP canary cannot see datagrams (control)");
    let control = format!(
        "import socket; socket.create_connection(('127.0.0.1', {}), 2).close(); \
         socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'c', ('127.0.0.1', {}))",
        nsl.tcp, nsl.udp
    );
    let o = run_bounded(ns.command("python3").args(["-c", &control]), None, Duration::from_secs(10));
    assert!(o.status.success(), "control in netns: {}", o.stderr_str());
    let mut ev = Vec::new();
    let seen = common::poll(Duration::from_secs(5), Duration::from_millis(10), || {
        ev.extend(nsl.events(Duration::from_millis(100)));
        (ev.iter().any(|l| l.starts_with("tcp")) && ev.iter().any(|l| l.starts_with("udp"))).then_some(())
    });
    assert!(seen.is_some(), "netns canary cannot see traffic (control): {ev:?}");

    // The sandbox's own loopback works (it is a real, private network stack).
    let own = format!(
        "import socket, threading\n\
         s = socket.socket(); s.bind(('127.0.0.1', {htp})); s.listen(1)\n\
         c = socket.create_connection(('127.0.0.1', {htp}), 2); a, _ = s.accept(); c.send(b'{tok}')\n\
         print(a.recv(64).decode())",
        tok = rand_token(8)
    );
    let r = d.exec(&id, json!({ "cmd": ["python3", "-c", own], "timeout_ms": 10_000 }));
    assert_eq!(r["exit_code"], 0, "private loopback on the host's port number: {r}");
    assert!(tcp.accept().is_err(), "the sandbox's own loopback reached the host listener");

    drop(nsl);
    drop(ns);
    d.shutdown_and_check_leaks();
}
