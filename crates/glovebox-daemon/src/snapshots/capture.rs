//! Copies a sandbox's writable layer into a layer tree the template store can take.
//!
//! The source is the sandbox's: hostile. Everything is walked fd-relative from the layer's
//! directory, every open is `O_NOFOLLOW` (a symlink is copied as a link, never followed), only
//! directories, regular files, symlinks and overlay whiteouts (0/0 character devices) are
//! copied — fifos, sockets and other device nodes are skipped and counted — and the walk is
//! bounded: bytes by the sandbox's disk cap (a file's size counts, so a huge sparse file is
//! refused rather than inflated), entries by its inode cap, depth by [`MAX_DEPTH`]. The
//! sandbox is frozen meanwhile (the caller's job), so nothing changes under the walk.
//!
//! What is kept: modes (setuid/setgid too), owners shifted from the sandbox's host range back
//! to 0-based (ids outside it become 65534), modification times, `user.*` xattrs and the
//! overlay's opaque-directory mark (`trusted.overlay.opaque`). Not kept: hard links (each
//! name becomes its own file), ACLs and `security.*` xattrs (file capabilities name the old
//! range), the overlay's other bookkeeping xattrs.
//!
//! The layer id is the sha256 of a canonical stream of what was copied (names in sorted order,
//! types, modes, owners, link targets, xattrs, contents), so the same files give the same id.

use std::ffi::{CStr, CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps, XattrFlags};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Deepest directory nesting copied (each level holds two descriptors during the walk).
pub const MAX_DEPTH: usize = 128;

/// Where the overlay marks a directory that hides everything below it.
const OPAQUE: &str = "trusted.overlay.opaque";

#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("the sandbox's files exceed its disk cap of {0} bytes")]
    TooLarge(u64),
    #[error("the sandbox has more than {0} files")]
    TooMany(u64),
    #[error("directories nested deeper than {MAX_DEPTH} levels at {0}")]
    TooDeep(String),
    #[error("{what} {path}: {err}")]
    Io { what: &'static str, path: String, err: std::io::Error },
}

/// Bounds of one capture.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// What a capture copied.
#[derive(Debug, Default, Clone)]
pub struct Captured {
    /// Content-derived layer id (hex sha256).
    pub id: String,
    pub bytes: u64,
    pub entries: u64,
    /// Special files left out.
    pub skipped: u64,
}

struct Walk {
    /// The layer's filesystem: an entry on another is a mount point (see `copy_entry`).
    dev: u64,
    uid_base: u32,
    limits: Limits,
    hash: Sha256,
    bytes: u64,
    entries: u64,
    skipped: u64,
    buf: Vec<u8>,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> CaptureError + 'a {
    move |e| CaptureError::Io { what, path: path.display().to_string(), err: e.into() }
}

fn stdio<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CaptureError + 'a {
    move |err| CaptureError::Io { what, path: path.display().to_string(), err }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// Copies the writable layer at `layer` (holding `root/`, `usr/` and maybe `etc/`, as the
