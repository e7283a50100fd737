//! The file API: read, write, list, stat, mkdir, remove and rename inside the sandbox.
//!
//! Invariants:
//! - Every path comes from an untrusted user and every file in the sandbox is untrusted (its
//!   code can create any symlink). A user path is first normalised lexically (relative to
//!   `home`, `.` and `..` folded, `..` clamped at `/`), then resolved against the root fd
//!   with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` only: `..`, absolute paths and
//!   absolute symlinks stay under the root, and `/proc/*/fd/*`-style magic links (which would
//!   reach the agent's host fds) are refused. No `std::fs` call ever sees a user path.
//!   Where the kernel has no `openat2` (gVisor's), `walk` resolves the same way by hand.
//! - Operations that act on a name (mkdir, remove, rename, stat, create) resolve the *parent*
//!   that way and then use the `*at` call on the final component, which never follows it.
//! - Reads and writes touch regular files only. Reads open with `O_NONBLOCK | O_NOCTTY` and
//!   check `fstat` first, so a FIFO or device never hangs or is read. Writes go to a fresh
//!   temp file (`O_EXCL`) in the target directory, renamed into place after `end_data`: readers
//!   never see half a file, a failed upload leaves nothing behind, and nothing is ever written
//!   into an existing inode (so procfs, sysfs and device nodes cannot be written at all).
//! - Writing to a path whose final component is a symlink replaces the link (rename
//!   semantics); it does not write through it.
//! - Error messages name only the path the user gave (escaped), never a resolved path.
//! - Blocking syscalls run on tokio's blocking pool; file data streams in `frame::CHUNK`
//!   pieces, so memory stays bounded whatever the file size.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use glovebox_proto::agent::{ErrorCode, FileInfo, FileType, Owner, Reply, Request};
use glovebox_proto::frame::{self, Kind};
use rustix::fs::{self as rfs, AtFlags, Dir, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::conn::{self, ConnError, Reader, Writer};

/// Most entries one `ListDir` returns. Past it the request fails rather than returning a
/// silently partial listing (`Reply::Entries` has no way to say "truncated").
pub const MAX_ENTRIES: usize = 10_000;
/// Deepest `ListDir` allowed; bounds the directory fds held open at once.
pub const MAX_LIST_DEPTH: u32 = 32;
/// Deepest tree a recursive `Remove` descends; bounds the directory fds held open at once.
const MAX_REMOVE_DEPTH: usize = 256;
const DEFAULT_FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;
/// Linux's limit on an attribute name list and on one attribute value.
const XATTR_MAX: usize = 64 << 10;
/// `openat2` with `RESOLVE_IN_ROOT` returns `EAGAIN` when a rename races a `..` lookup.
const OPENAT2_TRIES: usize = 16;
/// Names removed per pass before a recursive remove rereads a directory.
const REMOVE_BATCH: usize = 1024;

static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// Names of upload temp files start with this, and end with `-r` when the upload replaces
/// an existing name, `-n` when it is new (what watches report for them).
pub const UPLOAD_PREFIX: &str = ".glovebox-upload-";

/// Serves file requests against one sandbox root.
pub struct Files {
    /// Directory fd (`O_PATH`) of the sandbox root; every resolution starts here.
    root: Arc<OwnedFd>,
    /// Normalised components of the directory relative paths start from.
    home: Vec<String>,
}

/// What went wrong with one request; always sent to the daemon as `Reply::Error`.
#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error("{op} {path}: {}", describe(.err))]
    Os { op: &'static str, path: String, err: io::Error },
    #[error("{op} {path}: {why}")]
    Invalid { op: &'static str, path: String, why: String },
    #[error("{op}: empty path")]
    EmptyPath { op: &'static str },
}

impl FileError {
    fn code(&self) -> ErrorCode {
        match self {
            FileError::Os { err, .. } => conn::code_of(err),
            FileError::Invalid { .. } | FileError::EmptyPath { .. } => ErrorCode::InvalidArgument,
        }
    }
}

/// The operation and the user's path(s), for error messages.
#[derive(Clone)]
struct Ctx {
    op: &'static str,
    /// The path as the user gave it, escaped so control characters cannot forge messages.
    shown: String,
}

impl Ctx {
    fn new(op: &'static str, given: &str) -> Ctx {
        Ctx { op, shown: given.escape_debug().to_string() }
    }

    fn os(&self, err: impl Into<io::Error>) -> FileError {
        FileError::Os { op: self.op, path: self.shown.clone(), err: err.into() }
    }

    fn errno(&self, e: Errno) -> FileError {
        self.os(io::Error::from(e))
    }

    fn invalid(&self, why: impl Into<String>) -> FileError {
        FileError::Invalid { op: self.op, path: self.shown.clone(), why: why.into() }
    }
}

/// A short lower-case reason for an OS error, without the "(os error N)" suffix.
fn describe(err: &io::Error) -> String {
    match err.raw_os_error() {
        // Also what RESOLVE_NO_MAGICLINKS and O_NOFOLLOW report.
        Some(libc::ELOOP) => "too many levels of symbolic links, or a link that is refused".into(),
        Some(n) => {
            let s = io::Error::from_raw_os_error(n).to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            match c.next() {
                Some(first) => first.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
        None => err.to_string(),
    }
}

/// A user path, normalised to components below the sandbox root.
struct SandboxPath {
    parts: Vec<String>,
}

impl SandboxPath {
    fn parse(given: &str, home: &[String], ctx: &Ctx) -> Result<SandboxPath, FileError> {
        if given.is_empty() {
            return Err(FileError::EmptyPath { op: ctx.op });
        }
        if given.contains('\0') {
            return Err(ctx.invalid("path contains a nul byte"));
        }
        let mut parts: Vec<String> = if given.starts_with('/') { Vec::new() } else { home.to_vec() };
        for c in given.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                c => parts.push(c.to_string()),
            }
        }
        Ok(SandboxPath { parts })
    }

    /// The absolute sandbox path, as reported in `FileInfo.path`.
    fn abs(&self) -> String {
        format!("/{}", self.parts.join("/"))
    }

    /// The path relative to the root fd (`.` for the root itself).
    fn rel(&self) -> String {
        rel_of(&self.parts)
    }

    fn name(&self) -> String {
        self.parts.last().cloned().unwrap_or_else(|| "/".into())
    }

    /// The parent's relative path and the final component; `None` for the root.
    fn split(&self) -> Option<(&[String], &str)> {
        let (name, parent) = self.parts.split_last()?;
        Some((parent, name))
    }
}

fn rel_of(parts: &[String]) -> String {
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

fn child_path(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl Files {
    /// `root` is normally "/", `home` the default dir for relative paths ("/home/user").
    pub fn open(root: &Path, home: &str) -> io::Result<Files> {
        if !home.starts_with('/') || home.contains('\0') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "home must be an absolute path"));
        }
        let fd = rfs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        let ctx = Ctx::new("open", home);
        let home = SandboxPath::parse(home, &[], &ctx)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(Files { root: Arc::new(fd), home: home.parts })
    }

    /// Handles one file request end to end on this connection (reads following Data frames
    /// for WriteFile until the EndData JSON frame). Returns Err only for connection failures;
    /// every file error is sent as `Reply::Error`.
    pub async fn handle(&self, req: Request, r: &mut Reader, w: &mut Writer) -> Result<(), ConnError> {
        match req {
            Request::ReadFile { path } => self.read_file(&path, w).await,
            Request::WriteFile { path, mode, parents, owner, xattrs } => {
                let new = NewFile { mode, parents, owner, xattrs };
                self.write_file(&path, new, r, w).await
            }
            Request::ListDir { path, depth } => {
                let res = self
                    .run("list", &path, move |root, p, ctx| {
                        list(root, &p, depth, &ctx).map(|entries| Reply::Entries { entries })
                    })
                    .await;
                reply(w, res).await
            }
            Request::Stat { path } => {
                let res = self.run("stat", &path, |root, p, ctx| stat(root, &p, &ctx).map(Reply::FileInfo)).await;
                reply(w, res).await
            }
            Request::MakeDir { path, parents, owner } => {
                let res = self
                    .run("mkdir", &path, move |root, p, ctx| {
                        make_dir(root, &p, parents, owner, &ctx).map(Reply::FileInfo)
                    })
                    .await;
                reply(w, res).await
            }
            Request::Remove { path, recursive } => {
                let res = self
                    .run("remove", &path, move |root, p, ctx| remove(root, &p, recursive, &ctx).map(|()| Reply::Ok))
                    .await;
                reply(w, res).await
            }
            Request::Rename { from, to } => {
                let ctx = Ctx::new("rename", &from);
                let ctx = Ctx { shown: format!("{} to {}", ctx.shown, to.escape_debug()), ..ctx };
                let res = match (self.parse(&from, &ctx), self.parse(&to, &ctx)) {
                    (Ok(f), Ok(t)) => {
                        let root = self.root.clone();
                        blocking(ctx.clone(), move || rename(root.as_fd(), &f, &t, &ctx).map(Reply::FileInfo)).await
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                reply(w, res).await
            }
            other => {
                w.error(ErrorCode::Protocol, format!("not a file request: {}", op_name(&other))).await?;
                w.flush().await
            }
        }
    }

    /// Opens the directory `given` names for reading (resolved like every path here); for
    /// a watch. Errors as they are sent to the daemon.
    pub async fn open_dir(&self, given: &str) -> Result<OwnedFd, (ErrorCode, String)> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        self.run("watch", given, move |root, p, ctx| resolve(root, &p.rel(), flags).map_err(|e| ctx.errno(e)))
            .await
            .map_err(|e| (e.code(), e.to_string()))
    }

    fn parse(&self, given: &str, ctx: &Ctx) -> Result<SandboxPath, FileError> {
        SandboxPath::parse(given, &self.home, ctx)
    }

    /// Parses `given` and runs `f` on the blocking pool.
    async fn run<T, F>(&self, op: &'static str, given: &str, f: F) -> Result<T, FileError>
    where
        T: Send + 'static,
        F: FnOnce(BorrowedFd<'_>, SandboxPath, Ctx) -> Result<T, FileError> + Send + 'static,
    {
        let ctx = Ctx::new(op, given);
        let p = self.parse(given, &ctx)?;
        let root = self.root.clone();
        blocking(ctx.clone(), move || f(root.as_fd(), p, ctx)).await
    }

    async fn read_file(&self, given: &str, w: &mut Writer) -> Result<(), ConnError> {
        let opened = self.run("read", given, |root, p, ctx| open_read(root, &p, &ctx)).await;
        let (file, info) = match opened {
            Ok(v) => v,
            Err(e) => return reply(w, Err(e)).await,
        };
        let ctx = Ctx::new("read", given);
        // A file that is not empty is sent up to the size announced in FileInfo, so a file
        // growing while we read cannot stream forever; an empty one (procfs, sysfs) to EOF.
        let mut left = if info.size > 0 { Some(info.size) } else { None };
        w.json(&Reply::FileInfo(info)).await?;
        let file = Arc::new(file);
        loop {
            let want = match left {
                Some(0) => break,
                Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(frame::CHUNK),
                None => frame::CHUNK,
            };
            let f = file.clone();
            let c = ctx.clone();
            let chunk = blocking(ctx.clone(), move || read_chunk(&f, want).map_err(|e| c.os(e))).await;
            match chunk {
                Ok(buf) if buf.is_empty() => break,
                Ok(buf) => {
                    if let Some(n) = left.as_mut() {
                        *n = n.saturating_sub(buf.len() as u64);
                    }
                    w.data(Kind::Data, &buf).await?;
                }
                Err(e) => return reply(w, Err(e)).await,
            }
        }
        reply(w, Ok(Reply::Ok)).await
    }

    async fn write_file(&self, given: &str, new: NewFile, r: &mut Reader, w: &mut Writer) -> Result<(), ConnError> {
        let ctx = Ctx::new("write", given);
        // On failure keep draining until end_data, then report: replying early would make
        // the daemon's pending sends fail before it reads the reason.
        let mut upload = self.run("write", given, move |root, p, ctx| start_upload(root, p, new, &ctx)).await;
        loop {
            match r.next().await? {
                None => {
                    // `upload` drops here, which unlinks the temp file.
                    return Err(ConnError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed before end_data",
                    )));
                }
                Some((Kind::Data, bytes)) => {
                    if let Ok(up) = &mut upload {
                        if let Err(e) = up.write(&ctx, bytes).await {
                            upload = Err(e);
                        }
                    }
                }
                Some((Kind::Json, body)) => match serde_json::from_slice::<Request>(&body) {
                    Ok(Request::EndData) => break,
                    _ => {
                        w.error(ErrorCode::Protocol, "write_file: expected data frames or end_data").await?;
                        return w.flush().await;
                    }
                },
                Some((kind, _)) => {
                    w.error(ErrorCode::Protocol, format!("write_file: unexpected {kind:?} frame")).await?;
                    return w.flush().await;
                }
            }
        }
        let res = match upload {
            Ok(up) => blocking(ctx.clone(), move || up.finish(&ctx)).await.map(Reply::FileInfo),
            Err(e) => Err(e),
        };
        reply(w, res).await
    }
}

fn op_name(req: &Request) -> String {
    serde_json::to_value(req)
        .ok()
        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

async fn reply(w: &mut Writer, res: Result<Reply, FileError>) -> Result<(), ConnError> {
    match res {
        Ok(r) => w.json(&r).await?,
        Err(e) => w.error(e.code(), e.to_string()).await?,
    }
    w.flush().await
}

async fn blocking<T, F>(ctx: Ctx, f: F) -> Result<T, FileError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, FileError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(res) => res,
        Err(_) => Err(ctx.os(io::Error::other("file worker failed"))),
    }
}

// ---- resolution ----

/// Opens `rel` (relative to the sandbox root) with every component resolved inside the
/// root and magic links refused. The only way this module turns a user path into an fd.
/// On a kernel without `openat2` (gVisor's) the same resolution is walked by hand
/// (`walk::open_in_root`).
fn resolve(root: BorrowedFd<'_>, rel: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    static NO_OPENAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return crate::walk::open_in_root(root, rel, flags);
    }
    let how = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    let mut tries = 0;
    loop {
        match rfs::openat2(root, rel, flags | OFlags::CLOEXEC, Mode::empty(), how) {
            Err(Errno::AGAIN) if tries < OPENAT2_TRIES => tries += 1,
            Err(Errno::NOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                return crate::walk::open_in_root(root, rel, flags);
            }
            res => return res,
        }
    }
}

fn open_dir_path(root: BorrowedFd<'_>, parts: &[String]) -> Result<OwnedFd, Errno> {
    resolve(root, &rel_of(parts), OFlags::PATH | OFlags::DIRECTORY)
}

/// `mkdir -p`: the directory `parts` names, creating missing components with mode 0755.
/// Returns an `O_PATH` fd of it. A final component that exists but is not a directory is
/// `EEXIST`.
fn make_dirs(root: BorrowedFd<'_>, parts: &[String], owner: Option<Owner>) -> Result<OwnedFd, Errno> {
    match open_dir_path(root, parts) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT | Errno::NOTDIR) => {}
        Err(e) => return Err(e),
    }
    let mut cur = open_dir_path(root, &[])?;
    for i in 0..parts.len() {
        let prefix = &parts[..=i];
        cur = match open_dir_path(root, prefix) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match rfs::mkdirat(&cur, parts[i].as_str(), Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) => set_dir_mode(cur.as_fd(), &parts[i], owner)?,
                    // Raced with another creator, or a dangling symlink (the reopen fails).
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(e),
                }
                open_dir_path(root, prefix)?
            }
            Err(Errno::NOTDIR) if i + 1 == parts.len() => return Err(Errno::EXIST),
            Err(e) => return Err(e),
        };
    }
    Ok(cur)
}

