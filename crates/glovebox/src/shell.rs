//! `glovebox sandbox shell ID [-- CMD...]`: an interactive terminal in a sandbox, in the
//! user's own terminal.
//!
//! Invariants:
//! - When stdin is a terminal it is put in raw mode for the session and restored on every way
//!   out: return, error, and panic (a guard, and a panic hook for panics on other threads).
//!   Raw mode turns off the local line discipline, so ^C, ^Z and ^\ reach the sandbox as
//!   bytes and signal the program there, never this CLI.
//! - The terminal's size is sent at the start and again on every SIGWINCH.
//! - Stdin is read on a thread of its own (a blocked read must not hold up the exit); when it
//!   is not a terminal and ends, an end-of-file character (^D) is sent, as a terminal would.
//! - The exit code is the remote program's; 125 when Glovebox failed (the CLI's usual codes).

use std::io::{IsTerminal, Read, Write};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use glovebox_proto::api::{self, PtyControl, PtyEvent, PtyRequest, PtyResize, Started};
use reqwest::Method;
use tokio_tungstenite::tungstenite::Message;

use crate::client::Client;

/// The terminal settings to put back (also read by the panic hook).
static SAVED: Mutex<Option<rustix::termios::Termios>> = Mutex::new(None);

/// Raw mode for as long as it lives.
struct RawMode;

impl RawMode {
    fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let old = rustix::termios::tcgetattr(&stdin).context("read the terminal's settings")?;
        let mut raw = old.clone();
        raw.make_raw();
        *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = Some(old);
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            prev(info);
        }));
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Flush, &raw)
            .context("put the terminal in raw mode")?;
        Ok(RawMode)
    }
}

fn restore() {
    if let Some(old) = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, &old);
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// The size of the user's terminal (stdout's, else stdin's), if either is one.
fn local_size() -> Option<PtyResize> {
    let ws = rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some(PtyResize { cols: ws.ws_col.into(), rows: ws.ws_row.into() })
}

/// Starts `cmd` (default: a login shell) on a terminal in sandbox `id`, or attaches to the
/// running terminal command `attach`, and runs the session; the remote exit code.
pub async fn run(client: &Client, id: &str, cmd: Vec<String>, attach: Option<u64>) -> Result<i32> {
    let tty = std::io::stdin().is_terminal();
    let size = local_size().unwrap_or(PtyResize { cols: 80, rows: 24 });
    let cid = match attach {
        Some(cid) => cid,
        None => {
            let req = PtyRequest {
                cmd: (!cmd.is_empty()).then_some(api::Command::Argv(cmd)),
                cols: size.cols,
                rows: size.rows,
                cwd: None,
                env: Default::default(),
            };
            let started: Started =
                client.json(client.req(Method::POST, &format!("/v1/sandboxes/{id}/pty")).json(&req)).await?;
            started.id
        }
    };
    let (ws, _) = tokio_tungstenite::connect_async(client.ws_request(&format!("/v1/sandboxes/{id}/pty/{cid}/ws"))?)
        .await
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(resp) => {
                let body = resp.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
                anyhow!("attach to the terminal: HTTP {}: {body}", resp.status())
            }
            e => anyhow!("attach to the terminal: {e}"),
        })?;
    let (mut tx, mut rx) = ws.split();
    if attach.is_some() {
        // Whoever had it before may have had another size.
        let msg = serde_json::to_string(&PtyControl::Resize(size))?;
        tx.send(Message::Text(msg.into())).await.context("send the terminal's size")?;
    }
    let _raw = if tty { Some(RawMode::enter()?) } else { None };
    let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    if !tty {
                        let _ = in_tx.blocking_send(vec![0x04]);
                    }
                    return;
                }
                Ok(n) => {
                    if in_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .context("watch the terminal's size")?;
    let mut stdin_open = true;
    let mut last_error: Option<String> = None;
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    out.write_all(&b).and_then(|()| out.flush()).context("write to the terminal")?;
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<PtyEvent>(t.as_str()) {
                    Ok(PtyEvent::Exited(e)) => return Ok(e.exit_code),
                    // A refused control message is not fatal; an error the session ends on
                    // is followed by the close, which reports it.
                    Ok(PtyEvent::Error(e)) => last_error = Some(format!("{} ({})", e.message, e.code)),
                    Err(_) => {}
                },
                Some(Ok(Message::Close(f))) => {
                    let why = f.map(|f| f.reason.to_string()).unwrap_or_default();
                    match last_error {
                        Some(e) => bail!("the terminal ended: {e}"),
                        None => bail!("the daemon closed the terminal before the program ended: {why}"),
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => bail!("terminal connection: {e}"),
                None => bail!("the daemon closed the terminal before the program ended"),
            },
            data = in_rx.recv(), if stdin_open => match data {
                Some(d) => tx.send(Message::Binary(d.into())).await.context("send input")?,
                None => stdin_open = false,
            },
            _ = winch.recv() => {
                if let Some(size) = local_size() {
                    let msg = serde_json::to_string(&PtyControl::Resize(size))?;
                    tx.send(Message::Text(msg.into())).await.context("send the terminal's size")?;
                }
            }
        }
    }
}
