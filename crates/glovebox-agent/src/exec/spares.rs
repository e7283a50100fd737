//! Spares: processes forked ahead (from the zygote when there is one) that wait for a
//! command, so a start is a hand-over rather than a fork.

use super::*;

impl Exec {
    /// Hands a job to a waiting spare.
    pub(super) fn start_on_spare(
        &self,
        sp: Spare,
        argv: &[String],
        env: &[(String, String)],
        cwd: &str,
        spec: &ExecSpec,
    ) -> std::io::Result<Arc<Cmd>> {
        use std::io::Write;
        let job = crate::spare::Job { argv: argv.to_vec(), env: env.to_vec(), cwd: cwd.to_string() };
        let body = serde_json::to_vec(&job).map_err(std::io::Error::other)?;
        // Checked before the job is written, never after: a spare seen doomed after the write
        // may have run the command already, and starting it again would run it twice.
        let written = if sp.stat.as_ref().is_none_or(doomed) {
            Err(std::io::Error::other(format!("spare {} is exiting", sp.pid)))
        } else {
            // A spare that died waiting since: its pipe is closed (EPIPE).
            std::fs::File::from(sp.job).write_all(&body)
        };
        if let Err(e) = written {
            self.discard(sp.pid, sp.exited, sp.cgroup_dir);
            return Err(e);
        }
        let cmd = self.new_cmd(sp.id, sp.pid, spec, cwd, sp.cgroup_dir);
        lock(&self.0.cmds).insert(sp.id, cmd.clone());
        let stdin = if spec.stdin { Some(sp.stdin) } else { None };
        self.track(&cmd, sp.stdout, sp.stderr, stdin, sp.exited, spec);
        Ok(cmd)
    }

    /// Drops the spares that died waiting (a command, same uid, may kill them) and returns
    /// their cgroups for removal. A dead one left in the list would fail its command's start
    /// and, the list looking full, never be replaced: the sandbox would stay on the slow path.
    pub(super) fn prune_spares(&self) -> Vec<PathBuf> {
        let mut dead = Vec::new();
        lock(&self.0.spare).retain_mut(|sp| {
            let alive = matches!(sp.exited.try_recv(), Err(oneshot::error::TryRecvError::Empty));
            if !alive {
                dead.extend(sp.cgroup_dir.take());
            }
            alive
        });
        dead
    }

    /// Ends a spare that cannot take its job and removes its cgroup once it is gone.
    pub(super) fn discard(
        &self,
        pid: i32,
        exited: oneshot::Receiver<rustix::process::WaitStatus>,
        cgroup: Option<PathBuf>,
    ) {
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
        if let Some(d) = cgroup {
            tokio::spawn(async move {
                let _ = exited.await;
                let _ = tokio::task::spawn_blocking(move || glovebox_jail::cgroup::remove_tree(&d)).await;
            });
        }
    }

    /// A spare that is still alive, if any.
    pub(super) fn live_spare(&self) -> Option<Spare> {
        for d in self.prune_spares() {
            tokio::task::spawn_blocking(move || glovebox_jail::cgroup::remove_tree(&d));
        }
        lock(&self.0.spare).pop()
    }

    /// How many spares to keep ready: fewer before the first command (see `SPARES_AT_BOOT`).
    fn spares_wanted(&self) -> usize {
        if self.0.busy.load(Ordering::Relaxed) {
            SPARES
        } else {
            SPARES_AT_BOOT
        }
    }

