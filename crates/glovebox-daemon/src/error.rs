//! The daemon's domain error, and its one mapping to the API's stable error codes (the HTTP
//! layer adds the status; streams that fail after their status was sent use the detail alone).

use glovebox_proto::agent::ErrorCode as AgentCode;
use glovebox_proto::api::{EndReason, ErrorCode, ErrorDetail};
use thiserror::Error;

/// Everything the manager can refuse or fail with. Each variant has one stable code
/// ([`Error::code`]).
#[derive(Debug, Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("sandbox {0} not found")]
    SandboxNotFound(String),
    #[error("{what} {name:?} not found")]
    NotFound { what: &'static str, name: String },
    /// A template that ships with Glovebox but is not built (the hint says how to build it).
    #[error("template {name:?} not found (build it with {build_with})")]
    TemplateNotBuilt { name: String, build_with: &'static str },
    #[error("sandbox {id} is gone ({})", reason.as_str())]
    Gone { id: String, reason: EndReason },
    #[error("{0}")]
    Conflict(String),
    /// A request reached a paused sandbox that does not resume on requests.
    #[error("sandbox {0} is paused (created with auto_resume false): resume it first")]
    Paused(String),
    /// A sandbox was paused while a request waited on its processes.
    #[error("sandbox {0} was paused while this request waited on it: what the request started is frozen with it and goes on when it resumes")]
    PausedMeanwhile(String),
    /// A volume a live sandbox has mounted was to be deleted.
    #[error("{0}")]
    VolumeInUse(String),
    #[error("{0}")]
    Unavailable(String),
    /// A tenant quota would be exceeded (the message names the limit).
    #[error("{0}")]
    Quota(String),
    #[error("sandbox failed to start: {0}")]
    Start(String),
    /// A file operation the agent refused (its own code, e.g. `not_found`, and message).
    #[error("{message}")]
    File { code: glovebox_proto::agent::ErrorCode, message: String },
    /// The agent broke protocol or vanished mid-request.
    #[error("sandbox agent: {0}")]
    Agent(String),
    /// Hibernation asked for on a host that cannot checkpoint processes (the reason why).
    #[error("hibernate is not available on this host: {0}")]
    HibernateUnavailable(String),
    /// A sandbox's files could not be captured (why: too large, too deep, ended meanwhile).
    #[error("snapshot failed: {0}")]
    SnapshotFailed(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl From<glovebox_proto::io::ConnError> for Error {
    fn from(e: glovebox_proto::io::ConnError) -> Self {
        Error::Agent(e.to_string())
    }
}

impl Error {
    /// The stable code this error is reported with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Invalid(_) => ErrorCode::InvalidRequest,
            Error::SandboxNotFound(_) => ErrorCode::SandboxNotFound,
            Error::NotFound { what: "template", .. } | Error::TemplateNotBuilt { .. } => ErrorCode::TemplateNotFound,
            Error::NotFound { what: "context", .. } => ErrorCode::ContextNotFound,
            Error::NotFound { what: "command", .. } => ErrorCode::CommandNotFound,
            Error::NotFound { what: "secret", .. } => ErrorCode::SecretNotFound,
            Error::NotFound { what: "volume", .. } => ErrorCode::VolumeNotFound,
            Error::NotFound { what: "snapshot", .. } => ErrorCode::SnapshotNotFound,
            Error::NotFound { .. } => ErrorCode::NotFound,
            Error::Gone { .. } => ErrorCode::SandboxGone,
            Error::Conflict(_) => ErrorCode::Conflict,
            Error::Paused(_) | Error::PausedMeanwhile(_) => ErrorCode::SandboxPaused,
            Error::VolumeInUse(_) => ErrorCode::VolumeInUse,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Quota(_) => ErrorCode::QuotaExceeded,
            Error::Start(_) => ErrorCode::StartFailed,
            Error::File { code, .. } => match code {
                AgentCode::NotFound => ErrorCode::FileNotFound,
                AgentCode::AlreadyExists => ErrorCode::FileExists,
                AgentCode::NotADirectory => ErrorCode::NotADirectory,
                AgentCode::IsADirectory => ErrorCode::IsADirectory,
                AgentCode::NotEmpty => ErrorCode::DirectoryNotEmpty,
                AgentCode::PermissionDenied => ErrorCode::PermissionDenied,
                AgentCode::InvalidArgument => ErrorCode::InvalidPath,
                AgentCode::NoSpace => ErrorCode::DiskFull,
                AgentCode::SpawnFailed => ErrorCode::SpawnFailed,
                AgentCode::Protocol | AgentCode::Io => ErrorCode::AgentError,
            },
            Error::Agent(_) => ErrorCode::AgentError,
            Error::HibernateUnavailable(_) => ErrorCode::HibernateUnavailable,
            Error::SnapshotFailed(_) => ErrorCode::SnapshotFailed,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }

    /// What a client is told: the code, the message (an internal fault's details go to the
    /// log, not to the client) and, for a gone sandbox, why. Logs the faults that are ours.
    pub fn into_detail(self) -> ErrorDetail {
        let code = self.code();
        let reason = match &self {
            Error::Gone { reason, .. } => Some(*reason),
            _ => None,
        };
        let message = match &self {
            Error::Start(_) => {
                tracing::error!("{self}");
                self.to_string()
            }
            Error::Agent(_) => {
                tracing::warn!("{self}");
                self.to_string()
            }
            Error::Internal(_) => {
                tracing::error!("{self}");
                "internal error (see the daemon log)".to_string()
            }
            _ => self.to_string(),
        };
        ErrorDetail { code, message, reason }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
