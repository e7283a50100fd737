//! Path resolution inside the sandbox root for kernels without `openat2` (gVisor's sentry
//! of 2022): the same answer as `openat2(root, rel, flags, RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS)`, walked one component at a time.
//!
//! Invariants:
//! - The kernel never follows a symlink here: every component is opened with `O_NOFOLLOW`
//!   relative to the directory the walk stands in; a symlink's text is read and walked in
//!   turn, from the root when it is absolute. `..` goes back to the directory the walk came
//!   from and stops at the root. So every fd the walk ever holds is the root or below it.
//! - Symlinks on procfs are refused (`ELOOP`): that is where magic links live (`/proc/*/fd/*`,
//!   `cwd`, `root`, `exe`), and no text of theirs may stand for what they point at.
//! - At most [`MAX_LINKS`] symlinks per resolution (`ELOOP` past them), as the kernel's 40.
//! - Only opens (no `O_CREAT`): the file API creates names with `*at` calls on a resolved
//!   parent.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{self as rfs, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Symlinks one resolution may follow (the kernel's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Opens `rel` below `root` with `flags`, every component resolved inside `root`.
pub fn open_in_root(root: BorrowedFd<'_>, rel: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    if flags.contains(OFlags::CREATE) {
        return Err(Errno::INVAL);
    }
    let step = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // The directories from the root down to where the walk stands (`..` pops one).
    let mut stack: Vec<OwnedFd> = vec![rfs::openat(root, ".", step | OFlags::DIRECTORY, Mode::empty())?];
    let mut rest: VecDeque<String> = components(rel);
    let mut links = 0;
    while let Some(name) = rest.pop_front() {
        match name.as_str() {
            "" | "." => continue,
            ".." => {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            _ => {}
        }
        let last = rest.iter().all(|c| c.is_empty() || c == ".");
        let cur = stack.last().map(|d| d.as_fd()).ok_or(Errno::NOENT)?;
        if last && flags.contains(OFlags::NOFOLLOW) {
            // The caller's own O_NOFOLLOW: the final component is opened as it is.
            return rfs::openat(cur, name.as_str(), flags | OFlags::CLOEXEC, Mode::empty());
        }
        let fd = rfs::openat(cur, name.as_str(), step, Mode::empty())?;
        let st = rfs::fstat(&fd)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS || rfs::fstatfs(&fd)?.f_type as i64 == PROC_SUPER_MAGIC {
                    return Err(Errno::LOOP);
                }
                let target = rfs::readlinkat(cur, name.as_str(), Vec::new())?;
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    stack.truncate(1);
                }
                for c in components(&target).into_iter().rev() {
                    rest.push_front(c);
                }
            }
            FileType::Directory if !last => stack.push(fd),
            _ if !last => return Err(Errno::NOTDIR),
            _ => {
                // The final component, not a symlink: opened for real, still without
                // following (a symlink swapped in meanwhile is refused, not followed).
                return rfs::openat(cur, name.as_str(), flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty());
            }
        }
    }
    // The walk ended on a directory (the root, `..`, or a symlink's last component).
    let dir = stack.last().ok_or(Errno::NOENT)?;
    rfs::openat(dir, ".", flags | OFlags::CLOEXEC, Mode::empty())
}

fn components(path: &str) -> VecDeque<String> {
    path.split('/').filter(|c| !c.is_empty()).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::ResolveFlags;
    use std::os::unix::fs::symlink;

    /// A tree with every kind of link a sandbox could plant.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("a/b/c")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::write(r.join("a/b/c/file"), "x").unwrap();
        std::fs::write(r.join("etc/passwd"), "root").unwrap();
        symlink("/etc/passwd", r.join("abs")).unwrap();
        symlink("../../../../../../etc", r.join("a/b/up")).unwrap();
        symlink("b/c", r.join("a/rel")).unwrap();
        symlink("/a/rel/file", r.join("a/b/c/chain")).unwrap();
        symlink("loop2", r.join("loop1")).unwrap();
        symlink("loop1", r.join("loop2")).unwrap();
        symlink("/nowhere/at/all", r.join("dangling")).unwrap();
        symlink("/", r.join("rootlink")).unwrap();
        symlink("..", r.join("a/dotdot")).unwrap();
        symlink("/proc/self/fd/0", r.join("magic")).unwrap();
        symlink("/proc/self", r.join("procself")).unwrap();
        t
    }

    fn ident(fd: &OwnedFd) -> (u64, u64) {
        let st = rfs::fstat(fd).unwrap();
        (st.st_dev, st.st_ino)
    }

    #[test]
    fn resolves_as_openat2_in_root_does() {
        let t = tree();
        let root = rfs::open(t.path(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        let paths = [
            ".",
            "a",
            "a/b/c/file",
            "abs",
            "a/b/up/passwd",
            "a/b/up",
            "a/rel/file",
            "a/b/c/chain",
            "loop1",
            "dangling",
            "rootlink/etc/passwd",
            "a/dotdot/etc/passwd",
            "a/b/c/file/x",
            "missing",
            "a/../../../etc/passwd",
            "rootlink/../../a",
        ];
        let flag_sets = [
            OFlags::PATH | OFlags::DIRECTORY,
            OFlags::RDONLY | OFlags::DIRECTORY,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            OFlags::PATH | OFlags::NOFOLLOW,
        ];
        for p in paths {
            for f in flag_sets {
                let want = rfs::openat2(&root, p, f | OFlags::CLOEXEC, Mode::empty(), how);
                let got = open_in_root(root.as_fd(), p, f);
                match (&want, &got) {
                    (Ok(w), Ok(g)) => assert_eq!(ident(w), ident(g), "{p} {f:?}"),
                    (Err(w), Err(g)) => assert_eq!(w, g, "{p} {f:?}"),
                    _ => panic!("{p} {f:?}: openat2 {want:?}, walk {got:?}"),
                }
            }
        }
    }

    #[test]
    fn procfs_links_are_refused() {
        let t = tree();
        let root = rfs::open(t.path(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        // A root whose /proc is the real one: the magic link is never followed.
        let inside = rfs::open("/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        assert_eq!(open_in_root(inside.as_fd(), "proc/self/fd/0", OFlags::RDONLY).unwrap_err(), Errno::LOOP);
        assert_eq!(open_in_root(inside.as_fd(), "proc/self/status", OFlags::RDONLY).unwrap_err(), Errno::LOOP);
        // Resolved as text inside a root without procfs: /proc/self/fd/0 does not exist there.
        assert_eq!(open_in_root(root.as_fd(), "magic", OFlags::RDONLY).unwrap_err(), Errno::NOENT);
        assert_eq!(open_in_root(root.as_fd(), "x", OFlags::RDONLY | OFlags::CREATE).unwrap_err(), Errno::INVAL);
    }
}
