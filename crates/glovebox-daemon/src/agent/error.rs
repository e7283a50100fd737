//! How an exchange with an agent fails, and what each failure means to the daemon.

use glovebox_proto::agent::ErrorCode;
use glovebox_proto::io::ConnError;

use crate::error::Error;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Connecting, reading or writing failed, or a frame or message was malformed.
    #[error("{0}")]
    Connection(#[from] ConnError),
    /// The agent ended the connection before the exchange's end.
    #[error("{0}")]
    Closed(&'static str),
    /// The agent did not answer within the time the exchange allows.
    #[error("{0}")]
    Timeout(&'static str),
    /// A reply or frame the exchange does not allow.
    #[error("{0}")]
    Unexpected(&'static str),
    /// The agent refused the request with its own code.
    #[error("{message}")]
    Refused { code: ErrorCode, message: String },
}

/// The kind of request that failed: an agent's refusal means something different for each.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// A file request, or any other whose refusal is reported as the agent gave it: the
    /// error keeps the agent's code (not found, no space, …).
    File,
    /// Starting a command: a command that cannot start is the caller's mistake.
    Exec,
    /// A request about command `id` (signal, stdin, release).
    Command(u64),
    /// Reading command `id`'s output.
    Output(u64),
}

impl AgentError {
    /// The daemon's error for this failure of an `op` request. A refusal maps by `op`; any
    /// other failure means the connection broke or the agent misbehaved, and `broken`, which
    /// knows whether the sandbox ended meanwhile, says what to report.
    pub fn into_error(self, op: Op, broken: impl FnOnce(AgentError) -> Error) -> Error {
        let AgentError::Refused { code, message } = self else { return broken(self) };
        match (op, code) {
            (Op::Exec, ErrorCode::InvalidArgument | ErrorCode::SpawnFailed) => Error::Invalid(message),
            (Op::Exec, _) => Error::Agent(message),
            (Op::Command(id) | Op::Output(id), ErrorCode::NotFound) => {
                Error::NotFound { what: "command", name: id.to_string() }
            }
            (Op::Command(_), ErrorCode::InvalidArgument) => Error::Invalid(message),
            (Op::Output(_), _) => Error::Agent("unexpected message in output stream".into()),
            (Op::File | Op::Command(_), code) => Error::File { code, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: ErrorCode) -> AgentError {
        AgentError::Refused { code, message: "no".into() }
    }

    fn unreachable_broken(e: AgentError) -> Error {
        panic!("a refusal is not a broken connection: {e}")
    }

    #[test]
    fn refusals_map_by_request() {
        let e = refused(ErrorCode::NotFound).into_error(Op::File, unreachable_broken);
        assert!(matches!(e, Error::File { code: ErrorCode::NotFound, .. }));
        let e = refused(ErrorCode::SpawnFailed).into_error(Op::Exec, unreachable_broken);
        assert!(matches!(e, Error::Invalid(m) if m == "no"));
        let e = refused(ErrorCode::Io).into_error(Op::Exec, unreachable_broken);
        assert!(matches!(e, Error::Agent(m) if m == "no"));
        let e = refused(ErrorCode::NotFound).into_error(Op::Command(7), unreachable_broken);
        assert!(matches!(e, Error::NotFound { what: "command", name } if name == "7"));
        let e = refused(ErrorCode::InvalidArgument).into_error(Op::Command(7), unreachable_broken);
        assert!(matches!(e, Error::Invalid(_)));
        let e = refused(ErrorCode::NotFound).into_error(Op::Output(3), unreachable_broken);
        assert!(matches!(e, Error::NotFound { name, .. } if name == "3"));
        let e = refused(ErrorCode::Io).into_error(Op::Output(3), unreachable_broken);
        assert!(matches!(e, Error::Agent(_)));
    }

    #[test]
    fn other_failures_are_told_by_the_caller() {
        let e = AgentError::Timeout("slow").into_error(Op::File, |e| Error::Agent(format!("told: {e}")));
        assert!(matches!(e, Error::Agent(m) if m == "told: slow"));
    }
}
