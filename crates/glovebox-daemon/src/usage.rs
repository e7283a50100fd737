//! Usage metering: what each sandbox consumed, for bills and quotas.
//!
//! A [`Meter`] lives in each sandbox. CPU time is the sandbox cgroup's own counter (every
//! process of the sandbox, commands and kernels included); memory is sampled (by the
//! manager's sampler, every [`SAMPLE_EVERY`], and once more at the end) and integrated over
//! time; the peak is the kernel's high-water mark where it keeps one, else the highest sample.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use glovebox_jail::cgroup::Stats;
use glovebox_proto::api::{SandboxUsage, TenantUsage, Usage};

use crate::util::rfc3339;

pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

pub struct Meter {
    cpu_base_usec: u64,
    started: SystemTime,
    started_mono: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<(Instant, u64)>,
    byte_seconds: f64,
    peak: u64,
    cpu_usec: u64,
    ended: Option<(SystemTime, Instant)>,
}

impl Meter {
    /// `cpu_base_usec`: the cgroup's CPU counter when the sandbox was handed out.
    pub fn new(started: SystemTime, cpu_base_usec: u64) -> Meter {
        Meter { cpu_base_usec, started, started_mono: Instant::now(), state: Mutex::new(State::default()) }
    }

    /// The meter of a sandbox adopted after a daemon restart: started at `created`, CPU above
    /// `cpu_base_usec` (the cgroup's counter survives the daemon).
    pub fn resumed(created: SystemTime, cpu_base_usec: u64) -> Meter {
        let age = SystemTime::now().duration_since(created).unwrap_or_default();
        let started_mono = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        Meter { cpu_base_usec, started: created, started_mono, state: Mutex::new(State::default()) }
    }

    pub fn cpu_base_usec(&self) -> u64 {
        self.cpu_base_usec
    }

    /// Folds in one reading of the sandbox's cgroup. Memory between two samples counts at
    /// the mean of both (trapezoid), so short spikes between samples are not billed in full
    /// and a steady sandbox is billed exactly.
    pub fn sample(&self, st: &Stats) {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.ended.is_some() {
            return;
        }
        let mem = st.memory_current_bytes;
        if let Some((t, m)) = s.last {
            s.byte_seconds += now.duration_since(t).as_secs_f64() * (m + mem) as f64 / 2.0;
        }
        s.last = Some((now, mem));
        s.peak = s.peak.max(mem).max(st.memory_peak_bytes.unwrap_or(0));
        s.cpu_usec = s.cpu_usec.max(st.cpu_usage_usec);
    }

    /// The last reading before the sandbox's processes are killed; the meter stops here.
    /// Whether [`Meter::finish`] was called (later samples change nothing).
    pub fn ended(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).ended.is_some()
    }

    pub fn finish(&self, st: Option<&Stats>) {
        if let Some(st) = st {
            self.sample(st);
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.ended.is_none() {
            s.ended = Some((SystemTime::now(), Instant::now()));
        }
    }

    pub fn report(&self, sandbox_id: &str, tenant: &str, egress: (u64, u64)) -> SandboxUsage {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let end_mono = s.ended.map(|e| e.1).unwrap_or_else(Instant::now);
        SandboxUsage {
            sandbox_id: sandbox_id.to_string(),
            tenant: tenant.to_string(),
            started_at: rfc3339(self.started),
            ended_at: s.ended.map(|e| rfc3339(e.0)),
            usage: Usage {
                cpu_seconds: s.cpu_usec.saturating_sub(self.cpu_base_usec) as f64 / 1e6,
                memory_gib_seconds: s.byte_seconds / (1u64 << 30) as f64,
                memory_peak_bytes: s.peak,
                wall_seconds: end_mono.duration_since(self.started_mono).as_secs_f64(),
                egress_bytes_up: egress.0,
                egress_bytes_down: egress.1,
            },
        }
    }
}

/// Metered use of ended sandboxes: the most recent ones by id, and running totals per
/// tenant that never forget. (The store keeps them across restarts.) The totals are read
/// from the store when first asked for, not at the start: the store holds one record per
/// sandbox ever ended, and a start (an embedded `glovebox run` is one) must not take longer
/// the more sandboxes have run before it.
#[derive(Default)]
pub struct Ledger {
    inner: Mutex<LedgerInner>,
    store: std::sync::OnceLock<std::sync::Arc<crate::store::Store>>,
}

#[derive(Default)]
struct LedgerInner {
    by_id: std::collections::HashMap<String, SandboxUsage>,
    order: std::collections::VecDeque<String>,
    /// Ended sandboxes' totals per tenant, once read (see [`Ledger::totals`]).
    totals: Option<Totals>,
    /// Records the store did not take (a failed write) while the totals were not read yet.
    unstored: Totals,
}

type Totals = std::collections::BTreeMap<String, (u64, Usage)>;

/// Records kept in memory; older ones are read back from the store.
const LEDGER_MEMORY: usize = 1_000;

