//! The config file of `glovebox serve` (`/etc/glovebox/config.toml` by default).
//!
//! Every setting comes from, in this order: its flag, its environment variable, the file,
//! the built-in default. clap knows the first two and the last; the file fills a setting
//! only when clap says its value is the built-in default. Unknown keys and bad values are
//! errors naming the file and the key: a typo must not silently leave a default in place.

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::ArgMatches;
use glovebox_proto::api;

/// The file `serve` reads when neither `--config` nor `GLOVEBOX_CONFIG` names one; its
/// absence is fine.
pub const DEFAULT_PATH: &str = "/etc/glovebox/config.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config {path}: not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config {path}: unknown key `{key}`")]
    UnknownKey { path: PathBuf, key: String },
    #[error("config {path}: key `{key}`: {want}")]
    BadValue { path: PathBuf, key: String, want: String },
}

/// What a config file may set; `None` leaves the setting to the flag, env or default.
#[derive(Debug, Default, PartialEq)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub router_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub api_key: Option<String>,
    pub warm_pool: Option<usize>,
    pub link_pool: Option<usize>,
    pub destroy_on_exit: Option<bool>,
    pub code_zygote: Option<bool>,
    pub cgroup_favor_dynmods: Option<bool>,
    pub retention_s: Option<u64>,
    pub preview_domain: Option<String>,
    /// The isolation of creates that name none (and whose template names none).
    pub default_isolation: Option<api::Isolation>,
    /// `[limits]`: what a sandbox gets when its create request names no limit.
    pub limits: LimitsConfig,
}

#[derive(Debug, Default, PartialEq)]
pub struct LimitsConfig {
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    pub pids: Option<u64>,
}

impl LimitsConfig {
    /// The daemon's default limits with the file's values over the built-in ones.
    pub fn over(&self, base: api::Limits) -> api::Limits {
        api::Limits {
            cpus: self.cpus.unwrap_or(base.cpus),
            memory_mb: self.memory_mb.unwrap_or(base.memory_mb),
            disk_mb: self.disk_mb.unwrap_or(base.disk_mb),
            pids: self.pids.unwrap_or(base.pids),
        }
    }
}

/// The file to read: the named one (which must exist), else the default one if it exists.
pub fn locate(named: Option<&Path>) -> Option<PathBuf> {
    match named {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from(DEFAULT_PATH)).filter(|p| p.exists()),
    }
}

pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    parse(path, &text)
}

pub fn parse(path: &Path, text: &str) -> Result<FileConfig, ConfigError> {
    let doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| ConfigError::Syntax {
        path: path.into(),
        message: e.message().to_string(),
    })?;
    let field = Field { path };
    let mut c = FileConfig::default();
    for (key, item) in doc.as_table().iter() {
        match key {
            "listen" => c.listen = Some(field.string(key, item)?),
            "router_listen" => c.router_listen = Some(field.string(key, item)?),
            "data_dir" => c.data_dir = Some(PathBuf::from(field.string(key, item)?)),
            "api_key" => c.api_key = Some(field.string(key, item)?),
            "warm_pool" => c.warm_pool = Some(field.count(key, item, 0, 1024)? as usize),
            "link_pool" => c.link_pool = Some(field.count(key, item, 0, 1024)? as usize),
            "destroy_on_exit" => c.destroy_on_exit = Some(field.boolean(key, item)?),
            "code_zygote" => c.code_zygote = Some(field.boolean(key, item)?),
            "cgroup_favor_dynmods" => c.cgroup_favor_dynmods = Some(field.boolean(key, item)?),
            "retention_s" => c.retention_s = Some(field.count(key, item, 0, u64::MAX)?),
            "preview_domain" => c.preview_domain = Some(field.string(key, item)?),
            "default_isolation" => c.default_isolation = Some(field.isolation(key, item)?),
            "limits" => c.limits = field.limits(item)?,
            other => return Err(ConfigError::UnknownKey { path: path.into(), key: other.to_string() }),
        }
    }
    Ok(c)
}

struct Field<'a> {
    path: &'a Path,
}

