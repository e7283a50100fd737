//! Directory watches: inotify on a directory (and, recursively, the ones below it) inside
//! the sandbox, with the events kept until the daemon asks for them.
//!
//! Invariants:
//! - The watched directory is resolved like every file-API path (`Files::open_dir`); watches
//!   are added through the opened fd (`/proc/self/fd/N`), never through a user path, and
//!   subdirectories are opened `O_NOFOLLOW` relative to their parent, so a watch never
//!   follows a symlink.
//! - A background task drains inotify every `POLL` (so new subdirectories get their watch
//!   soon; a directory watched late is scanned, and what is already in it reported as
//!   created — and written, for a file with data); a `WatchSync` first drains what the
//!   kernel holds, so it sees every change finished before the sync was sent. (Polling a
//!   non-blocking fd: registering it with the reactor needs `unsafe` in tokio.)
//! - Memory is bounded: at most `MAX_EVENTS` events kept and `MAX_WATCHES` directories
//!   watched; past them events are dropped and the reply says `overflowed`.
//! - The file API's temp files never show: an upload renamed into place is reported as the
//!   writes of its final name (see `FsOp`).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use glovebox_proto::agent::{ErrorCode, FsEvent, FsOp, Reply, Request};
use glovebox_proto::frame::Kind;
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{self as rfs, Dir, Mode, OFlags};
use rustix::io::Errno;

use crate::conn::{ConnError, Reader, Writer};
use crate::files::{Files, UPLOAD_PREFIX};

/// Most events kept between two syncs.
const MAX_EVENTS: usize = 16_384;
/// Most directories one recursive watch covers.
const MAX_WATCHES: usize = 4096;
/// Deepest directory a recursive watch descends to.
const MAX_DEPTH: usize = 32;
/// How often the background task drains inotify.
const POLL: std::time::Duration = std::time::Duration::from_millis(20);

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        // Not DONT_FOLLOW: watches are added through `/proc/self/fd/N`, a link to a
        // directory already opened without following links.
        | WatchFlags::ONLYDIR
}

/// The state of one watch.
struct Watch {
    ino: OwnedFd,
    /// The watched directory.
    root: OwnedFd,
    /// Watch descriptor → its directory, relative to the watched one ("" for itself).
    dirs: HashMap<i32, String>,
    recursive: bool,
    events: Vec<FsEvent>,
    overflowed: bool,
    /// Rename cookies of upload temp files moved away → whether that upload replaces a name.
    uploads: HashMap<u32, bool>,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

impl Watch {
    /// Watches `fd` (a directory opened for reading) as `rel`, and below it when recursive.
    /// `report` adds a `Create` for each entry found below (a directory that appeared with
    /// things already in it).
    fn add(&mut self, fd: OwnedFd, rel: String, depth: usize, report: bool) -> Result<(), Errno> {
        if self.dirs.len() >= MAX_WATCHES {
            self.overflowed = true;
            return Ok(());
        }
        let wd = inotify::add_watch(&self.ino, format!("/proc/self/fd/{}", fd.as_raw_fd()), mask())?;
        self.dirs.insert(wd, rel.clone());
        if !self.recursive || depth >= MAX_DEPTH {
            return Ok(());
        }
        let mut subdirs = Vec::new();
        let mut dir = Dir::read_from(&fd)?;
        while let Some(ent) = dir.read() {
            let Ok(ent) = ent else { break };
            let name = ent.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." || name.starts_with(UPLOAD_PREFIX) {
                continue;
            }
            if report {
                self.push(join(&rel, &name), FsOp::Create);
                let has_data = ent.file_type() == rfs::FileType::RegularFile
                    && rfs::statat(&fd, ent.file_name(), rfs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| st.st_size > 0);
                if has_data {
                    self.push(join(&rel, &name), FsOp::Write);
                }
            }
            if ent.file_type() == rfs::FileType::Directory {
                subdirs.push(name);
            }
        }
        for name in subdirs {
            self.add_child(fd.as_fd(), &rel, &name, depth + 1, report);
        }
        Ok(())
    }

