//! The client against an in-process fake agent: a unix socket in a temporary directory whose
//! every connection is served by a test's own script of the protocol.

use std::future::Future;

use glovebox_proto::agent::{ErrorCode, Event, ExecSpec, ExitStatus, FileInfo, FileType, Reply, Request};
use glovebox_proto::frame::Kind;
use glovebox_proto::io::{self, Reader, Writer};
use tokio::net::UnixListener;

use super::*;
use crate::error::Error;

/// A fake agent serving each connection with `serve`, and a client of it.
fn fake<F, Fut>(serve: F) -> (tempfile::TempDir, AgentClient)
where
    F: Fn(Reader, Writer) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (r, w) = io::split(s);
            tokio::spawn(serve(r, w));
        }
    });
    (dir, AgentClient::new(path))
}

fn info(path: &str) -> FileInfo {
    FileInfo {
        path: path.into(),
        name: path.rsplit('/').next().unwrap_or_default().into(),
        kind: FileType::File,
        size: 5,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: 0,
        target: None,
        xattrs: Default::default(),
    }
}

#[tokio::test]
async fn a_request_gets_its_typed_reply() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        match r.json::<Request>().await.unwrap() {
            Request::Stat { path } => w.json(&Reply::FileInfo(info(&path))).await.unwrap(),
            Request::List => w.json(&Reply::Commands { commands: Vec::new() }).await.unwrap(),
            other => panic!("unexpected request {other:?}"),
        }
    });
    assert_eq!(agent.stat("/home/user/a.txt".into()).await.unwrap(), info("/home/user/a.txt"));
    assert!(agent.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_reply_of_the_wrong_shape_is_an_error() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        r.json::<Request>().await.unwrap();
        w.json(&Reply::Ok).await.unwrap();
    });
    assert!(matches!(agent.stat("/x".into()).await, Err(AgentError::Unexpected(_))));
}

#[tokio::test]
async fn an_agent_refusal_keeps_its_code() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        match r.json::<Request>().await.unwrap() {
            Request::Remove { path, recursive: false } => {
                w.error(ErrorCode::NotFound, format!("{path}: no such file")).await.unwrap()
            }
            Request::Exec(_) => w.error(ErrorCode::SpawnFailed, "nope: not found").await.unwrap(),
            other => panic!("unexpected request {other:?}"),
        }
    });
    let e = agent.remove("/gone".into(), false).await.unwrap_err();
    assert!(
        matches!(&e, AgentError::Refused { code: ErrorCode::NotFound, message } if message == "/gone: no such file")
    );
    let e = e.into_error(Op::File, |e| panic!("not a broken connection: {e}"));
    assert!(matches!(e, Error::File { code: ErrorCode::NotFound, .. }));

    let Err(e) = agent.exec(&ExecSpec::argv(["nope"])).await else { panic!("the exec was refused") };
    assert!(matches!(e.into_error(Op::Exec, |e| panic!("{e}")), Error::Invalid(m) if m == "nope: not found"));
}

/// Echoes a command's stdin to its stdout after a line of stderr, then reports its exit.
async fn echo_command(mut r: Reader, mut w: Writer) {
    let Request::Exec(spec) = r.json::<Request>().await.unwrap() else { panic!("not an exec") };
    assert!(spec.stdin);
    w.json(&Event::Started { id: 5, pid: 42 }).await.unwrap();
    w.data(Kind::Stderr, b"starting\n").await.unwrap();
    let mut got = Vec::new();
    loop {
        match r.next().await.unwrap().unwrap() {
            (Kind::Stdin, b) => got.extend(b),
            (Kind::Json, b) => {
                assert_eq!(serde_json::from_slice::<Request>(&b).unwrap(), Request::CloseStdin { id: 5 });
                break;
            }
            (k, _) => panic!("unexpected {k:?} frame"),
        }
    }
    for chunk in got.chunks(3) {
        w.data(Kind::Stdout, chunk).await.unwrap();
    }
    let exit = ExitStatus { id: 5, exit_code: 3, stdout_bytes: got.len() as u64, ..Default::default() };
    w.json(&Event::Exited(exit)).await.unwrap();
}

#[tokio::test]
async fn an_exec_streams_output_and_takes_stdin() {
    let (_dir, agent) = fake(echo_command);
    let spec = ExecSpec { stdin: true, timeout_ms: Some(5_000), ..ExecSpec::argv(["cat"]) };
    let mut run = agent.exec(&spec).await.unwrap();
    assert_eq!((run.id, run.pid), (5, 42));
    run.stdin.send(b"hello", true).await.unwrap();
    let mut seen = Vec::new();
    loop {
        match run.output.next().await.unwrap() {
            Output::Exited(e) => {
                assert_eq!((e.id, e.exit_code, e.stdout_bytes), (5, 3, 5));
                break;
            }
            out => seen.push(out),
        }
    }
    let want =
        [Output::Stderr(b"starting\n".to_vec()), Output::Stdout(b"hel".to_vec()), Output::Stdout(b"lo".to_vec())];
    assert_eq!(seen, want);

    // Collected, each stream is cut at the cap.
    let mut run = agent.exec(&spec).await.unwrap();
    run.stdin.send(b"hello", true).await.unwrap();
    let (exit, out) = run.output.collect(4).await.unwrap();
    assert_eq!(exit.exit_code, 3);
    assert_eq!(out, [b"hell".to_vec(), b"star".to_vec()]);
}

