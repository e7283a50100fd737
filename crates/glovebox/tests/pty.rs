//! Terminals end to end: the `/pty` routes and their WebSocket against a real daemon, and
//! `glovebox sandbox shell` driven inside tmux as a user would drive it.

mod common;

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::stream::MaybeTlsStream;
use tokio_tungstenite::tungstenite::{self, Message, WebSocket};

const WAIT: Duration = Duration::from_secs(20);

/// A WebSocket attachment to a terminal, with everything it received so far.
struct Term {
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    out: String,
    events: Vec<Value>,
    closed: Option<u16>,
}

/// Attaches to terminal command `cid` of sandbox `id` with `key`; the HTTP status on refusal.
fn attach(d: &Daemon, key: &str, id: &str, cid: u64) -> Result<Term, u16> {
    let url = format!("{}/v1/sandboxes/{id}/pty/{cid}/ws", d.url.replacen("http://", "ws://", 1));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    let tcp = TcpStream::connect(d.url.trim_start_matches("http://")).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    match tungstenite::client(req, MaybeTlsStream::Plain(tcp)) {
        Ok((ws, _)) => {
            // Short reads from here on, so `pump` can poll with a deadline.
            if let MaybeTlsStream::Plain(s) = ws.get_ref() {
                s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            }
            Ok(Term { ws, out: String::new(), events: Vec::new(), closed: None })
        }
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => Err(resp.status().as_u16()),
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

impl Term {
    fn send(&mut self, bytes: &[u8]) {
        self.ws.send(Message::Binary(bytes.to_vec().into())).unwrap();
    }

    fn control(&mut self, v: Value) {
        self.ws.send(Message::Text(v.to_string().into())).unwrap();
    }

    /// Reads for at most `for_` (less if the socket closes); whether anything came.
    fn pump(&mut self, for_: Duration) {
        let end = Instant::now() + for_;
        while Instant::now() < end && self.closed.is_none() {
            match self.ws.read() {
                Ok(Message::Binary(b)) => self.out.push_str(&String::from_utf8_lossy(&b)),
                Ok(Message::Text(t)) => self.events.push(serde_json::from_str(t.as_str()).unwrap()),
                Ok(Message::Close(f)) => self.closed = Some(f.map(|f| u16::from(f.code)).unwrap_or(0)),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => self.closed = Some(0),
                Err(e) => panic!("websocket: {e}"),
            }
        }
    }

    /// Waits (bounded) until the output since `from` contains `what`; the output after it.
    fn expect(&mut self, from: usize, what: &str) -> usize {
        let end = Instant::now() + WAIT;
        loop {
            if let Some(i) = self.out[from..].find(what) {
                return from + i + what.len();
            }
            assert!(
                Instant::now() < end && self.closed.is_none(),
                "no {what:?} in the terminal (closed: {:?}); output:\n{}",
                self.closed,
                &self.out[from..]
            );
            self.pump(Duration::from_millis(200));
        }
    }

    /// Types `line` and waits for the output `want` after it.
    fn run(&mut self, line: &str, want: &str) -> usize {
        let from = self.out.len();
        self.send(format!("{line}\n").as_bytes());
        self.expect(from, want)
    }

    /// The `exited` event, waited for (bounded), and the close that follows it.
    fn exit(&mut self) -> Value {
        let end = Instant::now() + WAIT;
        while self.closed.is_none() && Instant::now() < end {
            self.pump(Duration::from_millis(200));
        }
        assert!(self.closed.is_some(), "the socket did not close; output:\n{}", self.out);
        self.events.iter().find_map(|e| e.get("exited").cloned()).unwrap_or_else(|| {
            panic!("no exited event in {:?}; output:\n{}", self.events, self.out);
        })
    }
}

fn pty(d: &Daemon, id: &str, body: Value) -> u64 {
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pty"), &body);
    assert_eq!(st, 201, "{v}");
    v["id"].as_u64().unwrap()
}

/// Waits (bounded) until a process named `name` runs in the sandbox.
fn wait_for_process(d: &Daemon, id: &str, name: &str) {
    let found = poll(WAIT, Duration::from_millis(100), || {
        let r = d.exec(id, json!({ "cmd": ["pgrep", "-x", name] }));
        (r["exit_code"] == 0).then_some(())
    });
    assert!(found.is_some(), "{name} never started in {id}");
}

fn no_process(d: &Daemon, id: &str, name: &str) -> bool {
    d.exec(id, json!({ "cmd": ["pgrep", "-x", name] }))["exit_code"] == 1
}

#[test]
fn terminal_api_and_websocket() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(json!({}));
    let cid = pty(&d, &id, json!({ "cols": 80, "rows": 24 }));
    let mut t = attach(&d, &d.key, &id, cid).unwrap();

    // The size it was made with; then each way of resizing it reaches `stty`.
    t.run("stty size", "24 80");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pty/{cid}/resize"), &json!({ "cols": 100, "rows": 30 }));
    assert_eq!(st, 204, "{v}");
    t.run("stty size", "30 100");
    t.control(json!({ "resize": { "cols": 132, "rows": 43 } }));
    t.run("stty size", "43 132");
    // A program on the terminal learns of the change (SIGWINCH to the foreground group).
    t.run("trap 'echo winch-$(tput cols)' WINCH; echo trap-$((1+2))", "trap-3");
    let from = t.out.len();
    t.control(json!({ "resize": { "cols": 90, "rows": 20 } }));
    t.send(b"\n");
    t.expect(from, "winch-90");

    // A real terminal device, TERM set, input echoed by the line discipline.
    let after = t.run("tty", "/dev/pts/");
    assert!(t.out[after..].starts_with(|c: char| c.is_ascii_digit()), "{}", &t.out[after..]);
    t.run("echo $TERM", "xterm-256color");
    t.run("echo sum-$((6*7))", "sum-42");
    let from = t.out.len();
    t.send(b"typed-but-not-run");
    t.expect(from, "typed-but-not-run");
    t.send(b"\x15"); // ^U: the line is discarded

    // ^C as a byte interrupts the foreground job, not the shell.
    t.send(b"sleep 100\n");
    wait_for_process(&d, &id, "sleep");
    t.send(b"\x03");
    t.run("echo after-ctrl-c-$((1+1))", "after-ctrl-c-2");
    assert!(no_process(&d, &id, "sleep"), "sleep survived ^C");
    // So does a signal sent as a control message.
    t.send(b"sleep 100\n");
    wait_for_process(&d, &id, "sleep");
    t.control(json!({ "signal": 2 }));
    t.run("echo after-signal-$((2+2))", "after-signal-4");
    assert!(no_process(&d, &id, "sleep"), "sleep survived SIGINT");
    // A bad control message is refused on the socket, which stays usable.
    t.control(json!({ "resize": { "cols": 0, "rows": 10 } }));
    t.control(json!({ "bogus": 1 }));
    t.run("echo still-$((3+3))", "still-6");
    let errors: Vec<&Value> = t.events.iter().filter_map(|e| e.get("error")).collect();
    assert_eq!(errors.len(), 2, "{:?}", t.events);
    assert!(errors.iter().all(|e| e["code"] == "invalid_request"), "{errors:?}");

    // Detach: the program goes on, and a new attachment sees what it printed meanwhile.
    let from = t.out.len();
    t.send(b"for i in 1 2 3; do sleep 0.5; echo tick-$i; done\n");
    t.expect(from, "tick-1");
    drop(t);
    let (_, list) = d.get(&format!("/v1/sandboxes/{id}/commands"));
    let me = list["commands"].as_array().unwrap().iter().find(|c| c["id"] == cid).cloned().unwrap();
    assert_eq!(me["running"], true, "{list}");
    let mut t = attach(&d, &d.key, &id, cid).unwrap();
    t.expect(0, "tick-3");
    // A second attachment takes the terminal over; the first is closed with 4001.
    let mut t2 = attach(&d, &d.key, &id, cid).unwrap();
    t.pump(Duration::from_secs(2));
    assert_eq!(t.closed, Some(4001), "the first attachment was not closed: {:?}", t.events);
    t2.run("echo second-$((4+4))", "second-8");

    // The exit status arrives as the last text frame, and through the commands API.
    t2.send(b"exit 7\n");
    let exit = t2.exit();
    assert_eq!(exit["exit_code"], 7, "{exit}");
    let (st, r) = d.get(&format!("/v1/sandboxes/{id}/commands/{cid}?wait=true"));
    assert_eq!((st, r["exit_code"].as_i64()), (200, Some(7)), "{r}");
    // Attaching to the ended terminal reports its exit at once.
    let mut t3 = attach(&d, &d.key, &id, cid).unwrap();
    assert_eq!(t3.exit()["exit_code"], 7);

    // A command named in the request, with its cwd and env; TERM may be overridden.
    let cid = pty(
        &d,
        &id,
        json!({ "cmd": ["/bin/sh", "-c", "pwd; echo $FOO $TERM; echo fds: $(ls /proc/self/fd); exit 3"], "cols": 40, "rows": 10, "cwd": "/tmp", "env": { "FOO": "bar", "TERM": "dumb" } }),
    );
    let mut t = attach(&d, &d.key, &id, cid).unwrap();
    assert_eq!(t.exit()["exit_code"], 3);
    assert!(t.out.contains("/tmp") && t.out.contains("bar dumb"), "{}", t.out);
    // Nothing of the agent's is open in the program: its stdio only (3 is `ls`'s directory).
    assert!(t.out.contains("fds: 0 1 2 3\r\n"), "{:?}", t.out);

    d.shutdown_and_check_leaks();
}

#[test]
fn terminal_of_a_template_user() {
    require_root!();
    let d = Daemon::start();
    let dir = tempdir("gb-pty-user");
    let dockerfile = dir.path().join("Dockerfile");
    std::fs::write(&dockerfile, "FROM host\nUSER user\n").unwrap();
    let o = run_bounded(
        d.cli().args(["template", "build", "-f"]).arg(&dockerfile).args(["-t", "pty-user"]),
        None,
        Duration::from_secs(120),
    );
    assert_eq!(o.code(), Some(0), "{}\n{}", o.stdout_str(), o.stderr_str());
    let id = d.create(json!({ "template": "pty-user" }));
    // The command runs as the template's user, who owns the terminal (as grantpt would make it).
    let cid = pty(
        &d,
        &id,
        json!({ "cmd": ["/bin/sh", "-c", "id -u; stat -c '%U %a' $(tty); exit 0"], "cols": 80, "rows": 24 }),
    );
    let mut t = attach(&d, &d.key, &id, cid).unwrap();
    assert_eq!(t.exit()["exit_code"], 0, "{}", t.out);
    assert!(t.out.contains("1000") && t.out.contains("user 620"), "{}", t.out);
    d.shutdown_and_check_leaks();
}

#[test]
fn terminal_errors_and_tenancy() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(json!({}));
    for (body, what) in [
        (json!({ "cols": 0, "rows": 24 }), "zero cols"),
        (json!({ "cols": 80, "rows": 1001 }), "too many rows"),
        (json!({ "cols": 80, "rows": 70000 }), "rows beyond u16"),
        (json!({ "cols": 80 }), "no rows"),
        (json!({ "cols": 80, "rows": 24, "bogus": 1 }), "unknown field"),
    ] {
        let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pty"), &body);
        assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{what}: {v}");
    }
    let (st, v) = d.post("/v1/sandboxes/sb-nope/pty", &json!({ "cols": 80, "rows": 24 }));
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("sandbox_not_found")), "{v}");
    let cid = pty(&d, &id, json!({ "cols": 80, "rows": 24 }));
    let resize = format!("/v1/sandboxes/{id}/pty/{cid}/resize");
    let (st, v) = d.post(&resize, &json!({ "cols": 1001, "rows": 24 }));
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pty/99999/resize"), &json!({ "cols": 80, "rows": 24 }));
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("command_not_found")), "{v}");
    assert_eq!(attach(&d, &d.key, &id, 99999).err(), Some(404));
    assert_eq!(attach(&d, &d.key, "sb-nope", cid).err(), Some(404));
    // A command without a terminal cannot be attached to as one, nor resized.
    let (st, bg) = d.post(&format!("/v1/sandboxes/{id}/exec"), &json!({ "cmd": ["sleep", "30"], "background": true }));
    assert_eq!(st, 202, "{bg}");
    let plain = bg["id"].as_u64().unwrap();
    assert_eq!(attach(&d, &d.key, &id, plain).err(), Some(400));
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pty/{plain}/resize"), &json!({ "cols": 80, "rows": 24 }));
    assert_eq!(st, 400, "{v}");
    // A plain GET (no upgrade) is a clear 400, not a hang.
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}/pty/{cid}/ws"));
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");

    // Another tenant's key: every terminal route answers as if the sandbox did not exist.
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "other", "name": "test" }));
    assert_eq!(st, 201, "{k}");
    let other = k["key"].as_str().unwrap().to_string();
    let as_other = |m: Method, path: &str, body: Value| d.send(d.req_noauth(m, path).bearer_auth(&other).json(&body));
    let (st, v) = as_other(Method::POST, &format!("/v1/sandboxes/{id}/pty"), json!({ "cols": 80, "rows": 24 }));
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("sandbox_not_found")), "{v}");
    let (st, v) = as_other(Method::POST, &resize, json!({ "cols": 80, "rows": 24 }));
    assert_eq!((st, v["error"]["code"].as_str()), (404, Some("sandbox_not_found")), "{v}");
    assert_eq!(attach(&d, &other, &id, cid).err(), Some(404));
    assert_eq!(attach(&d, "wrong-key", &id, cid).err(), Some(401));
    // The owner's terminal is untouched by all that.
    let mut t = attach(&d, &d.key, &id, cid).unwrap();
    t.run("stty size", "24 80");
    t.send(b"exit\n");
    assert_eq!(t.exit()["exit_code"], 0);
    d.shutdown_and_check_leaks();
}

