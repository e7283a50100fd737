//! One daemon connection: the shared framed codec plus the agent's error mapping.

use glovebox_proto::agent::ErrorCode;
pub use glovebox_proto::io::{split, ConnError, Reader, Writer};

/// Maps an OS error to the protocol's error code.
pub fn code_of(e: &std::io::Error) -> ErrorCode {
    use std::io::ErrorKind as K;
    match e.raw_os_error() {
        Some(libc::ENOTDIR) => return ErrorCode::NotADirectory,
        Some(libc::EISDIR) => return ErrorCode::IsADirectory,
        Some(libc::ENOTEMPTY) => return ErrorCode::NotEmpty,
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => return ErrorCode::NoSpace,
        Some(libc::ELOOP) | Some(libc::EXDEV) | Some(libc::ENAMETOOLONG) => return ErrorCode::InvalidArgument,
        // What the sandbox's filesystem cannot do (e.g. extended attributes under gVisor,
        // whose gofer has none): a request it must refuse, not a failure of ours.
        Some(libc::EOPNOTSUPP) => return ErrorCode::InvalidArgument,
        // A read-only mount (the host's /usr, a read-only volume): the write is refused.
        Some(libc::EROFS) => return ErrorCode::PermissionDenied,
        _ => {}
    }
    match e.kind() {
        K::NotFound => ErrorCode::NotFound,
        K::AlreadyExists => ErrorCode::AlreadyExists,
        K::PermissionDenied => ErrorCode::PermissionDenied,
        K::InvalidInput | K::InvalidData => ErrorCode::InvalidArgument,
        _ => ErrorCode::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_filesystem_cannot_do_is_the_request_s_fault() {
        let code = |n| code_of(&std::io::Error::from_raw_os_error(n));
        assert_eq!(code(libc::EOPNOTSUPP), ErrorCode::InvalidArgument);
        assert_eq!(code(libc::ENOSPC), ErrorCode::NoSpace);
        assert_eq!(code(libc::EROFS), ErrorCode::PermissionDenied);
        assert_eq!(code(libc::ENOENT), ErrorCode::NotFound);
        assert_eq!(code(libc::EIO), ErrorCode::Io);
    }
}
