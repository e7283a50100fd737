//! Tenants, API keys and quotas.
//!
//! Every API key belongs to one tenant; a tenant sees and touches only its own sandboxes
//! (and secrets). The daemon's own key (`<data_dir>/api-key`, or `--api-key`) is the admin
//! key: it belongs to the `default` tenant, manages keys and quotas, and sees every sandbox.
//!
//! Keys are stored as SHA-256 digests only: a key is 160 random bits (`e2b_` and 40 hex
//! digits, the shape E2B's SDKs accept), so a fast hash is enough and the plain key is shown once, when it is created.
//!
//! Quotas are checked at admission: [`Tenants::admit`] reserves the sandbox's share (count,
//! memory, CPUs, one create in the rate window) before the boot and [`Admission`] gives it
//! back if the create fails; a destroyed sandbox releases its share in [`Tenants::release`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use glovebox_proto::api::{ApiKeyInfo, Limits, TenantQuota};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::util::{constant_time_eq, random_key, random_token, rfc3339, KEY_PREFIX};

pub const DEFAULT_TENANT: &str = "default";
/// How many ended sandboxes' owners are remembered in memory (the store keeps the rest).
const ENDED_MEMORY: usize = 1_000;

/// Who is calling: resolved from the API key by the auth middleware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub admin: bool,
}

impl Caller {
    pub fn admin() -> Caller {
        Caller { tenant: DEFAULT_TENANT.into(), admin: true }
    }

    /// Whether this caller may see and touch something owned by `tenant`.
    pub fn may_access(&self, tenant: &str) -> bool {
        self.admin || self.tenant == tenant
    }
}

/// What a [`KeyStore`] holds: keys by digest (hex), quotas by tenant.
pub struct Saved {
    pub keys: Vec<(String, ApiKeyInfo)>,
    pub quotas: Vec<(String, TenantQuota)>,
}

/// Persistence of keys and quotas (the SQLite store implements it; tests use none).
pub trait KeyStore: Send + Sync {
    fn load(&self) -> Result<Saved>;
    fn put_key(&self, digest_hex: &str, info: &ApiKeyInfo) -> Result<()>;
    fn revoke_key(&self, id: &str, at: &str) -> Result<()>;
    fn put_quota(&self, tenant: &str, q: &TenantQuota) -> Result<()>;
}

#[derive(Default)]
struct InUse {
    sandboxes: u32,
    memory_mb: u64,
    cpus: f64,
    creates: VecDeque<Instant>,
}

pub struct Tenants {
    admin_digest: RwLock<Option<[u8; 32]>>,
    /// Digest (hex) → key. Revoked keys stay listed but never authenticate.
    keys: RwLock<HashMap<String, ApiKeyInfo>>,
    quotas: RwLock<HashMap<String, TenantQuota>>,
    in_use: Mutex<HashMap<String, InUse>>,
    ended: Mutex<(HashMap<String, String>, VecDeque<String>)>,
    store: RwLock<Option<Arc<dyn KeyStore>>>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tenant names: 1–64 of `[a-z0-9_-]`, starting with a letter or digit.
pub fn check_tenant_name(t: &str) -> Result<()> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && t.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "tenant name {t:?} is invalid: use 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter or digit"
        )))
    }
}

impl Default for Tenants {
    fn default() -> Self {
        Tenants::new()
    }
}

impl Tenants {
    pub fn new() -> Tenants {
        Tenants {
            admin_digest: RwLock::new(None),
            keys: RwLock::new(HashMap::new()),
            quotas: RwLock::new(HashMap::new()),
            in_use: Mutex::new(HashMap::new()),
            ended: Mutex::new((HashMap::new(), VecDeque::new())),
            store: RwLock::new(None),
        }
    }

    /// Loads keys and quotas from `store` and writes later changes through to it.
    pub fn attach_store(&self, store: Arc<dyn KeyStore>) -> Result<()> {
        let saved = store.load()?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = saved.keys.into_iter().collect();
        *self.quotas.write().unwrap_or_else(|p| p.into_inner()) = saved.quotas.into_iter().collect();
        *self.store.write().unwrap_or_else(|p| p.into_inner()) = Some(store);
        Ok(())
    }