/// Gives a directory we just created exactly `DIR_MODE`, whatever the agent's umask, and
/// the owner asked for. If it was swapped meanwhile, `O_NOFOLLOW` makes this a no-op on
/// links; a failed chown is an error (the caller asked for that owner).
fn set_dir_mode(parent: BorrowedFd<'_>, name: &str, owner: Option<Owner>) -> Result<(), Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if let Ok(fd) = rfs::openat(parent, name, flags, Mode::empty()) {
        let _ = rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE));
        chown(&fd, owner)?;
    }
    Ok(())
}

fn chown(fd: &OwnedFd, owner: Option<Owner>) -> Result<(), Errno> {
    match owner {
        Some(o) => rfs::fchown(fd, Some(rfs::Uid::from_raw(o.uid)), Some(rfs::Gid::from_raw(o.gid))),
        None => Ok(()),
    }
}

// ---- stat ----

fn kind_of(st: &rfs::Stat) -> FileType {
    match rfs::FileType::from_raw_mode(st.st_mode as rfs::RawMode) {
        rfs::FileType::RegularFile => FileType::File,
        rfs::FileType::Directory => FileType::Dir,
        rfs::FileType::Symlink => FileType::Symlink,
        _ => FileType::Other,
    }
}

// The field types of `struct stat` differ between architectures; the casts are identities
// on some and widenings on others.
#[allow(clippy::unnecessary_cast)]
fn info(path: String, name: String, st: &rfs::Stat, target: Option<String>) -> FileInfo {
    FileInfo {
        path,
        name,
        kind: kind_of(st),
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: mode_bits(st),
        uid: st.st_uid as u32,
        gid: st.st_gid as u32,
        mtime: st.st_mtime as i64,
        target,
        xattrs: BTreeMap::new(),
    }
}

