//! The one error type of the cgroup module.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong managing sandbox cgroups. Each variant names the file or
/// directory (or the rejected input) it failed on; the io cause is the `source`, printed once
/// at the edge with the rest of the chain.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no supported cgroup layout under {path}: {reason}")]
    Unsupported { path: PathBuf, reason: String },
    #[error("cgroup v2 root {path} lacks controllers: {missing}")]
    MissingControllers { path: PathBuf, missing: String },
    #[error("invalid sandbox cgroup name {name:?}")]
    InvalidName { name: String },
    #[error("invalid limit {field}: {reason}")]
    InvalidLimit { field: &'static str, reason: String },
    #[error("cgroup {path} already exists")]
    AlreadyExists { path: PathBuf },
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("write {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("parse {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("mkdir {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("rmdir {path}")]
    Rmdir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("chown {path} to {uid}")]
    Chown {
        path: PathBuf,
        uid: u32,
        #[source]
        source: io::Error,
    },
    #[error("kill pid {pid} of {path}")]
    Kill {
        path: PathBuf,
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("cgroup {path} still has {remaining} processes")]
    NotEmpty { path: PathBuf, remaining: usize },
}
