use std::io;
use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum JailError {
    /// A setup step failed; `step` names it (e.g. "mount overlay"), `path` what it acted on.
    #[error("{step}{}: {source}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Sys {
        step: &'static str,
        path: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
    #[error("bad jail config: {0}")]
    Config(String),
    #[error("jailer reported: {0}")]
    Reported(String),
    #[error("jailer did not finish within {0} ms")]
    Timeout(u64),
    #[error("seccomp: {0}")]
    Seccomp(String),
}

impl JailError {
    pub fn sys(step: &'static str, source: io::Error) -> JailError {
        JailError::Sys { step, path: None, source }
    }
    pub fn at(step: &'static str, path: impl Into<PathBuf>, source: io::Error) -> JailError {
        JailError::Sys { step, path: Some(path.into()), source }
    }
}

pub type Result<T> = std::result::Result<T, JailError>;

/// Adds the failing step (and path) to an `io::Result`.
pub trait Ctx<T> {
    fn ctx(self, step: &'static str) -> Result<T>;
    fn ctx_at(self, step: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> Ctx<T> for io::Result<T> {
    fn ctx(self, step: &'static str) -> Result<T> {
        self.map_err(|e| JailError::sys(step, e))
    }
    fn ctx_at(self, step: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|e| JailError::at(step, path, e))
    }
}