    /// Watches the subdirectory `name` of `parent` (if it still is one, not a link).
    fn add_child(&mut self, parent: BorrowedFd<'_>, rel: &str, name: &str, depth: usize, report: bool) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if let Ok(sub) = rfs::openat(parent, name, flags, Mode::empty()) {
            // Gone or unreadable meanwhile: nothing to watch.
            let _ = self.add(sub, join(rel, name), depth, report);
        }
    }

    fn push(&mut self, name: String, op: FsOp) {
        if self.events.len() >= MAX_EVENTS {
            self.overflowed = true;
        } else {
            self.events.push(FsEvent { name, op });
        }
    }

    /// Reads every event the kernel holds now.
    fn drain(&mut self) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 << 10];
        let ino = match self.ino.try_clone() {
            Ok(fd) => fd,
            Err(_) => return,
        };
        let mut reader = inotify::Reader::new(&ino, &mut buf);
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                // AGAIN: nothing more now.
                Err(_) => return,
            };
            let flags = ev.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                self.overflowed = true;
                continue;
            }
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&ev.wd());
                continue;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd()).cloned(), ev.file_name()) else { continue };
            let name = name.to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix(UPLOAD_PREFIX) {
                if flags.contains(ReadFlags::MOVED_FROM) {
                    self.uploads.insert(ev.cookie(), rest.ends_with("-r"));
                }
                continue;
            }
            let path = join(&dir, &name);
            if flags.contains(ReadFlags::MOVED_TO) {
                if let Some(replaces) = self.uploads.remove(&ev.cookie()) {
                    if !replaces {
                        self.push(path.clone(), FsOp::Create);
                    }
                    self.push(path.clone(), FsOp::Write);
                    if !replaces {
                        self.push(path, FsOp::Chmod);
                    }
                    continue;
                }
            }
            let op = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                FsOp::Create
            } else if flags.contains(ReadFlags::MODIFY) {
                FsOp::Write
            } else if flags.contains(ReadFlags::ATTRIB) {
                FsOp::Chmod
            } else if flags.contains(ReadFlags::DELETE) {
                FsOp::Remove
            } else if flags.contains(ReadFlags::MOVED_FROM) {
                FsOp::Rename
            } else {
                continue;
            };
            self.push(path.clone(), op);
            if op == FsOp::Create && self.recursive && flags.contains(ReadFlags::ISDIR) {
                let depth = dir.split('/').filter(|c| !c.is_empty()).count() + 1;
                if let Some(parent) = self.dir_fd(&dir) {
                    self.add_child(parent.as_fd(), &dir, &name, depth, true);
                }
            }
        }
    }

    /// Opens the watched directory `rel` (for adding a new subdirectory's watch).
    fn dir_fd(&self, rel: &str) -> Option<OwnedFd> {
        let mut cur =
            rfs::openat(&self.root, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()?;
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            cur = rfs::openat(&cur, c, flags, Mode::empty()).ok()?;
        }
        Some(cur)
    }
}

/// Serves one `WatchDir` exchange until the daemon closes the connection.
pub async fn serve(files: &Files, given: &str, recursive: bool, mut r: Reader, mut w: Writer) -> Result<(), ConnError> {
    let fd = match files.open_dir(given).await {
        Ok(fd) => fd,
        Err((code, message)) => {
            w.error(code, message).await?;
            return w.flush().await;
        }
    };
    let started = (|| {
        let ino = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        let root = fd.try_clone().map_err(|_| Errno::MFILE)?;
        let mut watch = Watch {
            ino,
            root,
            dirs: HashMap::new(),
            recursive,
            events: Vec::new(),
            overflowed: false,
            uploads: HashMap::new(),
        };
        watch.add(fd, String::new(), 0, false)?;
        Ok::<_, Errno>(watch)
    })();
    let watch = match started {
        Ok(w) => w,
        Err(e) => {
            let e = std::io::Error::from(e);
            w.error(crate::conn::code_of(&e), format!("watch {}: {e}", given.escape_debug())).await?;
            return w.flush().await;
        }
    };
    let watch = Arc::new(Mutex::new(watch));
    w.json(&Reply::Ok).await?;
    w.flush().await?;
    let reader = {
        let watch = watch.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            loop {
                tick.tick().await;
                watch.lock().unwrap_or_else(|p| p.into_inner()).drain();
            }
        })
    };
    let res = async {
        while let Some((kind, body)) = r.next().await? {
            let req = (kind == Kind::Json).then(|| serde_json::from_slice::<Request>(&body).ok()).flatten();
            if req != Some(Request::WatchSync) {
                w.error(ErrorCode::Protocol, "watch: expected watch_sync").await?;
                return w.flush().await;
            }
            let (events, overflowed) = {
                let mut st = watch.lock().unwrap_or_else(|p| p.into_inner());
                st.drain();
                let overflowed = std::mem::take(&mut st.overflowed);
                (std::mem::take(&mut st.events), overflowed)
            };
            w.json(&Reply::FsEvents { events, overflowed }).await?;
            w.flush().await?;
        }
        Ok(())
    }
    .await;
    reader.abort();
    res
}