/// Permission bits (including setuid, setgid, sticky) of `st`.
#[allow(clippy::unnecessary_cast)] // `st_mode` is not `u32` on every architecture.
fn mode_bits(st: &rfs::Stat) -> u32 {
    (st.st_mode as u32) & 0o7777
}

/// `lstat` of `name` in `dir`, with a symlink's target.
fn lstat_info<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    name: P,
    path: String,
    shown_name: String,
) -> Result<FileInfo, Errno> {
    let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let target = if kind_of(&st) == FileType::Symlink {
        // A link replaced between the two calls just loses its target.
        rfs::readlinkat(dir, name, Vec::new()).ok().map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let mut fi = info(path, shown_name, &st, target);
    if fi.kind == FileType::File {
        fi.xattrs = file_xattrs(dir, name, &st);
    }
    Ok(fi)
}

/// The `user.` extended attributes of the regular file `name` in `dir` (`st` its `lstat`).
/// There is no `*at` form of the xattr calls, so the file is opened — without following a
/// link, non-blocking and without a controlling tty, so nothing swapped in meanwhile can
/// hang or act — and kept only if it is still the inode `st` describes. Best effort: an
/// attribute that cannot be read is left out.
fn file_xattrs<P: rustix::path::Arg + Copy>(dir: BorrowedFd<'_>, name: P, st: &rfs::Stat) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let Ok(fd) = rfs::openat(dir, name, flags, Mode::empty()) else { return out };
    match rfs::fstat(&fd) {
        Ok(now) if now.st_dev == st.st_dev && now.st_ino == st.st_ino => {}
        _ => return out,
    }
    match rfs::flistxattr_query(&fd) {
        Ok(0) | Err(_) => return out,
        Ok(_) => {}
    }
    let mut names = vec![0u8; XATTR_MAX];
    let Ok(n) = rfs::flistxattr(&fd, &mut names[..]) else { return out };
    let mut value = vec![0u8; XATTR_MAX];
    for key in names[..n].split(|b| *b == 0).filter(|k| k.starts_with(b"user.")) {
        let Ok(key) = std::str::from_utf8(key) else { continue };
        if let Ok(len) = rfs::fgetxattr(&fd, key, &mut value[..]) {
            out.insert(key.to_string(), String::from_utf8_lossy(&value[..len]).into_owned());
        }
    }
    out
}

fn stat(root: BorrowedFd<'_>, p: &SandboxPath, ctx: &Ctx) -> Result<FileInfo, FileError> {
    let Some((parent, name)) = p.split() else {
        let st = rfs::fstat(root).map_err(|e| ctx.errno(e))?;
        return Ok(info(p.abs(), p.name(), &st, None));
    };
    let dir = open_dir_path(root, parent).map_err(|e| ctx.errno(e))?;
    lstat_info(dir.as_fd(), name, p.abs(), p.name()).map_err(|e| ctx.errno(e))
}

// ---- read ----

fn open_read(root: BorrowedFd<'_>, p: &SandboxPath, ctx: &Ctx) -> Result<(File, FileInfo), FileError> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = resolve(root, &p.rel(), flags).map_err(|e| ctx.errno(e))?;
    let st = rfs::fstat(&fd).map_err(|e| ctx.errno(e))?;
    match kind_of(&st) {
        FileType::File => {}
        FileType::Dir => return Err(ctx.errno(Errno::ISDIR)),
        _ => return Err(ctx.invalid("not a regular file")),
    }
    // O_NONBLOCK only guarded the open; make reads ordinary.
    let fl = rfs::fcntl_getfl(&fd).map_err(|e| ctx.errno(e))?;
    rfs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(|e| ctx.errno(e))?;
    Ok((File::from(fd), info(p.abs(), p.name(), &st, None)))
}

fn read_chunk(f: &File, want: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; want];
    let mut r = f;
    loop {
        match r.read(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

// ---- write ----

/// A temp file being filled; removed on drop unless `finish` renamed it into place.
struct Upload {
    dir: OwnedFd,
    tmp: String,
    name: String,
    path: String,
    file: Arc<File>,
    mode: u32,
    owner: Option<Owner>,
    placed: bool,
}

/// How `WriteFile` places a new file besides its data.
struct NewFile {
    mode: Option<u32>,
    parents: bool,
    owner: Option<Owner>,
    xattrs: BTreeMap<String, String>,
}

impl Drop for Upload {
    fn drop(&mut self) {
        // One metadata syscall, done synchronously so that even a cancelled handler (its
        // future dropped) cannot leave a temp file behind.
        if !self.placed {
            let _ = rfs::unlinkat(&self.dir, self.tmp.as_str(), AtFlags::empty());
        }
    }
}

impl Upload {
    async fn write(&mut self, ctx: &Ctx, bytes: Vec<u8>) -> Result<(), FileError> {
        let f = self.file.clone();
        let c = ctx.clone();
        blocking(ctx.clone(), move || (&*f).write_all(&bytes).map_err(|e| c.os(e))).await
    }

    fn finish(mut self, ctx: &Ctx) -> Result<FileInfo, FileError> {
        rfs::fchmod(&*self.file, Mode::from_raw_mode(self.mode)).map_err(|e| ctx.errno(e))?;
        if let Some(o) = self.owner {
            let (uid, gid) = (rfs::Uid::from_raw(o.uid), rfs::Gid::from_raw(o.gid));
            rfs::fchown(&*self.file, Some(uid), Some(gid)).map_err(|e| ctx.errno(e))?;
        }
        rfs::renameat(&self.dir, self.tmp.as_str(), &self.dir, self.name.as_str()).map_err(|e| ctx.errno(e))?;
        self.placed = true;
        let st = rfs::fstat(&*self.file).map_err(|e| ctx.errno(e))?;
        let mut fi = info(self.path.clone(), self.name.clone(), &st, None);
        fi.xattrs = file_xattrs(self.dir.as_fd(), self.name.as_str(), &st);
        Ok(fi)
    }
}

fn start_upload(root: BorrowedFd<'_>, p: SandboxPath, new: NewFile, ctx: &Ctx) -> Result<Upload, FileError> {
    let NewFile { mode, parents, owner, xattrs } = new;
    for key in xattrs.keys() {
        if !key.starts_with("user.") || key.len() == "user.".len() {
            return Err(ctx.invalid(format!("extended attribute {:?} is not in the user. namespace", key)));
        }
    }
    if let Some(m) = mode {
        if m & !0o777 != 0 {
            return Err(ctx.invalid(format!("mode {m:o} has bits outside 0777")));
        }
    }
    let Some((parent, name)) = p.split() else {
        return Err(ctx.errno(Errno::ISDIR));
    };
    let dir = if parents { make_dirs(root, parent, owner) } else { open_dir_path(root, parent) };
    let dir = dir.map_err(|e| ctx.errno(e))?;
    // Like O_TRUNC on an existing file, keep its mode unless one was asked for.
    let mut keep_mode = None;
    let mut replaces = false;
    match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match kind_of(&st) {
            FileType::File => {
                keep_mode = Some(mode_bits(&st) & 0o777);
                replaces = true;
            }
            FileType::Symlink => replaces = true,
            FileType::Dir => return Err(ctx.errno(Errno::ISDIR)),
            FileType::Other => return Err(ctx.invalid("not a regular file")),
        },
        Err(Errno::NOENT) => {}
        Err(e) => return Err(ctx.errno(e)),
    }
    let mode = mode.or(keep_mode).unwrap_or(DEFAULT_FILE_MODE);
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC;
    let mut tries = 0;
    let (tmp, fd) = loop {
        let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("{UPLOAD_PREFIX}{}-{n}-{}", std::process::id(), if replaces { "r" } else { "n" });
        // 0600 until finished, so a half-written file is private.
        match rfs::openat(&dir, tmp.as_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => break (tmp, fd),
            Err(Errno::EXIST) if tries < 16 => tries += 1,
            Err(e) => return Err(ctx.errno(e)),
        }
    };
    let file = Arc::new(File::from(fd));
    let up = Upload { dir, tmp, name: name.to_string(), path: p.abs(), file, mode, owner, placed: false };
    for (key, value) in &xattrs {
        // On the temp file, so the attributes arrive with the data, atomically.
        rfs::fsetxattr(&*up.file, key.as_str(), value.as_bytes(), rfs::XattrFlags::empty())
            .map_err(|e| ctx.errno(e))?;
    }
    Ok(up)
}

// ---- list ----

fn list(root: BorrowedFd<'_>, p: &SandboxPath, depth: u32, ctx: &Ctx) -> Result<Vec<FileInfo>, FileError> {
    if depth == 0 || depth > MAX_LIST_DEPTH {
        return Err(ctx.invalid(format!("depth must be between 1 and {MAX_LIST_DEPTH}")));
    }
    let fd = resolve(root, &p.rel(), OFlags::RDONLY | OFlags::DIRECTORY).map_err(|e| ctx.errno(e))?;
    let mut out = Vec::new();
    walk(fd, &p.abs(), depth, &mut out, ctx)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Appends the entries of `fd` (and, while `depth > 1`, of its real subdirectories — never
/// through symlinks) to `out`.
fn walk(fd: OwnedFd, path: &str, depth: u32, out: &mut Vec<FileInfo>, ctx: &Ctx) -> Result<(), FileError> {
    let mut dir = Dir::new(fd).map_err(|e| ctx.errno(e))?;
    let mut subdirs: Vec<(CString, String)> = Vec::new();
    while let Some(ent) = dir.read() {
        let ent = ent.map_err(|e| ctx.errno(e))?;
        let cname = ent.file_name();
        if is_dot(cname) {
            continue;
        }
        if out.len() >= MAX_ENTRIES {
            return Err(
                ctx.invalid(format!("more than {MAX_ENTRIES} entries; list a subdirectory or use a smaller depth"))
            );
        }
        let name = cname.to_string_lossy().into_owned();
        let child = child_path(path, &name);
        let dfd = dir.fd().map_err(|e| ctx.errno(e))?;
        let fi = match lstat_info(dfd, cname, child.clone(), name) {
            Ok(fi) => fi,
            // Removed since readdir.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(ctx.errno(e)),
        };
        if depth > 1 && fi.kind == FileType::Dir {
            subdirs.push((cname.to_owned(), child));
        }
        out.push(fi);
    }
    for (cname, child) in subdirs {
        let dfd = dir.fd().map_err(|e| ctx.errno(e))?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rfs::openat(dfd, cname.as_c_str(), flags, Mode::empty()) {
            Ok(sub) => walk(sub, &child, depth - 1, out, ctx)?,
            // Gone or swapped for a link since we looked, or unreadable: the entry itself is
            // listed; listing it directly reports why.
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::ACCESS | Errno::PERM) => {}
            Err(e) => return Err(ctx.errno(e)),
        }
    }
    Ok(())
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

// ---- mkdir, remove, rename ----

fn make_dir(
    root: BorrowedFd<'_>,
    p: &SandboxPath,
    parents: bool,
    owner: Option<Owner>,
    ctx: &Ctx,
) -> Result<FileInfo, FileError> {
    if parents {
        let fd = make_dirs(root, &p.parts, owner).map_err(|e| ctx.errno(e))?;
        let st = rfs::fstat(&fd).map_err(|e| ctx.errno(e))?;
        return Ok(info(p.abs(), p.name(), &st, None));
    }
    let Some((parent, name)) = p.split() else {
        return Err(ctx.errno(Errno::EXIST));
    };
    let dir = open_dir_path(root, parent).map_err(|e| ctx.errno(e))?;
    rfs::mkdirat(&dir, name, Mode::from_raw_mode(DIR_MODE)).map_err(|e| ctx.errno(e))?;
    set_dir_mode(dir.as_fd(), name, owner).map_err(|e| ctx.errno(e))?;
    lstat_info(dir.as_fd(), name, p.abs(), p.name()).map_err(|e| ctx.errno(e))
}

fn remove(root: BorrowedFd<'_>, p: &SandboxPath, recursive: bool, ctx: &Ctx) -> Result<(), FileError> {
    let Some((parent, name)) = p.split() else {
        return Err(ctx.invalid("refusing to remove the root"));
    };
    let dir = open_dir_path(root, parent).map_err(|e| ctx.errno(e))?;
    let st = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| ctx.errno(e))?;
    if kind_of(&st) != FileType::Dir {
        return rfs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| ctx.errno(e));
    }
    if recursive {
        empty_dir(dir.as_fd(), name, 0).map_err(|e| ctx.os(e))?;
    }
    rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| ctx.errno(e))
}

/// Removes everything inside the directory `name` of `parent`. Never follows a symlink:
/// directories are entered with `O_NOFOLLOW`, everything else is unlinked as a name.
fn empty_dir<P: rustix::path::Arg>(parent: BorrowedFd<'_>, name: P, level: usize) -> io::Result<()> {
    if level >= MAX_REMOVE_DEPTH {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "directory tree too deep"));
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = Dir::new(rfs::openat(parent, name, flags, Mode::empty())?)?;
    loop {
        // Read a batch, remove it, reread from the start: entries change under us.
        dir.rewind();
        let mut batch = Vec::new();
        while let Some(ent) = dir.read() {
            let ent = ent?;
            if is_dot(ent.file_name()) {
                continue;
            }
            batch.push((ent.file_name().to_owned(), ent.file_type()));
            if batch.len() >= REMOVE_BATCH {
                break;
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let fd = dir.fd()?;
        for (n, t) in batch {
            let is_dir = match t {
                rfs::FileType::Directory => true,
                rfs::FileType::Unknown => match rfs::statat(fd, n.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => kind_of(&st) == FileType::Dir,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                },
                _ => false,
            };
            let res = if is_dir {
                empty_dir(fd, n.as_c_str(), level + 1)?;
                rfs::unlinkat(fd, n.as_c_str(), AtFlags::REMOVEDIR)
            } else {
                rfs::unlinkat(fd, n.as_c_str(), AtFlags::empty())
            };
            match res {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn rename(root: BorrowedFd<'_>, from: &SandboxPath, to: &SandboxPath, ctx: &Ctx) -> Result<FileInfo, FileError> {
    let (Some((fparent, fname)), Some((tparent, tname))) = (from.split(), to.split()) else {
        return Err(ctx.invalid("cannot rename the root"));
    };
    let fdir = open_dir_path(root, fparent).map_err(|e| ctx.errno(e))?;
    let tdir = open_dir_path(root, tparent).map_err(|e| ctx.errno(e))?;
    rfs::renameat(&fdir, fname, &tdir, tname).map_err(|e| ctx.errno(e))?;
    lstat_info(tdir.as_fd(), tname, to.abs(), to.name()).map_err(|e| ctx.errno(e))
}

#[cfg(test)]
#[path = "files_tests.rs"]
mod tests;
