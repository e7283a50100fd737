//! Leader election, the Kubernetes side: the `coordination.k8s.io/v1` Lease read and written
//! as `lease::Elector` decides, and `run_elected`, which runs the controller only while this
//! replica holds the Lease.
//!
//! Timing (client-go's defaults): a Lease lasts 15 s; the holder renews every 2 s and gives
//! up — stops reconciling, and the process exits for Kubernetes to restart it as a follower
//! — when it has not renewed for 10 s, so it has stopped before another replica may take
//! over (15 s after it last saw the record change). Followers look every 2 s. A leader that
//! stops cleanly (SIGTERM) releases the Lease, and a follower takes it at its next look.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::time::Instant;

use super::Error;
use crate::lease::{Decision, Elector, Held};

/// Where the Lease is, who this replica is, and the timing.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod's name): written as `holderIdentity`.
    pub identity: String,
    /// `leaseDurationSeconds` written on the Lease.
    pub duration: Duration,
    /// The holder gives up when it has not renewed for this long (less than `duration`).
    pub renew_deadline: Duration,
    /// How often the holder renews and followers look.
    pub retry: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s, 10 s, 2 s.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// This replica's role after a look at the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Leader,
    /// Another holds it (named), or a write lost a race.
    Follower(Option<String>),
}

/// One replica's handle on the Lease.
pub struct Leader {
    api: Api<Lease>,
    cfg: LeaseConfig,
    elector: Elector,
}

fn held_of(l: &Lease) -> Held {
    let s = l.spec.clone().unwrap_or_default();
    Held {
        holder: s.holder_identity,
        renew_time: s.renew_time.map(|t| t.0.to_string()),
        acquire_time: s.acquire_time.map(|t| t.0.to_string()),
        duration: s.lease_duration_seconds.and_then(|d| u64::try_from(d).ok()).map(Duration::from_secs),
        transitions: s.lease_transitions.unwrap_or(0),
    }
}

/// A write that lost to another's (409: the record changed since it was read, or was created
/// meanwhile).
fn lost_race(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Leader {
    pub fn new(client: Client, cfg: LeaseConfig) -> Leader {
        let elector = Elector::new(cfg.identity.clone(), cfg.duration);
        Leader { api: Api::namespaced(client, &cfg.namespace), cfg, elector }
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// One look at the Lease at `now`: created, renewed or taken when the decision says so.
    pub async fn step(&mut self, now: Instant) -> Result<Role, Error> {
        let current = self.api.get_opt(&self.cfg.name).await?;
        let decision = self.elector.decide(current.as_ref().map(held_of).as_ref(), now);
        let stamp = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let written = match (decision, current) {
            (Decision::Follow { holder, .. }, _) => return Ok(Role::Follower(Some(holder))),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.cfg.identity.clone()),
                        lease_duration_seconds: Some(self.seconds()),
                        acquire_time: Some(stamp.clone()),
                        renew_time: Some(stamp),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await.map(|_| ())
            }
            (Decision::Renew, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.renew_time = Some(stamp);
                spec.lease_duration_seconds = Some(self.seconds());
                self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await.map(|_| ())
            }
            (Decision::TakeOver, Some(mut lease)) => {
                let transitions = Elector::transitions_after_takeover(&held_of(&lease));
                lease.spec = Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(self.seconds()),
                    acquire_time: Some(stamp.clone()),
                    renew_time: Some(stamp),
                    lease_transitions: Some(transitions),
                    ..LeaseSpec::default()
                });
                self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await.map(|_| ())
            }
            // Renew or take over a Lease that was not there: the elector says Create for
            // that, so this cannot happen; look again.
            (Decision::Renew | Decision::TakeOver, None) => return Ok(Role::Follower(None)),
        };
        match written {
            Ok(()) => Ok(Role::Leader),
            Err(e) if lost_race(&e) => Ok(Role::Follower(None)),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the Lease up (no holder), if this replica still holds it, so a follower takes it
    /// at its next look instead of after the Lease's duration.
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else { return Ok(()) };
        let ours = lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.cfg.identity.as_str());
        if !ours {
            return Ok(());
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(e) if lost_race(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Waits until this replica holds the Lease, then runs `work` while renewing it. Returns
/// `work`'s result when it ends (the Lease released), or `Error::LostLease` as soon as the
/// Lease is another's or could not be renewed for `renew_deadline` — `work` is dropped then,
/// so nothing of it runs on.
pub async fn run_elected<F, W>(client: Client, cfg: LeaseConfig, work: W) -> Result<(), Error>
where
    W: FnOnce() -> F,
    F: Future<Output = Result<(), Error>>,
{
    let mut leader = Leader::new(client, cfg.clone());
    // Follow until the Lease is ours.
    let mut said = None;
    loop {
        let look = tokio::time::timeout(cfg.renew_deadline, leader.step(Instant::now())).await;
        match look {
            Ok(Ok(Role::Leader)) => break,
            Ok(Ok(Role::Follower(holder))) => {
                if holder.is_some() && holder != said {
                    tracing::info!(holder = holder.as_deref().unwrap_or(""), "following the leader");
                    said = holder;
                }
            }
            Ok(Err(e)) => tracing::warn!("lease {}/{}: {e}", cfg.namespace, cfg.name),
            Err(_) => tracing::warn!("lease {}/{}: no answer in {:?}", cfg.namespace, cfg.name, cfg.renew_deadline),
        }
        tokio::time::sleep(cfg.retry).await;
    }
    tracing::info!(identity = %cfg.identity, "leading: reconciling claims");
    let renewals = async {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(cfg.retry).await;
            let left = (renewed + cfg.renew_deadline).saturating_duration_since(Instant::now());
            let why = match tokio::time::timeout(left, leader.step(Instant::now())).await {
                Ok(Ok(Role::Leader)) => {
                    renewed = Instant::now();
                    continue;
                }
                Ok(Ok(Role::Follower(holder))) => {
                    format!("the lease is held by {}", holder.as_deref().unwrap_or("another replica"))
                }
                Ok(Err(e)) if Instant::now() < renewed + cfg.renew_deadline => {
                    tracing::warn!("renewing the lease: {e}");
                    continue;
                }
                Ok(Err(e)) => format!("not renewed for {:?}: {e}", cfg.renew_deadline),
                Err(_) => format!("not renewed for {:?}", cfg.renew_deadline),
            };
            return why;
        }
    };
    let outcome = tokio::select! {
        r = work() => Ok(r),
        why = renewals => Err(why),
    };
    match outcome {
        Ok(r) => {
            if let Err(e) = leader.release().await {
                tracing::warn!("releasing the lease: {e}");
            }
            r
        }
        Err(why) => Err(Error::LostLease(why)),
    }
}
