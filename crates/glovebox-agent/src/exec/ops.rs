//! What a client does with a started command: attach, a session, resize, signal, stdin,
//! list, release; and the sandbox's usage.

use super::*;

impl Exec {
    pub async fn attach(&self, id: u64, w: &mut Writer) -> Result<(), ConnError> {
        match self.get(id) {
            Some(c) => stream(&c, w).await,
            None => w.error(ErrorCode::NotFound, format!("no command {id}")).await,
        }
    }

    /// `Request::Session`: full-duplex attachment to a session-mode command.
    pub async fn session(&self, id: u64, mut r: Reader, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        let Some(raw) = &c.raw else {
            return w.error(ErrorCode::InvalidArgument, format!("command {id} is not a session")).await;
        };
        // A terminal is taken over by the newest attachment (a client reconnecting after its
        // connection broke must not wait for the old one to time out); a kernel's session is
        // exclusive.
        let mut rx = match raw.rx.try_lock() {
            Ok(g) => g,
            Err(_) if c.pty.is_some() => {
                raw.takeover.send_modify(|n| *n += 1);
                match tokio::time::timeout(TAKEOVER_WAIT, raw.rx.lock()).await {
                    Ok(g) => g,
                    Err(_) => {
                        return w
                            .error(ErrorCode::AlreadyExists, format!("command {id} is held by another session"))
                            .await
                    }
                }
            }
            Err(_) => {
                return w.error(ErrorCode::AlreadyExists, format!("command {id} already has a session attached")).await
            }
        };
        let mut taken_over = raw.takeover.subscribe();
        // Stdin pump: frames from the daemon go to the command until the connection ends.
        let c2 = c.clone();
        let (gone_tx, mut gone) = oneshot::channel::<()>();
        let pump = tokio::spawn(async move {
            while let Ok(Some((kind, body))) = r.next().await {
                match kind {
                    Kind::Stdin => {
                        let mut g = c2.stdin.lock().await;
                        if let Some(tx) = g.as_mut() {
                            if tx.write_all(&body).await.is_err() {
                                *g = None;
                            }
                        }
                    }
                    Kind::Json => {
                        if let Ok(Request::CloseStdin { .. }) = serde_json::from_slice::<Request>(&body) {
                            *c2.stdin.lock().await = None;
                        }
                    }
                    _ => break,
                }
            }
            let _ = gone_tx.send(());
        });
        let mut version = c.version.subscribe();
        // The readers are done (all output is in): what is left to send is the exit.
        let mut output_done = false;
        let result = loop {
            let exit = lock(&c.st).exit.clone();
            if let Some(exit) = exit {
                // What the readers still had: they end (closing the channel) once the
                // command's output ends, which its cgroup's kill has made sure of.
                while let Ok(Some((k, b))) = tokio::time::timeout(EXIT_GRACE, rx.recv()).await {
                    if let Err(e) = w.data(k, &b).await {
                        pump.abort();
                        return Err(e);
                    }
                }
                break w.json(&Event::Exited(exit)).await;
            }
            tokio::select! {
                m = rx.recv(), if !output_done => match m {
                    // A write to a reader that stopped reading must not keep a new session
                    // out: the takeover cuts it (this connection is dropped with it).
                    Some((k, b)) => tokio::select! {
                        r = w.data(k, &b) => {
                            if let Err(e) = r {
                                break Err(e);
                            }
                        }
                        _ = taken_over.changed() => break Ok(()),
                    },
                    None => output_done = true,
                },
                _ = &mut gone => break Ok(()),
                _ = taken_over.changed() => break Ok(()),
                ch = version.changed() => {
                    if ch.is_err() {
                        break Ok(());
                    }
                }
            }
        };
        pump.abort();
        drop(rx);
        result
    }

    /// `Request::Resize`: the new size of a terminal command's window.
    pub async fn resize(&self, id: u64, size: PtySize, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        let Some(master) = &c.pty else {
            return w.error(ErrorCode::InvalidArgument, format!("command {id} has no terminal")).await;
        };
        if !size.is_valid() {
            return w
                .error(ErrorCode::InvalidArgument, format!("terminal size must be 1..={} each way", PtySize::MAX))
                .await;
        }
        if lock(&c.st).exit.is_some() {
            return w.json(&Reply::Ok).await;
        }
        match set_size(master, size) {
            Ok(()) => w.json(&Reply::Ok).await,
            Err(e) => w.error(ErrorCode::Io, format!("resize: {e}")).await,
        }
    }

    pub async fn signal(&self, id: u64, signal: i32, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        if lock(&c.st).exit.is_some() {
            return w.json(&Reply::Ok).await;
        }
        if signal == libc::SIGKILL {
            self.kill_tree(&c).await;
            return w.json(&Reply::Ok).await;
        }
        let Some(sig) = rustix::process::Signal::from_named_raw(signal) else {
            return w.error(ErrorCode::InvalidArgument, format!("bad signal {signal}")).await;
        };
        // On a terminal the signal goes where the terminal's own ^C would: its foreground
        // process group (a job a shell started), else the command's group.
        let group = c.pty.as_ref().and_then(|m| rustix::termios::tcgetpgrp(m).ok()).map(|p| p.as_raw_nonzero().get());
        if let Some(p) = rustix::process::Pid::from_raw(group.unwrap_or(c.pid)) {
            let _ = rustix::process::kill_process_group(p, sig);
        }
        w.json(&Reply::Ok).await
    }

    pub async fn stdin(&self, id: u64, r: &mut Reader, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        match feed_stdin(&c, r, false).await {
            Ok(()) => w.json(&Reply::Ok).await,
            Err(e) => w.error(ErrorCode::Io, format!("stdin: {e}")).await,
        }
    }

    pub async fn close_stdin(&self, id: u64, w: &mut Writer) -> Result<(), ConnError> {
        let Some(c) = self.get(id) else {
            return w.error(ErrorCode::NotFound, format!("no command {id}")).await;
        };
        *c.stdin.lock().await = None;
        w.json(&Reply::Ok).await
    }

    pub async fn list(&self, w: &mut Writer) -> Result<(), ConnError> {
        let mut commands: Vec<CommandInfo> = lock(&self.0.cmds).values().map(|c| c.info()).collect();
        commands.sort_by_key(|c| c.id);
        w.json(&Reply::Commands { commands }).await
    }

    pub async fn release(&self, id: u64, w: &mut Writer) -> Result<(), ConnError> {
        {
            let mut cmds = lock(&self.0.cmds);
            if cmds.get(&id).is_some_and(|c| lock(&c.st).exit.is_some()) {
                cmds.remove(&id);
            }
        }
        w.json(&Reply::Ok).await
    }

    pub async fn usage(&self, w: &mut Writer) -> Result<(), ConnError> {
        let mut u = Usage::default();
        if let Ok(s) = rustix::fs::statvfs("/") {
            u.disk_total_bytes = s.f_blocks * s.f_frsize;
            u.disk_used_bytes = (s.f_blocks - s.f_bfree) * s.f_frsize;
        }
        if let Ok(rd) = std::fs::read_dir("/proc") {
            u.processes = rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
                .count() as u64;
        }
        w.json(&Reply::Usage(u)).await
    }
}