/// jail makes it) into the new directory `dst`: `root/` becomes the tree, `usr/` and `etc/`
/// are merged in under `usr` and `etc`.
pub fn capture(layer: &Path, dst: &Path, uid_base: u32, limits: Limits) -> Result<Captured, CaptureError> {
    let mut w = Walk {
        dev: 0,
        uid_base,
        limits,
        hash: Sha256::new(),
        bytes: 0,
        entries: 0,
        skipped: 0,
        buf: vec![0u8; 1 << 20],
    };
    w.hash.update(b"glovebox snapshot layer 1\0");
    // `layer` itself is followed: it is the host's way in (`/proc/<pid>/fd/<n>`, a link the
    // kernel resolves to the open directory), never a path the sandbox can change.
    let src = rustix::fs::open(layer, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(io("open the layer", layer))?;
    w.dev = rustix::fs::fstat(&src).map_err(io("stat the layer", layer))?.st_dev;
    std::fs::create_dir(dst).map_err(stdio("mkdir", dst))?;
    let out = rustix::fs::open(dst, DIR_FLAGS, Mode::empty()).map_err(io("open", dst))?;
    let root = rustix::fs::openat(&src, "root", DIR_FLAGS, Mode::empty()).map_err(io("open", &layer.join("root")))?;
    w.copy_dir(root.as_fd(), out.as_fd(), Path::new("/"), 0, false)?;
    for sub in ["usr", "etc"] {
        let Ok(from) = rustix::fs::openat(&src, sub, DIR_FLAGS, Mode::empty()) else { continue };
        w.hash.update(format!("\0merge {sub}\0").as_bytes());
        let rel = Path::new("/").join(sub);
        let to = match rustix::fs::openat(&out, sub, DIR_FLAGS, Mode::empty()) {
            Ok(d) => d,
            Err(_) => {
                remove_any(out.as_fd(), OsStr::new(sub), dst);
                rustix::fs::mkdirat(&out, sub, Mode::from_raw_mode(0o755)).map_err(io("mkdir", &rel))?;
                rustix::fs::openat(&out, sub, DIR_FLAGS, Mode::empty()).map_err(io("open", &rel))?
            }
        };
        w.copy_dir(from.as_fd(), to.as_fd(), &rel, 1, true)?;
    }
    // The layer's own root is root's, like every `/`.
    rustix::fs::fchown(&out, Some(rustix::fs::Uid::ROOT), Some(rustix::fs::Gid::ROOT)).map_err(io("chown", dst))?;
    rustix::fs::fchmod(&out, Mode::from_raw_mode(0o755)).map_err(io("chmod", dst))?;
    Ok(Captured {
        id: super::super::templates::store::hex(&w.hash.finalize()),
        bytes: w.bytes,
        entries: w.entries,
        skipped: w.skipped,
    })
}

/// Removes `name` in `dir` (a directory tree or anything else) of our own output tree.
fn remove_any(dir: BorrowedFd<'_>, name: &OsStr, at: &Path) {
    if rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok() {
        return;
    }
    // A directory: through its path in our own tree (nothing in it is followed).
    let _ = std::fs::remove_dir_all(at.join(name));
}

impl Walk {
    fn shift(&self, id: u32) -> u32 {
        if id >= self.uid_base && id - self.uid_base < crate::slots::RANGE {
            id - self.uid_base
        } else {
            65534
        }
    }

    fn count(&mut self, bytes: u64) -> Result<(), CaptureError> {
        self.entries += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.limits.max_bytes {
            return Err(CaptureError::TooLarge(self.limits.max_bytes));
        }
        if self.entries > self.limits.max_entries {
            return Err(CaptureError::TooMany(self.limits.max_entries));
        }
        Ok(())
    }

    /// Copies the entries of `src` into `dst` (at `rel` in the tree). With `merge`, an entry
    /// already in `dst` is replaced, or merged into when both are directories.
    fn copy_dir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        rel: &Path,
        depth: usize,
        merge: bool,
    ) -> Result<(), CaptureError> {
        if depth > MAX_DEPTH {
            return Err(CaptureError::TooDeep(rel.display().to_string()));
        }
        let mut names: Vec<CString> = Vec::new();
        let dup = rustix::io::fcntl_dupfd_cloexec(src, 0).map_err(io("dup", rel))?;
        let mut dir = rustix::fs::Dir::new(dup).map_err(io("read dir", rel))?;
        while let Some(e) = dir.read() {
            let e = e.map_err(io("read dir", rel))?;
            let n = e.file_name();
            if n.to_bytes() == b"." || n.to_bytes() == b".." {
                continue;
            }
            names.push(n.to_owned());
            // Bounded before the sort: a directory of a million names stops here.
            if names.len() as u64 > self.limits.max_entries {
                return Err(CaptureError::TooMany(self.limits.max_entries));
            }
        }
        drop(dir);
        names.sort();
        for name in names {
            let path = rel.join(OsStr::from_bytes(name.to_bytes()));
            self.copy_entry(src, dst, &name, &path, depth, merge)?;
        }
        Ok(())
    }

    fn copy_entry(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CStr,
        path: &Path,
        depth: usize,
        merge: bool,
    ) -> Result<(), CaptureError> {
        let mut st = rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW).map_err(io("stat", path))?;
        let mut ft = FileType::from_raw_mode(st.st_mode);
        // The jail's mounts on the layer's own directories (`/proc`, `/dev`, a flat root's
        // `/usr` and `/etc`, volumes) are seen through this descriptor too: a mount point is
        // copied as the empty directory the jail made (root's, 0755), never entered.
        let mount_point = st.st_dev != self.dev;
        if mount_point {
            if ft != FileType::Directory {
                return Ok(());
            }
            st.st_uid = self.uid_base;
            st.st_gid = self.uid_base;
            st.st_mode = (st.st_mode & !0o7777) | 0o755;
            ft = FileType::Directory;
        }
        let (uid, gid) = (self.shift(st.st_uid), self.shift(st.st_gid));
        let mode = st.st_mode & 0o7777;
        let whiteout = ft == FileType::CharacterDevice && st.st_rdev == 0;
        let known = matches!(ft, FileType::Directory | FileType::RegularFile | FileType::Symlink) || whiteout;
        if !known {
            self.skipped += 1;
            return Ok(());
        }
        let size = if ft == FileType::RegularFile { st.st_size.max(0) as u64 } else { 0 };
        self.count(size)?;
        let mut existing_dir = false;
        if merge {
            match rustix::fs::statat(dst, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(d) if FileType::from_raw_mode(d.st_mode) == FileType::Directory && ft == FileType::Directory => {
                    existing_dir = true
                }
                Ok(_) => {
                    let out_path = fd_path(dst);
                    remove_any(dst, OsStr::from_bytes(name.to_bytes()), &out_path);
                }
                Err(_) => {}
            }
        }
        self.hash.update(path.as_os_str().as_bytes());
        self.hash.update(format!("\0{:o} {uid} {gid}\0", st.st_mode).as_bytes());
        let times = Timestamps {
            last_access: rustix::fs::Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
            last_modification: rustix::fs::Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
        };
        match ft {
            FileType::Directory => {
                if !existing_dir {
                    rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700)).map_err(io("mkdir", path))?;
                }
                let to = rustix::fs::openat(dst, name, DIR_FLAGS, Mode::empty()).map_err(io("open", path))?;
                if !mount_point {
                    let from = rustix::fs::openat(src, name, DIR_FLAGS, Mode::empty()).map_err(io("open", path))?;
                    self.copy_xattrs(from.as_fd(), to.as_fd(), path)?;
                    self.copy_dir(from.as_fd(), to.as_fd(), path, depth + 1, merge && existing_dir)?;
                }
                set_owner_mode(to.as_fd(), uid, gid, mode, path)?;
                let _ = rustix::fs::utimensat(dst, name, &times, AtFlags::SYMLINK_NOFOLLOW);
            }
            FileType::RegularFile => {
                let from = rustix::fs::openat(
                    src,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
                    Mode::empty(),
                )
                .map_err(io("open", path))?;
                // The same file the stat saw (the sandbox is frozen, but a frozen sandbox
                // cannot swap it either way; this only keeps the bound honest).
                let again = rustix::fs::fstat(&from).map_err(io("stat", path))?;
                if again.st_ino != st.st_ino || FileType::from_raw_mode(again.st_mode) != FileType::RegularFile {
                    return Err(CaptureError::Io {
                        what: "open",
                        path: path.display().to_string(),
                        err: std::io::Error::other("changed during the snapshot"),
                    });
                }
                let to = rustix::fs::openat(
                    dst,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(io("create", path))?;
                self.copy_xattrs(from.as_fd(), to.as_fd(), path)?;
                self.copy_data(from, &to, size, path)?;
                set_owner_mode(to.as_fd(), uid, gid, mode, path)?;
                let _ = rustix::fs::futimens(&to, &times);
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name, Vec::new()).map_err(io("readlink", path))?;
                self.hash.update(target.as_bytes());
                self.hash.update(b"\0");
                rustix::fs::symlinkat(target.as_c_str(), dst, name).map_err(io("symlink", path))?;
                rustix::fs::chownat(
                    dst,
                    name,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(io("chown", path))?;
                let _ = rustix::fs::utimensat(dst, name, &times, AtFlags::SYMLINK_NOFOLLOW);
            }
            _ => {
                // A whiteout: the same 0/0 character device hides the name in the layers below
                // (root's, as the overlay makes them).
                rustix::fs::mknodat(dst, name, FileType::CharacterDevice, Mode::empty(), 0)
                    .map_err(io("mknod whiteout", path))?;
            }
        }
        Ok(())
    }

    fn copy_data(&mut self, from: OwnedFd, to: &OwnedFd, size: u64, path: &Path) -> Result<(), CaptureError> {
        let mut r = std::fs::File::from(from);
        let mut w = std::fs::File::from(to.try_clone().map_err(stdio("dup", path))?);
        let mut left = size;
        // Never more than the size counted against the budget (a file cannot grow while the
        // sandbox is frozen; this bounds it anyway).
        while left > 0 {
            let want = (left as usize).min(self.buf.len());
            let n = r.read(&mut self.buf[..want]).map_err(stdio("read", path))?;
            if n == 0 {
                break;
            }
            self.hash.update(&self.buf[..n]);
            w.write_all(&self.buf[..n]).map_err(stdio("write", path))?;
            left -= n as u64;
        }
        self.hash.update(b"\0");
        Ok(())
    }

    fn copy_xattrs(&mut self, from: BorrowedFd<'_>, to: BorrowedFd<'_>, path: &Path) -> Result<(), CaptureError> {
        let mut list = vec![0u8; 64 << 10];
        let n = match rustix::fs::flistxattr(from, &mut list) {
            Ok(n) => n,
            Err(rustix::io::Errno::NOTSUP) => return Ok(()),
            Err(e) => return Err(io("list xattrs", path)(e)),
        };
        let mut value = vec![0u8; 64 << 10];
        for key in list[..n].split(|b| *b == 0).filter(|k| !k.is_empty()) {
            let k = String::from_utf8_lossy(key);
            if !(k.starts_with("user.") || k == OPAQUE) {
                continue;
            }
            let Ok(key_c) = CString::new(key) else { continue };
            let len = match rustix::fs::fgetxattr(from, key_c.as_c_str(), &mut value) {
                Ok(l) => l,
                Err(rustix::io::Errno::NODATA) => continue,
                Err(e) => return Err(io("get xattr", path)(e)),
            };
            self.hash.update(key);
            self.hash.update(b"=");
            self.hash.update(&value[..len]);
            self.hash.update(b"\0");
            rustix::fs::fsetxattr(to, key_c.as_c_str(), &value[..len], XattrFlags::empty())
                .map_err(io("set xattr", path))?;
        }
        Ok(())
    }
}

/// Owner first, then the mode (a chown clears setuid/setgid).
fn set_owner_mode(fd: BorrowedFd<'_>, uid: u32, gid: u32, mode: u32, path: &Path) -> Result<(), CaptureError> {
    rustix::fs::fchown(fd, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
        .map_err(io("chown", path))?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(io("chmod", path))
}

/// The path of one of our own output directories (to remove a tree in it by path).
fn fd_path(fd: BorrowedFd<'_>) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).unwrap_or_default()
}