impl Ledger {
    /// Writes every later record through to `store`, whose records count in the totals.
    pub fn attach(&self, store: std::sync::Arc<crate::store::Store>) -> crate::error::Result<()> {
        let _ = self.store.set(store);
        Ok(())
    }

    /// The totals, read from the store the first time (every record it holds, those written
    /// since the start included: [`Ledger::record_with`] writes and counts a record under
    /// the same lock, so none is counted twice or missed).
    fn totals<'a>(&self, g: &'a mut LedgerInner) -> &'a mut Totals {
        let mut loaded = std::mem::take(&mut g.unstored);
        if g.totals.is_none() {
            for j in self.stored_reports() {
                match serde_json::from_str::<SandboxUsage>(&j) {
                    Ok(u) => {
                        let t = loaded.entry(u.tenant.clone()).or_default();
                        t.0 += 1;
                        add(&mut t.1, &u.usage);
                    }
                    Err(e) => tracing::warn!("skipping an unreadable usage record: {e}"),
                }
            }
        } else {
            let have = g.totals.take().unwrap_or_default();
            for (tenant, (n, u)) in have {
                let t = loaded.entry(tenant).or_default();
                t.0 += n;
                add(&mut t.1, &u);
            }
        }
        g.totals.insert(loaded)
    }

    fn stored_reports(&self) -> Vec<String> {
        let Some(store) = self.store.get() else { return Vec::new() };
        store
            .with(|c| {
                let mut st = c.prepare("SELECT report FROM usage")?;
                let mut rows = st.query([])?;
                let mut v = Vec::new();
                while let Some(r) = rows.next()? {
                    v.push(r.get::<_, String>(0)?);
                }
                Ok(v)
            })
            .unwrap_or_else(|e| {
                tracing::error!("store: load usage: {e}");
                Vec::new()
            })
    }

    /// A stored record (the sandbox ended, maybe under an earlier daemon).
    fn stored(&self, id: &str) -> Option<SandboxUsage> {
        let store = self.store.get()?;
        let j: Option<String> = store
            .with(|c| {
                use rusqlite::OptionalExtension;
                c.query_row("SELECT report FROM usage WHERE sandbox_id = ?1", [id], |r| r.get(0)).optional()
            })
            .ok()
            .flatten();
        j.and_then(|j| serde_json::from_str(&j).ok())
    }

    pub fn record(&self, u: SandboxUsage) {
        let r = self.record_with(u, |u| match self.store.get() {
            Some(store) => store.with(|c| persist_on(c, u)),
            None => Err(rusqlite::Error::InvalidQuery),
        });
        if let (Err(e), Some(_)) = (r, self.store.get()) {
            tracing::error!("store usage: {e}");
        }
    }

    /// Writes an ended sandbox's usage with `write` (with [`persist_on`], in a transaction of
    /// the caller's that also ends the sandbox, say) and keeps it in memory and in its
    /// tenant's totals. Returns what `write` did.
    pub fn record_with<T>(
        &self,
        u: SandboxUsage,
        write: impl FnOnce(&SandboxUsage) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let written = write(&u);
        let stored = written.is_ok();
        // Unread totals count what the store holds when they are read; a record it did not
        // take waits beside them.
        let totals = match &mut g.totals {
            Some(t) => Some(t),
            None if !stored => Some(&mut g.unstored),
            None => None,
        };
        if let Some(totals) = totals {
            let t = totals.entry(u.tenant.clone()).or_default();
            t.0 += 1;
            add(&mut t.1, &u.usage);
        }
        if g.by_id.insert(u.sandbox_id.clone(), u.clone()).is_none() {
            g.order.push_back(u.sandbox_id);
        }
        while g.order.len() > LEDGER_MEMORY {
            if let Some(old) = g.order.pop_front() {
                g.by_id.remove(&old);
            }
        }
        written
    }

    pub fn get(&self, id: &str) -> Option<SandboxUsage> {
        let hit = self.inner.lock().unwrap_or_else(|p| p.into_inner()).by_id.get(id).cloned();
        hit.or_else(|| self.stored(id))
    }

    /// Totals per tenant (only `tenant` when given): ended sandboxes plus `live` ones.
    pub fn report(&self, tenant: Option<&str>, live: &[SandboxUsage]) -> Vec<TenantUsage> {
        let mut totals = {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            self.totals(&mut g).clone()
        };
        for u in live {
            let t = totals.entry(u.tenant.clone()).or_default();
            t.0 += 1;
            add(&mut t.1, &u.usage);
        }
        if let Some(t) = tenant {
            totals.entry(t.to_string()).or_default();
        }
        totals
            .into_iter()
            .filter(|(t, _)| match tenant {
                Some(want) => want == t,
                None => true,
            })
            .map(|(tenant, (sandboxes, usage))| TenantUsage { tenant, sandboxes, usage })
            .collect()
    }
}

