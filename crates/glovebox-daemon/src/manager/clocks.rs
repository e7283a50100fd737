//! The clocks of a live sandbox: its lifetime deadline, its idle timeout (which kills or
//! pauses it), and the watch on its agent's death, one task per sandbox; and the usage
//! sampler over all of them. A paused sandbox's two clocks are stopped (see `pause`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use glovebox_proto::api::{self, EndReason, OnIdle};

use super::record::Deadline;
use super::{Manager, Sb};
use crate::error::{Error, Result};
use crate::util::lock;

impl Manager {
    /// The lifetime clock, the idle clock and the agent-death watch of one sandbox.
    pub(crate) fn watch(self: &Arc<Self>, sb: Arc<Sb>) {
        let this = self.clone();
        tokio::spawn(async move {
            let exit = sb.host.exit_fd().and_then(|fd| {
                // `new` is deprecated for fds whose owner could close them underneath the
                // reactor; this one is an OwnedFd moved in, so that cannot happen.
                #[allow(deprecated)]
                let r = tokio::io::unix::AsyncFd::new(fd).ok();
                r
            });
            let died = async {
                match &exit {
                    Some(fd) => {
                        let _ = fd.readable().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::pin!(died);
            loop {
                let paused = sb.clock.paused().is_some();
                let deadline = (!paused).then(|| sb.deadline().at);
                let lifetime = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                // The idle check: at the end of the idle period since the last activity
                // (or a second from now while something is busy).
                let idle_at = sb.idle_timeout().filter(|_| !paused).map(|t| {
                    let at = sb.activity.last() + t;
                    if sb.activity.busy() {
                        at.max(Instant::now() + Duration::from_secs(1))
                    } else {
                        at
                    }
                });
                let idle_check = async {
                    match idle_at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = lifetime => {
                        if sb.clock.paused().is_none() && Instant::now() >= sb.deadline().at {
                            this.destroy(&sb.id, EndReason::Timeout).await;
                            return;
                        }
                    }
                    _ = idle_check => {
                        let Some(t) = sb.idle_timeout() else { continue };
                        if sb.activity.busy() || sb.activity.last().elapsed() < t {
                            continue;
                        }
                        if commands_running(&sb).await {
                            sb.activity.touch();
                            continue;
                        }
                        if sb.activity.busy() || sb.activity.last().elapsed() < t {
                            continue; // a request came in while we asked
                        }
                        if sb.on_idle == OnIdle::Pause {
                            if let Err(e) = this.pause_sb(&sb) {
                                tracing::warn!(sandbox = %sb.id, "idle pause: {e}");
                                sb.activity.touch();
                            }
                            continue;
                        }
                        this.destroy(&sb.id, EndReason::Idle).await;
                        return;
                    }
                    _ = sb.clock.wake.notified() => {
                        if let Some(&reason) = sb.clock.ended.get() {
                            tracing::warn!(sandbox = %sb.id, reason = reason.as_str(), "sandbox processes gone");
                            this.destroy(&sb.id, reason).await;
                            return;
                        }
                    }
                    _ = &mut died => {
                        if this.registry.live(&sb.id).is_none() {
                            return; // destroyed on purpose; the exit was ours
                        }
                        let reason = sb.clock.end(if sb.oom_kills() > 0 { EndReason::Oom } else { EndReason::Error });
                        tracing::warn!(sandbox = %sb.id, reason = reason.as_str(), "sandbox agent exited");
                        this.destroy(&sb.id, reason).await;
                        return;
                    }
                }
            }
        });
    }

    /// Moves the lifetime deadline to `timeout_s` from now (from the resume, when paused).
    pub fn set_timeout(&self, id: &str, timeout_s: u64) -> Result<Arc<Sb>> {
        if timeout_s == 0 || timeout_s > api::MAX_TIMEOUT_S {
            return Err(Error::Invalid(format!("timeout_s must be between 1 and {}", api::MAX_TIMEOUT_S)));
        }
        let sb = self.get(id)?;
        let life = Duration::from_secs(timeout_s);
        {
            // Paused: the clock starts with this much at resume.
            let mut paused = lock(&sb.clock.paused);
            match paused.as_mut() {
                Some(left) => *left = life,
                None => *lock(&sb.clock.deadline) = Deadline::after(life),
            }
        }
        sb.clock.wake.notify_one();
        self.store_clock(&sb);
        Ok(sb)
    }

    /// Samples every live sandbox's cgroup for the usage meters.
    pub(super) fn spawn_sampler(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::usage::SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for n in 0u64.. {
                tick.tick().await;
                if n % 5 == 4 {
                    // Gives freed heap pages back to the kernel. A long-running daemon's heap
                    // is fragmented by bursts (thousands of sandboxes' bookkeeping freed at
                    // once); without this its RSS stays at the burst's high-water mark.
                    glovebox_jail::sys::trim_heap();
                }
                let Some(m) = weak.upgrade() else { return };
                let live = m.registry.all();
                drop(m);
                // Five cgroup files per sandbox, thousands of reads with a thousand live: on
                // a thread of the blocking pool, not on a worker the requests run on.
                let swept = tokio::task::spawn_blocking(move || {
                    for sb in live {
                        if let Some(st) = sb.stats() {
                            sb.meter.sample(&st);
                        }
                    }
                });
                if let Err(e) = swept.await {
                    tracing::debug!("usage sampler: {e}");
                }
            }
        });
    }
}

/// Whether any command other than a language kernel runs in the sandbox (asked of its
/// agent; an agent that does not answer counts as busy, the death watch handles a dead one).
async fn commands_running(sb: &Sb) -> bool {
    use glovebox_proto::agent::Command;
    match sb.agent().list().await {
        Ok(commands) => commands.iter().any(|c| {
            let kernel = match &c.cmd {
                Command::Argv(v) => v.iter().any(|a| a.starts_with(crate::kernels::KERNEL_DIR)),
                Command::Shell(s) => s.contains(crate::kernels::KERNEL_DIR),
            };
            c.running && !kernel
        }),
        Err(_) => true,
    }
}
