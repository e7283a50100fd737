use glovebox_proto::api::EndReason;
use thiserror::Error;

/// Everything the manager can refuse or fail with. The API maps each variant to one status
/// and one stable code (see `api::ApiError`).
#[derive(Debug, Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("sandbox {0} not found")]
    SandboxNotFound(String),
    #[error("{what} {name:?} not found")]
    NotFound { what: &'static str, name: String },
    /// A template that ships with Glovebox but is built on the host first (the hint says how).
    #[error("template {name:?} not found (build it with {build_with})")]
    TemplateNotBuilt { name: String, build_with: &'static str },
    #[error("sandbox {id} is gone ({})", reason.as_str())]
    Gone { id: String, reason: EndReason },
    #[error("{0}")]
    Conflict(String),
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
    #[error("internal: {0}")]
    Internal(String),
}

impl From<glovebox_proto::io::ConnError> for Error {
    fn from(e: glovebox_proto::io::ConnError) -> Self {
        Error::Agent(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
