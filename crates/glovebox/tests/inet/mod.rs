//! The test's own "internet": a network namespace holding TEST-NET-2 addresses
//! (198.51.100.0/24, never routed on the internet) with HTTP, HTTPS (a certificate from a test
//! CA made here), TCP, UDP and DNS services, and a metadata-address canary (169.254.169.254)
//! that exists only inside that namespace. No packet leaves the machine.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{rand_token, run_bounded};

pub const NET: &str = "198.51.100.10";
/// Another server of the test internet, which no allowed name resolves to.
pub const EVIL: &str = "198.51.100.20";

/// The test's own namespace, link, routes and servers; removed on drop whatever happens.
pub struct Internet {
    pub ns: String,
    veth: String,
    pub log: std::path::PathBuf,
    /// The test CA (PEM) that signed the HTTPS server's certificate, and that certificate.
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    servers: Vec<Child>,
    _dir: tempfile::TempDir,
    /// Held while this internet exists: its addresses and the metadata route are host-wide,
    /// so test binaries run side by side (not CI's way, a developer's) take turns.
    _turn: std::fs::File,
}

/// Waits for this host's test internet to be free (an exclusive `flock`, released when the
/// file is closed, also when a test process dies).
fn take_turn() -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/glovebox-test-inet.lock")
        .expect("open /run/glovebox-test-inet.lock");
    f.lock().expect("flock /run/glovebox-test-inet.lock");
    f
}

pub fn sh(args: &[&str]) -> bool {
    run_bounded(Command::new(args[0]).args(&args[1..]), None, Duration::from_secs(10)).code() == Some(0)
}

impl Internet {
    pub fn start() -> Internet {
        let turn = take_turn();
        let tag = rand_token(6);
        let dir = crate::common::tempdir("gbtest-inet-");
        let mut me = Internet {
            ns: format!("gbnt-{tag}"),
            veth: format!("gbnt{tag}"),
            log: dir.path().join("inet.log"),
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("cert.pem"),
            servers: Vec::new(),
            _dir: dir,
            _turn: turn,
        };
        let (ns, veth) = (me.ns.clone(), me.veth.clone());
        let peer = format!("{veth}p");
        for cmd in [
            vec!["ip", "netns", "add", &ns],
            vec!["ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer],
            vec!["ip", "link", "set", &peer, "netns", &ns],
            vec!["ip", "addr", "add", "198.51.100.1/24", "dev", &veth],
            vec!["ip", "link", "set", &veth, "up"],
            vec!["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"],
            vec!["ip", "netns", "exec", &ns, "ip", "addr", "add", "198.51.100.10/24", "dev", &peer],
            vec!["ip", "netns", "exec", &ns, "ip", "addr", "add", "169.254.169.254/32", "dev", &peer],
            vec!["ip", "netns", "exec", &ns, "ip", "addr", "add", "198.51.100.20/24", "dev", &peer],
            vec!["ip", "netns", "exec", &ns, "ip", "link", "set", &peer, "up"],
            vec!["ip", "netns", "exec", &ns, "ip", "route", "add", "default", "via", "198.51.100.1"],
            // The canary metadata address lives in our namespace, so a leak would land there.
            vec!["ip", "route", "add", "169.254.169.254/32", "via", NET, "dev", &veth],
        ] {
            assert!(sh(&cmd), "set-up step failed: {cmd:?}");
        }
        let fix = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/netfix.py");
        let log = me.log.display().to_string();
        let d = me._dir.path();
        let (cert, key) = (me.cert.display().to_string(), d.join("key.pem").display().to_string());
        let (ca, ca_key) = (me.ca.display().to_string(), d.join("ca.key").display().to_string());
        let (csr, ext) = (d.join("req.csr").display().to_string(), d.join("ext.cnf"));
        std::fs::write(
            &ext,
            "subjectAltName=DNS:api.good.test,DNS:pypi.good.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext file");
        let ext = ext.display().to_string();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut ca_cmd = vec!["openssl", "req", "-x509"];
        ca_cmd.extend(ec);
        ca_cmd.extend(["-subj", "/CN=Glovebox test internet CA", "-days", "2", "-keyout", &ca_key, "-out", &ca]);
        ca_cmd.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]);
        assert!(sh(&ca_cmd), "test CA");
        let mut req = vec!["openssl", "req", "-new"];
        req.extend(ec);
        req.extend(["-subj", "/CN=api.good.test", "-keyout", &key, "-out", &csr]);
        assert!(sh(&req), "test server key");
        assert!(
            sh(&[
                "openssl",
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ]),
            "test server certificate"
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

    pub fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn evil_events(&self) -> String {
        std::fs::read_to_string(format!("{}.evil", self.log.display())).unwrap_or_default()
    }

    pub fn meta_events(&self) -> String {
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

/// The host ends of the links daemon `pid` made (each carries the alias `glovebox_<pid>`:
/// other daemons on the host have links of their own).
pub fn links_of(pid: u32) -> Vec<String> {
    let owner = format!("glovebox_{pid}");
    let links = run_bounded(Command::new("ip").args(["-o", "link"]), None, Duration::from_secs(5)).stdout_str();
    links
        .lines()
        .filter(|l| l.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w == ["alias", owner.as_str()]))
        .map(|l| l.split(": ").nth(1).unwrap_or_default().to_string())
        .collect()
}

/// Whether daemon `pid` has any of its nft tables (`glovebox_<pid>` and its shards
/// `glovebox_<pid>_<n>`), with `nft list tables` for the message.
pub fn has_table(pid: u32) -> (bool, String) {
    let tables = run_bounded(Command::new("nft").args(["list", "tables"]), None, Duration::from_secs(5)).stdout_str();
    let owner = format!("table inet glovebox_{pid}");
    let shard = format!("{owner}_");
    let owned = |l: &str| l == owner || l.strip_prefix(&shard).is_some_and(|n| n.parse::<u32>().is_ok());
    (tables.lines().any(|l| owned(l.trim())), tables)
}

/// Nothing of the daemon `pid`'s networking is left: no link it made, no nft table.
pub fn assert_no_net_state(pid: u32) {
    // A destroyed sandbox's link goes with its network namespace, which the kernel removes
    // in the background once the sandbox's last process is gone.
    let gone = crate::common::poll(Duration::from_secs(5), Duration::from_millis(50), || {
        links_of(pid).is_empty().then_some(())
    });
    let left = links_of(pid);
    assert!(gone.is_some(), "sandbox links left behind: {left:?}");
    let (left, tables) = has_table(pid);
    assert!(!left, "the daemon's table is left: {tables}");
}