// --- `glovebox sandbox shell` under tmux ---------------------------------------------------

/// A tmux server of its own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).env_remove("TMUX");
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let o = run_bounded(self.cmd().args(args), None, Duration::from_secs(10));
        assert_eq!(o.code(), Some(0), "tmux {args:?}: {}", o.stderr_str());
        o.stdout_str()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend(keys);
        self.run(&args);
    }

    fn literal(&self, text: &str) {
        self.run(&["send-keys", "-t", "t", "-l", text]);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "t"])
    }

    /// Waits (bounded) until the pane shows `want` (as `f` judges); the screen.
    fn wait(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let got = poll(WAIT, Duration::from_millis(100), || {
            let s = self.screen();
            f(&s).then_some(s)
        });
        got.unwrap_or_else(|| panic!("the pane never showed {what}; it shows:\n{}", self.screen()))
    }

    fn alive(&self) -> bool {
        run_bounded(self.cmd().args(["has-session", "-t", "t"]), None, Duration::from_secs(10)).code() == Some(0)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = run_bounded(self.cmd().arg("kill-server"), None, Duration::from_secs(10));
    }
}

#[test]
fn shell_under_tmux() {
    require_root!();
    assert!(
        Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success()),
        "tmux is missing: scripts/deps installs it"
    );
    let d = Daemon::start();
    let id = d.create(json!({}));
    let dir = tempdir("gb-tmux");
    let status = dir.path().join("status");
    let tmux = Tmux { socket: format!("gb-pty-{}", rand_hex(6)) };
    // The CLI's exit code lands in a file, and the pane stays for capture-pane.
    let shell = format!(
        "GLOVEBOX_URL={} GLOVEBOX_API_KEY={} {} sandbox shell {id}; echo $? > {}; sleep 600",
        d.url,
        d.key,
        glovebox_bin().display(),
        status.display()
    );
    tmux.run(&["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "120", "-y", "40", &shell]);
    tmux.wait("a prompt", |s| s.contains("root@"));

    // The terminal's size is the pane's, and follows it.
    tmux.literal("stty size\n");
    tmux.wait("40 120", |s| s.contains("40 120"));
    tmux.run(&["resize-window", "-t", "t", "-x", "100", "-y", "30"]);
    tmux.literal("clear; stty size\n");
    tmux.wait("30 100", |s| s.contains("30 100"));

    // Full-screen programs: vim (in the base template, which is the host's /usr) opens and
    // quits; top draws its header.
    tmux.literal("clear; vim /tmp/x.txt\n");
    tmux.wait("vim's screen", |s| s.contains("/tmp/x.txt") && s.lines().filter(|l| l.starts_with('~')).count() > 5);
    tmux.literal("ihello from vim");
    tmux.keys(&["Escape"]);
    tmux.literal(":wq\n");
    tmux.wait("the prompt after vim", |s| !s.lines().any(|l| l.starts_with('~')) && s.contains("root@"));
    assert_eq!(d.sh_ok(&id, "cat /tmp/x.txt").trim(), "hello from vim");
    tmux.literal("clear; top\n");
    tmux.wait("top's header", |s| s.contains("load average") && s.contains("PID"));
    tmux.literal("q");
    tmux.wait("the prompt after top", |s| !s.contains("load average") && s.contains("root@"));

    // Ctrl-C interrupts the program in the sandbox; the CLI (and the shell) keep running.
    tmux.literal("clear; sleep 100\n");
    wait_for_process(&d, &id, "sleep");
    tmux.keys(&["C-c"]);
    tmux.literal("echo alive-$((20+22))\n");
    tmux.wait("the shell after ^C", |s| s.contains("alive-42"));
    assert!(no_process(&d, &id, "sleep"), "sleep survived ^C");
    assert!(!status.exists(), "the CLI ended on ^C");

    // The remote exit code is the CLI's.
    tmux.literal("exit 5\n");
    let code = poll(WAIT, Duration::from_millis(100), || exit_status(&status));
    assert_eq!(code.as_deref().map(str::trim), Some("5"), "screen:\n{}", tmux.screen());
    assert!(tmux.alive());
    // The user's terminal is back in cooked mode: a line typed now is echoed by the pane's
    // own line discipline (raw mode would not echo).
    tmux.literal("cooked-again");
    tmux.wait("local echo", |s| s.contains("cooked-again"));
    drop(tmux);
    d.shutdown_and_check_leaks();
}

#[test]
fn shell_restores_the_terminal_when_the_sandbox_ends() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(json!({}));
    let dir = tempdir("gb-tmux-end");
    let status = dir.path().join("status");
    let tmux = Tmux { socket: format!("gb-pty-{}", rand_hex(6)) };
    let shell = format!(
        "GLOVEBOX_URL={} GLOVEBOX_API_KEY={} {} sandbox shell {id} 2>{}; echo $? > {}; sleep 600",
        d.url,
        d.key,
        glovebox_bin().display(),
        dir.path().join("stderr").display(),
        status.display()
    );
    tmux.run(&["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "100", "-y", "30", &shell]);
    tmux.wait("a prompt", |s| s.contains("root@"));
    // The sandbox ends under the session: the CLI says so, exits 125, and leaves the terminal
    // as it found it.
    let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert!(st == 200 || st == 204, "{st} {v}");
    let code = poll(WAIT, Duration::from_millis(100), || exit_status(&status));
    assert_eq!(code.as_deref().map(str::trim), Some("125"), "screen:\n{}", tmux.screen());
    let err = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(err.contains("sandbox_gone"), "{err}");
    tmux.literal("cooked-again");
    tmux.wait("local echo", |s| s.contains("cooked-again"));
    drop(tmux);
    d.shutdown_and_check_leaks();
}

#[test]
fn shell_without_a_terminal() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(json!({}));
    // Piped stdin: no raw mode, the lines run, the end of input ends the shell.
    let o = run_bounded(
        d.cli().args(["sandbox", "shell", &id, "--", "/bin/sh"]),
        Some(b"stty size\necho piped-$((5*5))\n"),
        WAIT,
    );
    assert_eq!(o.code(), Some(0), "{}\n{}", o.stdout_str(), o.stderr_str());
    assert!(o.stdout_str().contains("piped-25"), "{}", o.stdout_str());
    assert!(o.stdout_str().contains("24 80"), "the default size: {}", o.stdout_str());
    let o = run_bounded(d.cli().args(["sandbox", "shell", &id, "--", "sh", "-c", "exit 9"]), None, WAIT);
    assert_eq!(o.code(), Some(9), "{}\n{}", o.stdout_str(), o.stderr_str());
    let o = run_bounded(d.cli().args(["sandbox", "shell", "sb-nope"]), None, WAIT);
    assert_eq!(o.code(), Some(125), "{}", o.stderr_str());
    assert!(o.stderr_str().contains("sandbox_not_found"), "{}", o.stderr_str());
    d.shutdown_and_check_leaks();
}

/// The exit status the pane's shell wrote with `echo $? > file`, once the whole line is there:
/// the redirection creates the file before `echo` writes to it, so an empty read is "not yet".
fn exit_status(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path).ok().filter(|s| s.ends_with('\n'))
}