impl Field<'_> {
    fn bad(&self, key: &str, want: impl Into<String>) -> ConfigError {
        ConfigError::BadValue { path: self.path.into(), key: key.to_string(), want: want.into() }
    }

    fn string(&self, key: &str, item: &toml_edit::Item) -> Result<String, ConfigError> {
        item.as_str()
            .map(str::to_string)
            .ok_or_else(|| self.bad(key, format!("expected a string, got {}", item.type_name())))
    }

    fn boolean(&self, key: &str, item: &toml_edit::Item) -> Result<bool, ConfigError> {
        item.as_bool().ok_or_else(|| self.bad(key, format!("expected true or false, got {}", item.type_name())))
    }

    fn isolation(&self, key: &str, item: &toml_edit::Item) -> Result<api::Isolation, ConfigError> {
        let want = || self.bad(key, "expected \"process\" or \"gvisor\"");
        item.as_str().and_then(|s| s.parse().ok()).ok_or_else(want)
    }

    fn count(&self, key: &str, item: &toml_edit::Item, min: u64, max: u64) -> Result<u64, ConfigError> {
        let want = || self.bad(key, format!("expected an integer from {min} to {max}"));
        let n = item.as_integer().ok_or_else(want)?;
        u64::try_from(n).ok().filter(|n| (min..=max).contains(n)).ok_or_else(want)
    }

    fn limits(&self, item: &toml_edit::Item) -> Result<LimitsConfig, ConfigError> {
        let table = item.as_table_like().ok_or_else(|| self.bad("limits", "expected a table"))?;
        let mut l = LimitsConfig::default();
        for (key, item) in table.iter() {
            let name = format!("limits.{key}");
            match key {
                "cpus" => {
                    // TOML keeps 1 and 1.0 apart; a core count may be written either way.
                    let v = item.as_float().or_else(|| item.as_integer().map(|i| i as f64));
                    let ok = v.filter(|v| *v > 0.0 && *v <= api::MAX_CPUS);
                    l.cpus = Some(ok.ok_or_else(|| {
                        self.bad(&name, format!("expected a number above 0, at most {}", api::MAX_CPUS))
                    })?);
                }
                "memory_mb" => l.memory_mb = Some(self.count(&name, item, api::MIN_MEMORY_MB, api::MAX_MEMORY_MB)?),
                "disk_mb" => l.disk_mb = Some(self.count(&name, item, api::MIN_DISK_MB, api::MAX_DISK_MB)?),
                "pids" => l.pids = Some(self.count(&name, item, api::MIN_PIDS, api::MAX_PIDS)?),
                _ => return Err(ConfigError::UnknownKey { path: self.path.into(), key: name }),
            }
        }
        Ok(l)
    }
}

/// Whether the file may set the argument `id`: neither its flag nor its env var was given.
pub fn file_may_set(matches: &ArgMatches, id: &str) -> bool {
    !matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("/etc/glovebox/config.toml")
    }

    #[test]
    fn every_key_parses() {
        let c = parse(
            p(),
            "listen = \"127.0.0.1:7181\"\nrouter_listen = \"0.0.0.0:8888\"\ndata_dir = \"/srv/gb\"\nwarm_pool = 0\n\
             link_pool = 3\ndestroy_on_exit = true\nretention_s = 3600\ndefault_isolation = \"gvisor\"\n[limits]\ncpus = 2\nmemory_mb = 1024\ndisk_mb = 2048\npids = 512\n",
        )
        .unwrap();
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:7181"));
        assert_eq!(c.router_listen.as_deref(), Some("0.0.0.0:8888"));
        assert_eq!(c.data_dir, Some(PathBuf::from("/srv/gb")));
        assert_eq!(
            (c.warm_pool, c.link_pool, c.destroy_on_exit, c.retention_s),
            (Some(0), Some(3), Some(true), Some(3600))
        );
        assert_eq!(c.default_isolation, Some(api::Isolation::Gvisor));
        let l = c.limits.over(api::Limits::default());
        assert_eq!((l.cpus, l.memory_mb, l.disk_mb, l.pids), (2.0, 1024, 2048, 512));
    }

    #[test]
    fn empty_file_sets_nothing() {
        assert_eq!(parse(p(), "# nothing\n").unwrap(), FileConfig::default());
    }

    #[test]
    fn unknown_key_is_named_with_the_file() {
        let e = parse(p(), "warm_pol = 1\n").unwrap_err().to_string();
        assert_eq!(e, "config /etc/glovebox/config.toml: unknown key `warm_pol`");
        let e = parse(p(), "[limits]\nmemory = 5\n").unwrap_err().to_string();
        assert!(e.contains("unknown key `limits.memory`"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        for (text, key) in [
            ("warm_pool = -1\n", "`warm_pool`"),
            ("warm_pool = \"2\"\n", "`warm_pool`"),
            ("listen = 7171\n", "`listen`"),
            ("destroy_on_exit = \"yes\"\n", "`destroy_on_exit`"),
            ("[limits]\nmemory_mb = 1\n", "`limits.memory_mb`"),
            ("[limits]\ncpus = 0\n", "`limits.cpus`"),
            ("limits = 3\n", "`limits`"),
            ("default_isolation = \"vm\"\n", "`default_isolation`"),
            ("default_isolation = 1\n", "`default_isolation`"),
        ] {
            let e = parse(p(), text).unwrap_err().to_string();
            assert!(e.starts_with("config /etc/glovebox/config.toml: key ") && e.contains(key), "{text:?}: {e}");
        }
        let e = parse(p(), "listen = \n").unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
    }
}
