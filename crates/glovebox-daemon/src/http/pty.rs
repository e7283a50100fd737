//! Terminals: start a command on a pseudo-terminal, resize it, and attach to it over a
//! WebSocket — binary frames are the terminal's bytes both ways, text frames JSON control
//! (`PtyControl` in, `PtyEvent` out). The last text frame is the command's exit, then the
//! socket closes. Closing the socket detaches: the program keeps running, and a new
//! attachment (which takes the terminal over from any other) sees its output from there on.
//!
//! Input, signals and the exit status are also plain routes (`…/commands/{cid}/stdin`,
//! `…/kill`, `…/commands/{cid}?wait=true`), so a client without WebSockets can drive one.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use glovebox_proto::api::{ErrorCode, ErrorDetail, PtyControl, PtyEvent, PtyExit, PtyRequest, PtyResize};
use std::sync::Arc;

use super::error::{ApiError, ApiResult};
use super::extract::{json, Json, Path};
use super::AppState;
use crate::agent::{Op, Output};
use crate::manager::{Manager, Sb};
use crate::ops;

/// Largest WebSocket message accepted from a client (input is typed or pasted).
const MAX_MESSAGE: usize = 1 << 20;
/// Output chunks in flight between the agent and a slow client (then the program waits).
const OUTPUT_BACKLOG: usize = 16;
/// The close code when another attachment took the terminal over (private range 4000–4999).
pub const CLOSE_TAKEN_OVER: u16 = 4001;
/// How long a client may leave output unread before it is detached (the program goes on; a
/// client that went away without closing its connection would otherwise hold the
/// attachment, and the sandbox busy, until TCP gives up).
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Sends one message within [`SEND_TIMEOUT`]; false when the client is gone or stuck.
async fn send(socket: &mut WebSocket, msg: Message) -> bool {
    matches!(tokio::time::timeout(SEND_TIMEOUT, socket.send(msg)).await, Ok(Ok(())))
}

pub async fn create(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Json(req): Json<PtyRequest>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    // An interactive program: only the sandbox's lifetime bounds it.
    let started = ops::pty_start(&st.manager, &sb, req, glovebox_proto::api::TimeBudget::UNBOUNDED).await?;
    Ok(json(StatusCode::CREATED, &started))
}

pub async fn resize(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    Json(req): Json<PtyResize>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    ops::pty_resize(&st.manager, &sb, cid, req.cols, req.rows).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn attach(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, u64)>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let sb = st.manager.get(&id)?;
    let ws = ws.map_err(|r| ApiError::new(ErrorCode::InvalidRequest, format!("expected a WebSocket upgrade: {r}")))?;
    let session = ops::pty_attach(&st.manager, &sb, cid).await?;
    let m = st.manager.clone();
    // A browser that offered `glovebox` (with its key in a second subprotocol) must get one
    // of its subprotocols back or it drops the connection; the key's is never echoed.
    let ws = ws.protocols([super::auth::WS_PROTOCOL]);
    Ok(ws.max_message_size(MAX_MESSAGE).on_upgrade(move |socket| bridge(m, sb, cid, session, socket)))
}

fn text(ev: &PtyEvent) -> Message {
    Message::Text(serde_json::to_string(ev).unwrap_or_default().into())
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code, reason: reason.into() }))
}

fn error_event(code: ErrorCode, message: impl Into<String>) -> PtyEvent {
    PtyEvent::Error(ErrorDetail { code, message: message.into(), reason: None })
}

/// Aborts a task when dropped (the socket's end, however it comes, ends the output pump).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Joins a WebSocket to a terminal session until either ends.
async fn bridge(m: Arc<Manager>, sb: Arc<Sb>, cid: u64, session: crate::agent::Session, mut socket: WebSocket) {
    // The sandbox is busy (for its idle clock) while someone is attached: the upgrade's
    // response ended the request, and the activity middleware's hold with it.
    let _busy = sb.activity.guard();
    let (mut output, mut input) = session.split();
    // The agent's frames are read by a task of their own: a frame read is not cancel-safe,
    // so it cannot race the socket in a `select!`.
    let (tx, mut rx) = tokio::sync::mpsc::channel(OUTPUT_BACKLOG);
    let (m2, sb2) = (m.clone(), sb.clone());
    let _pump = AbortOnDrop(tokio::spawn(async move {
        loop {
            let item = match output.next().await.map_err(ops::failed(&m2, &sb2, Op::Output(cid))) {
                // Taken over, or the sandbox ended under the session: which one?
                Ok(None) => ops::pty_session_ended(&m2, &sb2, cid).await.map(|()| None),
                other => other,
            };
            let last = !matches!(item, Ok(Some(Output::Stdout(_) | Output::Stderr(_))));
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    }));
    let mut input_open = true;
    loop {
        tokio::select! {
            out = rx.recv() => {
                let (msg, end) = match out {
                    Some(Ok(Some(Output::Stdout(b) | Output::Stderr(b)))) => (Message::Binary(b.into()), None),
                    Some(Ok(Some(Output::Exited(e)))) => {
                        let exit = PtyExit {
                            exit_code: e.exit_code,
                            signal: e.signal,
                            timed_out: e.timed_out,
                            duration_ms: e.duration_ms,
                        };
                        (text(&PtyEvent::Exited(exit)), Some(close(1000, "exited")))
                    }
                    Some(Ok(None)) | None => {
                        (close(CLOSE_TAKEN_OVER, "another client attached"), None)
                    }
                    Some(Err(e)) => {
                        (text(&PtyEvent::Error(e.into_detail())), Some(close(1011, "terminal unavailable")))
                    }
                };
                let closing = matches!(msg, Message::Close(_)) || end.is_some();
                if !send(&mut socket, msg).await {
                    return;
                }
                if let Some(c) = end {
                    let _ = send(&mut socket, c).await;
                }
                if closing {
                    return;
                }
            }
            msg = socket.recv() => {
                let msg = match msg {
                    Some(Ok(m)) => m,
                    // The client went away: detach, the program goes on.
                    Some(Err(_)) | None => return,
                };
                let reply = match msg {
                    // The agent ends the session when the program has ended: input after that
                    // is dropped, and the exit (or the reason there is none) follows on the
                    // output side.
                    Message::Binary(b) if input_open => {
                        input_open = input.write(&b).await.is_ok();
                        None
                    }
                    Message::Binary(_) => None,
                    Message::Text(t) => control(&m, &sb, cid, t.as_str()).await,
                    Message::Close(_) => return,
                    Message::Ping(_) | Message::Pong(_) => None,
                };
                if let Some(ev) = reply {
                    if !send(&mut socket, text(&ev)).await {
                        return;
                    }
                }
            }
        }
    }
}

/// One control message; an error event to send back if it was refused.
async fn control(m: &Manager, sb: &Sb, cid: u64, body: &str) -> Option<PtyEvent> {
    let done = match serde_json::from_str::<PtyControl>(body) {
        Ok(PtyControl::Resize(r)) => ops::pty_resize(m, sb, cid, r.cols, r.rows).await,
        Ok(PtyControl::Signal(sig)) => ops::signal(m, sb, cid, sig).await,
        Err(e) => {
            return Some(error_event(
                ErrorCode::InvalidRequest,
                format!("expected {{\"resize\":{{\"cols\":C,\"rows\":R}}}} or {{\"signal\":N}}: {e}"),
            ))
        }
    };
    done.err().map(|e| PtyEvent::Error(e.into_detail()))
}