    fn store(&self) -> Option<Arc<dyn KeyStore>> {
        self.store.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_admin_key(&self, key: &str) {
        *self.admin_digest.write().unwrap_or_else(|p| p.into_inner()) = Some(digest(key.trim()));
    }

    /// The caller a presented key stands for, if any.
    pub fn authenticate(&self, key: &str) -> Option<Caller> {
        let d = digest(key.trim());
        if let Some(admin) = *self.admin_digest.read().unwrap_or_else(|p| p.into_inner()) {
            if constant_time_eq(&d, &admin) {
                return Some(Caller::admin());
            }
        }
        // The map is keyed by the digest of a high-entropy secret: looking it up reveals
        // nothing an attacker could use to guess a key.
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let k = keys.get(&hex(&d))?;
        if k.revoked_at.is_some() {
            return None;
        }
        Some(Caller { tenant: k.tenant.clone(), admin: false })
    }

    /// Makes a key for `tenant`; the plain key is in the answer and nowhere else.
    pub fn create_key(&self, tenant: &str, name: Option<String>) -> Result<(String, ApiKeyInfo)> {
        check_tenant_name(tenant)?;
        if let Some(n) = &name {
            if n.len() > 128 || n.chars().any(char::is_control) {
                return Err(Error::Invalid("key name must be at most 128 printable characters".into()));
            }
        }
        let key = random_key();
        let info = ApiKeyInfo {
            id: format!("key_{}", random_token(12)),
            tenant: tenant.to_string(),
            name,
            prefix: key[..KEY_PREFIX.len() + 6].to_string(),
            created_at: rfc3339(SystemTime::now()),
            revoked_at: None,
        };
        let dh = hex(&digest(&key));
        if let Some(s) = self.store() {
            s.put_key(&dh, &info)?;
        }
        self.keys.write().unwrap_or_else(|p| p.into_inner()).insert(dh, info.clone());
        Ok((key, info))
    }

    pub fn list_keys(&self) -> Vec<ApiKeyInfo> {
        let mut v: Vec<ApiKeyInfo> = self.keys.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Revokes a key by id: it stops authenticating at once.
    pub fn revoke_key(&self, id: &str) -> Result<ApiKeyInfo> {
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let k = keys
            .values_mut()
            .find(|k| k.id == id)
            .ok_or_else(|| Error::NotFound { what: "key", name: id.to_string() })?;
        if k.revoked_at.is_none() {
            let at = rfc3339(SystemTime::now());
            if let Some(s) = self.store() {
                s.revoke_key(id, &at)?;
            }
            k.revoked_at = Some(at);
        }
        Ok(k.clone())
    }

    pub fn quota(&self, tenant: &str) -> TenantQuota {
        self.quotas.read().unwrap_or_else(|p| p.into_inner()).get(tenant).cloned().unwrap_or_default()
    }

    pub fn set_quota(&self, tenant: &str, q: TenantQuota) -> Result<TenantQuota> {
        check_tenant_name(tenant)?;
        if let Some(c) = q.max_cpus {
            if !(c.is_finite() && c > 0.0) {
                return Err(Error::Invalid("max_cpus must be a positive number".into()));
            }
        }
        if let Some(s) = self.store() {
            s.put_quota(tenant, &q)?;
        }
        self.quotas.write().unwrap_or_else(|p| p.into_inner()).insert(tenant.to_string(), q.clone());
        Ok(q)
    }

    /// Reserves one sandbox with `limits` for `tenant`, or says which quota it would break.
    pub fn admit(self: &Arc<Self>, tenant: &str, limits: &Limits) -> Result<Admission> {
        let q = self.quota(tenant);
        let mut all = lock(&self.in_use);
        let u = all.entry(tenant.to_string()).or_default();
        let now = Instant::now();
        while u.creates.front().is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60)) {
            u.creates.pop_front();
        }
        if let Some(n) = q.max_sandboxes {
            if u.sandboxes >= n {
                return Err(Error::Quota(format!(
                    "quota exceeded: tenant {tenant:?} may run at most {n} concurrent sandboxes (running: {})",
                    u.sandboxes
                )));
            }
        }
        if let Some(m) = q.max_memory_mb {
            if u.memory_mb + limits.memory_mb > m {
                return Err(Error::Quota(format!(
                    "quota exceeded: tenant {tenant:?} may use at most {m} MiB of sandbox memory in total \
                     (in use: {} MiB, requested: {} MiB)",
                    u.memory_mb, limits.memory_mb
                )));
            }
        }
        if let Some(c) = q.max_cpus {
            if u.cpus + limits.cpus > c + 1e-9 {
                return Err(Error::Quota(format!(
                    "quota exceeded: tenant {tenant:?} may use at most {c} CPUs in total (in use: {}, requested: {})",
                    u.cpus, limits.cpus
                )));
            }
        }
        if let Some(r) = q.creates_per_minute {
            if u.creates.len() as u32 >= r {
                return Err(Error::Quota(format!(
                    "quota exceeded: tenant {tenant:?} may create at most {r} sandboxes per minute"
                )));
            }
        }
        u.sandboxes += 1;
        u.memory_mb += limits.memory_mb;
        u.cpus += limits.cpus;
        u.creates.push_back(now);
        Ok(Admission { tenants: self.clone(), tenant: tenant.to_string(), limits: limits.clone(), armed: true })
    }