/// Adds one sandbox's use to a total (peaks: the largest single sandbox's).
pub fn add(total: &mut Usage, u: &Usage) {
    total.cpu_seconds += u.cpu_seconds;
    total.memory_gib_seconds += u.memory_gib_seconds;
    total.memory_peak_bytes = total.memory_peak_bytes.max(u.memory_peak_bytes);
    total.wall_seconds += u.wall_seconds;
    total.egress_bytes_up += u.egress_bytes_up;
    total.egress_bytes_down += u.egress_bytes_down;
}

/// Writes an ended sandbox's usage record on `c` (see [`crate::store::Store::transaction`]).
pub fn persist_on(c: &rusqlite::Connection, u: &SandboxUsage) -> rusqlite::Result<()> {
    let j = serde_json::to_string(u).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    c.prepare_cached("INSERT OR REPLACE INTO usage (sandbox_id, tenant, ended_at, report) VALUES (?1, ?2, ?3, ?4)")?
        .execute(rusqlite::params![u.sandbox_id, u.tenant, crate::store::ms(SystemTime::now()), j])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(mem: u64, cpu: u64) -> Stats {
        Stats { memory_current_bytes: mem, memory_peak_bytes: None, cpu_usage_usec: cpu, pids_current: 1, oom_kills: 0 }
    }

    #[test]
    fn integrates_memory_and_keeps_cpu_and_peak() {
        let m = Meter::new(SystemTime::now(), 0);
        m.sample(&stats(1 << 30, 1_000_000));
        std::thread::sleep(Duration::from_millis(200));
        m.sample(&stats(1 << 30, 2_500_000));
        m.finish(Some(&stats(1 << 29, 3_000_000)));
        let r = m.report("s", "t", (10, 20));
        let u = &r.usage;
        assert!((u.cpu_seconds - 3.0).abs() < 1e-9);
        // ≈0.2 s at 1 GiB, plus a few ms of the ramp down.
        assert!(u.memory_gib_seconds > 0.19 && u.memory_gib_seconds < 0.3, "{}", u.memory_gib_seconds);
        assert_eq!(u.memory_peak_bytes, 1 << 30);
        assert!(u.wall_seconds >= 0.2);
        assert_eq!((u.egress_bytes_up, u.egress_bytes_down), (10, 20));
        assert!(r.ended_at.is_some());
        // Finished meters do not move.
        m.sample(&stats(4 << 30, 9_000_000));
        assert_eq!(m.report("s", "t", (0, 0)).usage.cpu_seconds, 3.0);
    }

    fn ended(id: &str, tenant: &str, cpu: f64) -> SandboxUsage {
        SandboxUsage {
            sandbox_id: id.into(),
            tenant: tenant.into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            ended_at: None,
            usage: Usage { cpu_seconds: cpu, ..Default::default() },
        }
    }

    fn totals(l: &Ledger) -> Vec<(String, u64, f64)> {
        l.report(None, &[]).into_iter().map(|t| (t.tenant, t.sandboxes, t.usage.cpu_seconds)).collect()
    }

    /// The totals are read from the store only when asked for, and every record counts once:
    /// those stored before the start, those recorded since (before and after the first
    /// reading), and one the store refused while the totals were unread.
    #[test]
    fn totals_are_read_when_asked_for_and_count_each_record_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(crate::store::Store::open(tmp.path()).unwrap());
        let earlier = Ledger::default();
        earlier.attach(store.clone()).unwrap();
        earlier.record(ended("a", "t1", 1.0));
        earlier.record(ended("b", "t2", 2.0));
        let l = Ledger::default();
        l.attach(store.clone()).unwrap();
        assert!(l.inner.lock().unwrap().totals.is_none(), "nothing read at the start");
        l.record(ended("c", "t1", 4.0));
        let refused = l.record_with(ended("d", "t1", 8.0), |_| Err::<(), _>(rusqlite::Error::InvalidQuery));
        assert!(refused.is_err());
        assert_eq!(totals(&l), vec![("t1".into(), 3, 13.0), ("t2".into(), 1, 2.0)]);
        l.record(ended("e", "t2", 16.0));
        assert_eq!(totals(&l), vec![("t1".into(), 3, 13.0), ("t2".into(), 2, 18.0)]);
        assert_eq!(l.get("c").map(|u| u.usage.cpu_seconds), Some(4.0));
        // A later start reads what the store kept (the refused record is not there).
        let next = Ledger::default();
        next.attach(store).unwrap();
        assert_eq!(totals(&next), vec![("t1".into(), 2, 5.0), ("t2".into(), 2, 18.0)]);
    }

    #[test]
    fn sums_take_the_largest_peak() {
        let mut t = Usage::default();
        add(&mut t, &Usage { cpu_seconds: 1.0, memory_peak_bytes: 5, ..Default::default() });
        add(&mut t, &Usage { cpu_seconds: 2.0, memory_peak_bytes: 3, ..Default::default() });
        assert_eq!(t.cpu_seconds, 3.0);
        assert_eq!(t.memory_peak_bytes, 5);
    }
}