#[tokio::test]
async fn an_output_stream_cut_short_is_an_error() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        match r.json::<Request>().await.unwrap() {
            Request::Attach { id: 1 } => w.data(Kind::Stdout, b"partial").await.unwrap(),
            Request::Attach { id: 2 } => w.data(Kind::Data, b"file bytes").await.unwrap(),
            other => panic!("unexpected request {other:?}"),
        }
    });
    let mut out = agent.attach(1).await.unwrap();
    assert_eq!(out.next().await.unwrap(), Output::Stdout(b"partial".to_vec()));
    assert!(matches!(out.next().await, Err(AgentError::Closed(_))));
    let mut out = agent.attach(2).await.unwrap();
    assert!(matches!(out.next().await, Err(AgentError::Unexpected("unexpected frame in output stream"))));
}

/// An agent that reads requests and never answers: every wait of the client is bounded.
#[tokio::test(start_paused = true)]
async fn a_silent_agent_times_out() {
    let (_dir, agent) = fake(|mut r, w| async move {
        let _held = w;
        while let Ok(Some(_)) = r.next().await {}
    });
    let t0 = tokio::time::Instant::now();
    assert!(matches!(agent.list().await, Err(AgentError::Timeout("the agent did not answer in time"))));
    assert!(t0.elapsed() >= REPLY_TIMEOUT);
    let e = agent.exec(&ExecSpec::argv(["true"])).await.err().unwrap();
    assert!(matches!(e, AgentError::Timeout("the agent did not start the command in time")));
    assert!(matches!(agent.stdin(3, b"x", true).await, Err(AgentError::Timeout(_))));
}

/// A command whose agent never reports its end fails at its timeout plus the slack.
#[tokio::test(start_paused = true)]
async fn a_command_that_never_ends_times_out() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        r.json::<Request>().await.unwrap();
        w.json(&Event::Started { id: 1, pid: 2 }).await.unwrap();
        while let Ok(Some(_)) = r.next().await {}
    });
    let spec = ExecSpec { timeout_ms: Some(1_000), ..ExecSpec::argv(["sleep", "inf"]) };
    let mut run = agent.exec(&spec).await.unwrap();
    let t0 = tokio::time::Instant::now();
    let e = run.output.next().await.unwrap_err();
    assert!(matches!(e, AgentError::Timeout("the agent did not report the command's end in time")));
    assert!(t0.elapsed() >= std::time::Duration::from_millis(1_000) + END_SLACK);
}

#[tokio::test]
async fn files_go_both_ways_in_chunks() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        match r.json::<Request>().await.unwrap() {
            Request::ReadFile { path } => {
                w.json(&Reply::FileInfo(info(&path))).await.unwrap();
                // More than announced: the file grew while read.
                w.data(Kind::Data, b"hello world").await.unwrap();
                w.json(&Reply::Ok).await.unwrap();
            }
            Request::WriteFile { path, parents: true, .. } => {
                let mut got = Vec::new();
                while let Some((kind, b)) = r.next().await.unwrap() {
                    match kind {
                        Kind::Data => got.extend(b),
                        _ => break,
                    }
                }
                assert_eq!(got, b"abcde");
                w.json(&Reply::FileInfo(info(&path))).await.unwrap();
            }
            other => panic!("unexpected request {other:?}"),
        }
    });
    let (meta, mut file) = agent.read_file("/f".into()).await.unwrap();
    assert_eq!(meta.size, 5);
    assert_eq!(file.next().await.unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(file.next().await.unwrap(), None);

    let mut up = agent.write_file("/g".into(), NewFile::default()).await.unwrap();
    up.send(b"abc").await.unwrap();
    up.send(b"de").await.unwrap();
    assert_eq!(up.finish().await.unwrap().path, "/g");
}

#[tokio::test]
async fn a_session_carries_stdin_and_output_until_exit() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        assert_eq!(r.json::<Request>().await.unwrap(), Request::Session { id: 9 });
        let (kind, b) = r.next().await.unwrap().unwrap();
        assert_eq!(kind, Kind::Stdin);
        w.data(Kind::Stdout, &b).await.unwrap();
        w.json(&Event::Exited(ExitStatus { id: 9, ..Default::default() })).await.unwrap();
    });
    let mut s = agent.session(9).await.unwrap();
    s.write(b"{\"code\":1}\n").await.unwrap();
    assert_eq!(s.read().await.unwrap(), Some(Output::Stdout(b"{\"code\":1}\n".to_vec())));
    assert_eq!(s.read().await.unwrap(), None);
}

/// An agent that refuses a write at once and hangs up: the client, whose data no longer
/// goes through, reports the agent's reason rather than the broken pipe.
#[tokio::test]
async fn a_refused_upload_reports_the_agents_reason() {
    let (_dir, agent) = fake(|mut r, mut w| async move {
        match r.json::<Request>().await.unwrap() {
            Request::WriteFile { .. } => w.error(ErrorCode::NoSpace, "no space left on device").await.unwrap(),
            Request::Stdin { id } => w.error(ErrorCode::NotFound, format!("no command {id}")).await.unwrap(),
            other => panic!("unexpected request {other:?}"),
        }
    });
    let mut up = agent.write_file("/big".into(), NewFile::with_mode(Some(0o600))).await.unwrap();
    let big = vec![7u8; 8 << 20];
    let e = up.send(&big).await.unwrap_err();
    assert!(matches!(e, AgentError::Refused { code: ErrorCode::NoSpace, .. }), "{e:?}");

    let e = agent.stdin(4, b"x", true).await.unwrap_err();
    assert!(
        matches!(e.into_error(Op::Command(4), |e| panic!("{e}")), Error::NotFound { what: "command", name } if name == "4")
    );
}