    /// Starts a background refill of the spare slot, unless one is under way.
    pub(super) fn refill(&self) {
        if self.0.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.top_up());
    }

    /// The first refill, at boot: on a thread of its own that ends with it. On the runtime's
    /// blocking pool the thread would stay, idle, for the pool's keep-alive (10 s): a task on
    /// the host for every sandbox made in the last 10 s, which every create's `pivot_root`
    /// visits (see `SPARES_AT_BOOT`).
    pub(super) fn refill_at_boot(&self) {
        if self.0.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        let spawned = std::thread::Builder::new().name("refill".into()).spawn(move || this.top_up());
        if let Err(e) = spawned {
            eprintln!("agent: refill thread: {e}");
            self.0.refilling.store(false, Ordering::Release);
            self.refill();
        }
    }

    /// Blocking: makes spares until there are as many as wanted (the refill under way).
    fn top_up(&self) {
        // Back-to-back cgroup migrations share one RCU grace period, so topping up
        // several spares in a row costs little more than one.
        while {
            for d in self.prune_spares() {
                let _ = glovebox_jail::cgroup::remove_tree(&d);
            }
            lock(&self.0.spare).len() < self.spares_wanted()
        } {
            match self.make_spare() {
                Ok(sp) => lock(&self.0.spare).push(sp),
                Err(e) => {
                    eprintln!("agent: spare: {e}");
                    break;
                }
            }
        }
        self.0.refilling.store(false, Ordering::Release);
    }

    /// Blocking: spawns a spare, moves it into a fresh command cgroup.
    pub(super) fn make_spare(&self) -> std::io::Result<Spare> {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        let reused = lock(&self.0.free_cgroups).pop();
        let cgroup_dir = match (&self.0.cgroup, reused) {
            (Some(_), Some(dir)) => Some(dir),
            (Some((fd, _)), None) => {
                let dir = PathBuf::from(format!("/proc/self/fd/{}/cmd-{id}", raw(fd)));
                std::fs::create_dir(&dir)?;
                Some(dir)
            }
            (None, _) => None,
        };
        let forked = match self.zygote_fork() {
            Some(f) => f,
            None => match self.fork_spare_here() {
                Ok(f) => f,
                Err(e) => {
                    if let Some(d) = &cgroup_dir {
                        let _ = std::fs::remove_dir(d);
                    }
                    return Err(e);
                }
            },
        };
        let (tx, rx) = oneshot::channel();
        let crate::zygote::Forked { pid, job: job_w, stdin, stdout, stderr } = forked;
        self.register(pid, tx);
        if let Some(d) = &cgroup_dir {
            if let Err(e) = std::fs::write(d.join("cgroup.procs"), pid.to_string()) {
                if let Some(p) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
                return Err(e);
            }
        }
        let stat = rustix::fs::open(
            format!("/proc/{pid}/stat"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        Ok(Spare { id, pid, job: job_w, stdin, stdout, stderr, cgroup_dir, exited: rx, stat })
    }

    /// Zygotes a command may kill before spares are forked by the agent itself instead.
    const MAX_ZYGOTES: u32 = 32;

    /// Blocking: one spare from the zygote (started if needed, once more if it failed).
    pub(super) fn zygote_fork(&self) -> Option<crate::zygote::Forked> {
        let mut z = lock(&self.0.zygote);
        for _ in 0..2 {
            if z.is_none() {
                if self.0.zygote_starts.fetch_add(1, Ordering::Relaxed) >= Self::MAX_ZYGOTES {
                    return None;
                }
                match crate::zygote::Zygote::start(Arc::new(ChildSetup::root(self.0.seccomp.clone()))) {
                    Ok((zg, child)) => {
                        self.reap_and_forget(zg.pid);
                        drop(child);
                        *z = Some(zg);
                    }
                    Err(e) => {
                        eprintln!("agent: zygote: {e}");
                        return None;
                    }
                }
            }
            match z.as_ref().map(|zg| zg.fork()) {
                Some(Ok(f)) if !parent_is_honoured(f.pid) => {
                    // A kernel that ignores CLONE_PARENT (gVisor's) makes the spare the
                    // zygote's child: its exit would never reach this reaper. No zygote then:
                    // the agent forks its spares itself from here on.
                    eprintln!("agent: the kernel ignores CLONE_PARENT; spares are forked by the agent");
                    self.0.zygote_starts.store(Self::MAX_ZYGOTES, Ordering::Relaxed);
                    for pid in [f.pid, z.take().map(|zg| zg.pid).unwrap_or(0)] {
                        if let Some(p) = rustix::process::Pid::from_raw(pid) {
                            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                        }
                    }
                    return None;
                }
                Some(Ok(f)) => return Some(f),
                Some(Err(e)) => {
                    eprintln!("agent: zygote: {e}; starting another");
                    if let Some(old) = z.take() {
                        if let Some(p) = rustix::process::Pid::from_raw(old.pid) {
                            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                        }
                    }
                }
                None => return None,
            }
        }
        None
    }

    /// Blocking: a spare forked from the agent itself (without a zygote).
    pub(super) fn fork_spare_here(&self) -> std::io::Result<crate::zygote::Forked> {
        let (job_r, job_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let setup = Arc::new(ChildSetup::root(self.0.seccomp.clone()));
        let mut c = crate::zygote::self_command("spare");
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let spawned = glovebox_jail::child::spawn(&mut c, setup, Some(&job_r));
        drop(job_r);
        let mut child = spawned?;
        let pid = child.id() as i32;
        let (Some(i), Some(o), Some(e)) = (child.stdin.take(), child.stdout.take(), child.stderr.take()) else {
            let _ = child.kill();
            return Err(std::io::Error::other("spare without pipes"));
        };
        Ok(crate::zygote::Forked {
            pid,
            job: job_w,
            stdin: OwnedFd::from(i),
            stdout: OwnedFd::from(o),
            stderr: OwnedFd::from(e),
        })
    }

    /// A child whose exit nobody waits for (the zygote): reaped like any, its status dropped.
    pub(super) fn reap_and_forget(&self, pid: i32) {
        let (tx, _) = oneshot::channel();
        self.register(pid, tx);
    }

    /// Routes `pid`'s exit status to `tx` (or at once, if the reaper already saw it).
    pub(super) fn register(&self, pid: i32, tx: oneshot::Sender<rustix::process::WaitStatus>) {
        let mut r = lock(&self.0.reaper);
        match r.early.remove(&pid) {
            Some(st) => {
                let _ = tx.send(st);
            }
            None => {
                r.waiting.insert(pid, tx);
            }
        }
    }
}

/// Whether the spare `pid` a zygote forked with `CLONE_PARENT` is the agent's child, as it
/// must be for its exit to reach the agent's reaper. Checked on the first spare only (the
/// kernel does not change its mind): later ones cost nothing.
fn parent_is_honoured(pid: i32) -> bool {
    use std::sync::atomic::AtomicU8;
    static KNOWN: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 honoured, 2 ignored
    match KNOWN.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces and parentheses).
    let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
    match ppid {
        Some(p) => {
            let honoured = p == std::process::id();
            KNOWN.store(if honoured { 1 } else { 2 }, Ordering::Relaxed);
            honoured
        }
        // Gone already (a command killed it): ask again at the next spare.
        None => true,
    }
}
