//! The host-side secret store that brokered headers reference (`${secret:NAME}`).
//!
//! Invariants:
//! - values are write-only: nothing here returns a value except `get`, which only the egress
//!   proxy calls (to build a header for an upstream request); `SecretValue`'s `Debug` shows no
//!   value, so a stray `{:?}` in a log cannot leak one;
//! - secrets are keyed by owner (the tenant of the API key that wrote them; sandboxes of a
//!   tenant reference only that tenant's secrets) and name;
//! - the file is `<data_dir>/secrets.json`, mode 0600, replaced atomically (write a temp file
//!   with 0600 from the start, fsync, rename), so a crash leaves the old or the new set.
//!
//! The interface (`put`, `get`, `list`, `delete` by owner and name) is what a database-backed
//! store would offer; callers do not see the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use glovebox_proto::api::SecretInfo;
use glovebox_proto::policy::{valid_header_value, valid_secret_name};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest value accepted (a header value must fit in a request head).
pub const MAX_VALUE: usize = 8192;
const MAX_SECRETS: usize = 1024;

#[derive(Debug, Error)]
pub enum SecretError {
    #[error("{0:?} is not a valid secret name (1-64 of A-Z a-z 0-9 _ . -, starting with a letter or _)")]
    BadName(String),
    #[error("secret value must be 1-{MAX_VALUE} bytes without control characters (CR, LF, NUL, …)")]
    BadValue,
    #[error("secret {0:?} not found")]
    NotFound(String),
    #[error("at most {MAX_SECRETS} secrets")]
    Full,
    #[error("secret store {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

/// A secret's value; `Debug` never shows it.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

#[derive(Clone, Serialize, Deserialize)]
struct Entry {
    value: SecretValue,
    created_at: String,
    updated_at: String,
}

/// On disk: owner -> name -> entry.
type Table = BTreeMap<String, BTreeMap<String, Entry>>;

pub struct SecretStore {
    path: Option<PathBuf>,
    table: Mutex<Table>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SecretStore {
    /// The store persisted at `<data_dir>/secrets.json` (loaded if present).
    pub fn open(data_dir: &std::path::Path) -> Result<SecretStore, SecretError> {
        let path = data_dir.join("secrets.json");
        let io = |err| SecretError::Io { path: path.clone(), err };
        let table = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| io(std::io::Error::other(e.to_string())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::new(),
            Err(e) => return Err(io(e)),
        };
        Ok(SecretStore { path: Some(path), table: Mutex::new(table) })
    }

    /// A store that lives only in memory (tests, embedded runs).
    pub fn in_memory() -> SecretStore {
        SecretStore { path: None, table: Mutex::new(Table::new()) }
    }

    fn save(&self, t: &Table) -> Result<(), SecretError> {
        let Some(path) = &self.path else { return Ok(()) };
        let tmp = path.with_extension("json.tmp");
        let io = |err| SecretError::Io { path: tmp.clone(), err };
        let bytes = serde_json::to_vec(t).map_err(|e| io(std::io::Error::other(e.to_string())))?;
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
        f.write_all(&bytes).and_then(|_| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|err| SecretError::Io { path: path.clone(), err })
    }

    /// Creates or replaces a secret. Returns whether it was new.
    pub fn put(&self, owner: &str, name: &str, value: &str) -> Result<bool, SecretError> {
        if !valid_secret_name(name) {
            return Err(SecretError::BadName(name.to_string()));
        }
        if value.is_empty() || value.len() > MAX_VALUE || !valid_header_value(value) {
            return Err(SecretError::BadValue);
        }
        let now = crate::util::rfc3339(SystemTime::now());
        let mut t = lock(&self.table);
        let mut next = t.clone();
        let owned = next.entry(owner.to_string()).or_default();
        let created = match owned.get(name) {
            Some(e) => e.created_at.clone(),
            None if owned.len() >= MAX_SECRETS => return Err(SecretError::Full),
            None => now.clone(),
        };
        let new = !owned.contains_key(name);
        owned.insert(
            name.to_string(),
            Entry { value: SecretValue(value.to_string()), created_at: created, updated_at: now },
        );
        self.save(&next)?;
        *t = next;
        Ok(new)
    }

    /// The value, for the egress proxy only.
    pub fn get(&self, owner: &str, name: &str) -> Option<SecretValue> {
        lock(&self.table).get(owner)?.get(name).map(|e| e.value.clone())
    }

    pub fn info(&self, owner: &str, name: &str) -> Result<SecretInfo, SecretError> {
        if !valid_secret_name(name) {
            return Err(SecretError::BadName(name.to_string()));
        }
        let t = lock(&self.table);
        let e = t.get(owner).and_then(|o| o.get(name)).ok_or_else(|| SecretError::NotFound(name.to_string()))?;
        Ok(SecretInfo { name: name.to_string(), created_at: e.created_at.clone(), updated_at: e.updated_at.clone() })
    }

    /// Names and dates (never values), by name.
    pub fn list(&self, owner: &str) -> Vec<SecretInfo> {
        lock(&self.table)
            .get(owner)
            .map(|o| {
                o.iter()
                    .map(|(n, e)| SecretInfo {
                        name: n.clone(),
                        created_at: e.created_at.clone(),
                        updated_at: e.updated_at.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn delete(&self, owner: &str, name: &str) -> Result<(), SecretError> {
        if !valid_secret_name(name) {
            return Err(SecretError::BadName(name.to_string()));
        }
        let mut t = lock(&self.table);
        let mut next = t.clone();
        let gone = next.get_mut(owner).and_then(|o| o.remove(name));
        if gone.is_none() {
            return Err(SecretError::NotFound(name.to_string()));
        }
        self.save(&next)?;
        *t = next;
        Ok(())
    }
}

impl From<SecretError> for crate::error::Error {
    fn from(e: SecretError) -> Self {
        match e {
            SecretError::BadName(_) | SecretError::BadValue => crate::error::Error::Invalid(e.to_string()),
            SecretError::NotFound(n) => crate::error::Error::NotFound { what: "secret", name: n },
            SecretError::Full => crate::error::Error::Conflict(e.to_string()),
            SecretError::Io { .. } => crate::error::Error::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn store_is_write_only_persistent_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let s = SecretStore::open(dir.path()).unwrap();
        assert!(s.put("default", "tok", "s3cr3t-value").unwrap());
        assert!(!s.put("default", "tok", "s3cr3t-value-2").unwrap(), "replaced, not new");
        assert!(matches!(s.put("default", "bad name", "x"), Err(SecretError::BadName(_))));
        assert!(matches!(s.put("default", "ok", "a\r\nb"), Err(SecretError::BadValue)));
        assert!(matches!(s.put("default", "ok", ""), Err(SecretError::BadValue)));
        assert_eq!(s.get("default", "tok").unwrap().expose(), "s3cr3t-value-2");
        assert!(s.get("other", "tok").is_none(), "owners are separate");
        let listed = serde_json::to_string(&s.list("default")).unwrap();
        assert!(listed.contains("\"tok\"") && !listed.contains("s3cr3t"), "{listed}");
        assert!(!format!("{:?}", s.get("default", "tok")).contains("s3cr3t"));
        let path = dir.path().join("secrets.json");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = SecretStore::open(dir.path()).unwrap();
        assert_eq!(again.get("default", "tok").unwrap().expose(), "s3cr3t-value-2");
        again.delete("default", "tok").unwrap();
        assert!(matches!(again.delete("default", "tok"), Err(SecretError::NotFound(_))));
        assert!(SecretStore::open(dir.path()).unwrap().list("default").is_empty());
    }
}