    /// Counts a sandbox re-adopted after a daemon restart (no checks: it was admitted).
    pub fn count_adopted(&self, tenant: &str, limits: &Limits) {
        let mut all = lock(&self.in_use);
        let u = all.entry(tenant.to_string()).or_default();
        u.sandboxes += 1;
        u.memory_mb += limits.memory_mb;
        u.cpus += limits.cpus;
    }

    /// Gives back the share of a sandbox that ended.
    pub fn release(&self, tenant: &str, limits: &Limits) {
        let mut all = lock(&self.in_use);
        if let Some(u) = all.get_mut(tenant) {
            u.sandboxes = u.sandboxes.saturating_sub(1);
            u.memory_mb = u.memory_mb.saturating_sub(limits.memory_mb);
            u.cpus = (u.cpus - limits.cpus).max(0.0);
        }
    }

    /// Records the owner of an ended sandbox (ownership checks of later calls, which answer
    /// 410 to the owner and 404 to everyone else).
    pub fn ended(&self, id: &str, tenant: &str) {
        let mut g = lock(&self.ended);
        let (map, order) = &mut *g;
        if map.insert(id.to_string(), tenant.to_string()).is_none() {
            order.push_back(id.to_string());
        }
        while order.len() > ENDED_MEMORY {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    pub fn ended_owner(&self, id: &str) -> Option<String> {
        lock(&self.ended).0.get(id).cloned()
    }
}

/// A reserved quota share: released on drop unless [`Admission::commit`]ted (the sandbox
/// then holds it until it is destroyed).
pub struct Admission {
    tenants: Arc<Tenants>,
    tenant: String,
    limits: Limits,
    armed: bool,
}

impl Admission {
    pub fn commit(mut self) {
        self.armed = false;
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.armed {
            self.tenants.release(&self.tenant, &self.limits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(mem: u64, cpus: f64) -> Limits {
        Limits { cpus, memory_mb: mem, disk_mb: 64, pids: 64 }
    }

    #[test]
    fn admin_and_tenant_keys_authenticate_and_revocation_is_immediate() {
        let t = Tenants::new();
        t.set_admin_key("the-admin-key");
        assert_eq!(t.authenticate("the-admin-key"), Some(Caller::admin()));
        assert_eq!(t.authenticate("the-admin-kez"), None);
        let (key, info) = t.create_key("acme", Some("ci".into())).unwrap();
        assert!(key.starts_with(KEY_PREFIX) && key.len() == KEY_PREFIX.len() + 40);
        // The shape E2B's SDKs check before they send a request.
        assert!(key[KEY_PREFIX.len()..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(key, t.create_key("acme", None).unwrap().0);
        assert!(key.starts_with(&info.prefix));
        assert_eq!(t.authenticate(&key), Some(Caller { tenant: "acme".into(), admin: false }));
        t.revoke_key(&info.id).unwrap();
        assert_eq!(t.authenticate(&key), None);
        assert!(t.list_keys().iter().find(|k| k.id == info.id).unwrap().revoked_at.is_some());
        assert!(matches!(t.revoke_key("key_nope"), Err(Error::NotFound { .. })));
        // Only the digest is kept.
        let keys = t.keys.read().unwrap();
        assert!(keys.keys().all(|k| k.len() == 64 && !k.contains(&key)));
    }

    #[test]
    fn bad_tenant_names_are_refused() {
        for bad in ["", "A", "-x", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_tenant_name(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "acme-1", "team_x", "0"] {
            check_tenant_name(good).unwrap();
        }
    }

    #[test]
    fn quotas_count_reservations_and_release_them() {
        let t = Arc::new(Tenants::new());
        t.set_quota("a", TenantQuota { max_sandboxes: Some(2), max_memory_mb: Some(300), ..Default::default() })
            .unwrap();
        let a1 = t.admit("a", &limits(128, 1.0)).unwrap();
        a1.commit();
        let a2 = t.admit("a", &limits(128, 1.0)).unwrap();
        // Memory: 128 + 128 + 128 > 300; count: 2 reserved.
        let e = t.admit("a", &limits(16, 1.0)).err().unwrap();
        assert!(e.to_string().contains("at most 2 concurrent"), "{e}");
        drop(a2); // a failed create gives its share back
        let e = t.admit("a", &limits(256, 1.0)).err().unwrap();
        assert!(e.to_string().contains("300 MiB"), "{e}");
        t.admit("a", &limits(128, 1.0)).unwrap().commit();
        t.release("a", &limits(128, 1.0));
        t.admit("a", &limits(128, 1.0)).unwrap().commit();
        // Other tenants are unaffected.
        for _ in 0..5 {
            t.admit("b", &limits(1024, 4.0)).unwrap().commit();
        }
    }

    #[test]
    fn create_rate_and_cpu_quotas() {
        let t = Arc::new(Tenants::new());
        t.set_quota("r", TenantQuota { creates_per_minute: Some(3), ..Default::default() }).unwrap();
        for _ in 0..3 {
            let a = t.admit("r", &limits(64, 0.5)).unwrap();
            drop(a); // even failed creates count against the rate
        }
        let e = t.admit("r", &limits(64, 0.5)).err().unwrap();
        assert!(e.to_string().contains("3 sandboxes per minute"), "{e}");
        t.set_quota("c", TenantQuota { max_cpus: Some(1.5), ..Default::default() }).unwrap();
        t.admit("c", &limits(64, 1.0)).unwrap().commit();
        assert!(t.admit("c", &limits(64, 1.0)).is_err());
        t.admit("c", &limits(64, 0.5)).unwrap().commit();
        assert!(t.set_quota("c", TenantQuota { max_cpus: Some(f64::NAN), ..Default::default() }).is_err());
    }
}

// --- persistence in the daemon's SQLite store (migration 2) -------------------------------

fn stored<T>(what: &str) -> impl FnOnce(T) -> Error + '_
where
    T: std::fmt::Display,
{
    move |e| Error::Internal(format!("store: {what}: {e}"))
}

impl KeyStore for crate::store::Store {
    fn load(&self) -> Result<Saved> {
        let rows = self
            .with(|c| {
                let mut keys = Vec::new();
                let mut st = c.prepare("SELECT digest, info FROM api_keys")?;
                let mut rows = st.query([])?;
                while let Some(r) = rows.next()? {
                    keys.push((r.get::<_, String>(0)?, r.get::<_, String>(1)?));
                }
                let mut quotas = Vec::new();
                let mut st = c.prepare("SELECT tenant, quota FROM quotas")?;
                let mut rows = st.query([])?;
                while let Some(r) = rows.next()? {
                    quotas.push((r.get::<_, String>(0)?, r.get::<_, String>(1)?));
                }
                Ok((keys, quotas))
            })
            .map_err(stored("load keys"))?;
        let keys = rows
            .0
            .into_iter()
            .map(|(d, j)| serde_json::from_str(&j).map(|k| (d, k)))
            .collect::<std::result::Result<_, _>>()
            .map_err(stored("decode key"))?;
        let quotas = rows
            .1
            .into_iter()
            .map(|(t, j)| serde_json::from_str(&j).map(|q| (t, q)))
            .collect::<std::result::Result<_, _>>()
            .map_err(stored("decode quota"))?;
        Ok(Saved { keys, quotas })
    }

    fn put_key(&self, digest_hex: &str, info: &ApiKeyInfo) -> Result<()> {
        let j = serde_json::to_string(info).map_err(stored("encode key"))?;
        self.with(|c| {
            c.execute(
                "INSERT INTO api_keys (digest, id, tenant, info) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![digest_hex, info.id, info.tenant, j],
            )
        })
        .map(drop)
        .map_err(stored("save key"))
    }

    fn revoke_key(&self, id: &str, at: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE api_keys SET info = json_set(info, '$.revoked_at', ?2) WHERE id = ?1",
                rusqlite::params![id, at],
            )
        })
        .map(drop)
        .map_err(stored("revoke key"))
    }

    fn put_quota(&self, tenant: &str, q: &TenantQuota) -> Result<()> {
        let j = serde_json::to_string(q).map_err(stored("encode quota"))?;
        self.with(|c| {
            c.execute(
                "INSERT INTO quotas (tenant, quota) VALUES (?1, ?2) \
                 ON CONFLICT(tenant) DO UPDATE SET quota = excluded.quota",
                rusqlite::params![tenant, j],
            )
        })
        .map(drop)
        .map_err(stored("save quota"))
    }
}

#[cfg(test)]
mod store_tests {
    use super::*;

    #[test]
    fn keys_and_quotas_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let key;
        {
            let t = Tenants::new();
            t.attach_store(Arc::new(crate::store::Store::open(dir.path()).unwrap())).unwrap();
            let (k, info) = t.create_key("acme", None).unwrap();
            key = k;
            let (k2, info2) = t.create_key("acme", None).unwrap();
            t.revoke_key(&info2.id).unwrap();
            assert!(t.authenticate(&k2).is_none());
            t.set_quota("acme", TenantQuota { max_sandboxes: Some(3), ..Default::default() }).unwrap();
            t.set_quota("acme", TenantQuota { max_sandboxes: Some(4), ..Default::default() }).unwrap();
            assert_eq!(t.authenticate(&key).unwrap().tenant, "acme");
            let _ = info;
        }
        let t = Tenants::new();
        let store = Arc::new(crate::store::Store::open(dir.path()).unwrap());
        t.attach_store(store.clone()).unwrap();
        assert_eq!(t.authenticate(&key), Some(Caller { tenant: "acme".into(), admin: false }));
        let listed = t.list_keys();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed.iter().filter(|k| k.revoked_at.is_some()).count(), 1);
        assert_eq!(t.quota("acme").max_sandboxes, Some(4));
        // Nothing in the file is the key itself.
        let raw = std::fs::read(dir.path().join("glovebox.db")).unwrap_or_default();
        let wal = std::fs::read(dir.path().join("glovebox.db-wal")).unwrap_or_default();
        for bytes in [raw, wal] {
            assert!(!bytes.windows(key.len()).any(|w| w == key.as_bytes()), "plain key found in the store");
        }
    }
}
