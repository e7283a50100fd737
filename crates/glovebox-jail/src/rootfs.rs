//! The sandbox's root filesystem.
//!
//! Layout of the private tmpfs mounted on `mount_dir` (it exists only in the jailer's mount
//! namespace, so no host mount is ever left behind; it vanishes with the sandbox's last
//! process):
//!
//! ```text
//! mount_dir/            tmpfs, size = disk budget, mode 0711
//!   lower/N             id-mapped, read-only bind of layer N (and of the host's /usr)
//!   upper/{root,usr}    the sandbox's writes (owned by its uid 0)
//!   work/{root,usr}     overlayfs work dirs
//!   root/               overlay of the layers + upper/root: becomes `/`
//!     usr/              (when `host_usr`) the host's /usr, read-only, when the layers hold
//!                       nothing in /usr but /usr/local ([`only_usr_local`]; template builds
//!                       excepted); else an overlay of the layers' /usr + the host's + upper/usr
//!       local/          then an overlay of the layers' /usr/local + the host's +
//!                       upper/usr/local: the only writable place under /usr
//!     dev/              small tmpfs: bind-mounted null, zero, full, random, urandom, tty
//!     dev/shm           tmpfs capped at `shm_bytes`
//! ```
//!
//! With `flat_root` (the generated skeleton is the only layer) `/` is no overlay: it is
//! `upper/root` itself, with the skeleton's directories and symlinks made in it
//! ([`SKEL_DIRS`], [`SKEL_LINKS`]); `/etc` (over the skeleton's, `upper/etc`) is an overlay,
//! and the daemon's `/opt/glovebox` a read-only bind of the skeleton's ([`SKEL_BOUND`]). A path
//! walked from `/`, `/home` or `/tmp` then meets no overlayfs lookup or getattr (50-100 ns per
//! `stat`, see docs/benchmarks.md); what the sandbox can write is the same but for that one
//! read-only directory. Likewise a path under the host's read-only `/usr` (outside
//! `/usr/local`), where a sandbox can no longer write.
//!
//! Invariants: host paths are only ever lower layers or read-only binds (`/usr`), nosuid,
//! nodev, id-mapped so on-disk uid 0 is the sandbox's uid 0 (its own host uid), and no host
//! directory is writable from inside. Every write lands in the tmpfs, whose size is the disk cap — except writes to
//! volumes asked for at create ([`bind_volume`]): the daemon's mounts of their own capped
//! filesystems (never a host directory of anything else), id-mapped, nosuid, nodev too.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{symlink, DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::JailConfig;
use crate::error::{Ctx, Result};
use crate::sys;

const MS_NOSUID: libc::c_ulong = libc::MS_NOSUID;
const MS_NODEV: libc::c_ulong = libc::MS_NODEV;
const MS_NOEXEC: libc::c_ulong = libc::MS_NOEXEC;

fn mkdir(p: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new().recursive(true).mode(mode).create(p).ctx_at("mkdir", p)?;
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).ctx_at("chmod", p)
}

fn chown(p: &Path, uid: u32) -> Result<()> {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).ctx_at("chown", p)
}

/// Binds `src` read-only, nosuid, nodev, with ids mapped through `userns` (none: as they
/// are, for a guest kernel's root), onto `dst`.
fn idmapped_bind(src: &Path, dst: &Path, userns: Option<BorrowedFd<'_>>) -> Result<()> {
    idmapped_bind_as(src, dst, userns, true)
}

/// Binds `src` nosuid, nodev (and read-only when `read_only`), with ids mapped through
/// `userns` (if any), onto `dst`.
fn idmapped_bind_as(src: &Path, dst: &Path, userns: Option<BorrowedFd<'_>>, read_only: bool) -> Result<()> {
    let tree = sys::open_tree_clone(src, true).ctx_at("open_tree", src)?;
    let ro = if read_only { sys::MOUNT_ATTR_RDONLY } else { 0 };
    sys::mount_setattr(tree.as_fd(), ro | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV, userns)
        .ctx_at("id-map mount", src)?;
    sys::move_mount_to(tree.as_fd(), dst).ctx_at("move_mount", dst)
}

/// Binds a volume at its path inside `root`, id-mapped (the volume's on-disk uid 0 is the
/// sandbox's root, whatever its host range), nosuid, nodev. The path's missing directories
/// are made owned by the sandbox's root (`uid`). Runs before any sandbox process exists, so
/// nothing can swap a directory of the path for a symlink meanwhile; one already there (from
/// a layer) is refused rather than followed.
fn bind_volume(v: &crate::config::Volume, root: &Path, uid: u32, userns: Option<BorrowedFd<'_>>) -> Result<()> {
    use std::path::Component;
    let bad =
        || crate::error::JailError::Config(format!("volume path {} is not a plain absolute path", v.target.display()));
    let mut comps = v.target.components();
    if comps.next() != Some(Component::RootDir) {
        return Err(bad());
    }
    let mut dst = root.to_path_buf();
    let mut depth = 0;
    for c in comps {
        let Component::Normal(c) = c else { return Err(bad()) };
        dst.push(c);
        depth += 1;
        match fs::symlink_metadata(&dst) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(crate::error::JailError::Config(format!(
                    "volume path {}: a component is not a directory",
                    v.target.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::DirBuilder::new().mode(0o755).create(&dst).ctx_at("mkdir", &dst)?;
                chown(&dst, uid)?;
            }
            Err(e) => return Err(e).ctx_at("stat", &dst),
        }
    }
    if depth == 0 {
        return Err(bad());
    }
    idmapped_bind_as(&v.source, &dst, userns, v.read_only)
}

/// Mounts the disk image `img` (ext4) on `m` through a loop device.
fn mount_disk_image(img: &Path, m: &Path) -> Result<()> {
    crate::loopdev::mount_image(img, m, "ext4", MS_NOSUID | MS_NODEV).map(drop).ctx_at("mount disk image", img)
}

fn overlay(lowers: &[PathBuf], upper: &Path, work: &Path, target: &Path) -> Result<()> {
    let lower = lowers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":");
    let opts = format!(
        "lowerdir={lower},upperdir={},workdir={},index=off,xino=off,redirect_dir=nofollow,metacopy=off",
        upper.display(),
        work.display()
    );
    sys::mount(Some("overlay"), target, Some("overlay"), MS_NOSUID | MS_NODEV, Some(&opts))
        .ctx_at("mount overlay", target)
}

/// Host side, as host root inside the jailer's private mount namespace: builds `root/`.
/// `userns` is the sandbox's user namespace (for the id-mapping).
pub fn build(cfg: &JailConfig, userns: BorrowedFd<'_>) -> Result<PathBuf> {
    let root = build_tree(cfg, Some(userns))?;
    build_dev(&root.join("dev"), cfg.shm_bytes)?;
    Ok(root)
}

/// The same root for a guest kernel (gVisor's, through its gofer), in the caller's private
/// mount namespace: nothing id-mapped (the guest's uid 0 is the gofer's, host root, and
/// the on-disk uid 0 of every layer is the sandbox's root, as in the jail), and no `/dev`
/// (the guest kernel makes its own). `cfg.uid_base` is 0.
pub fn build_guest(cfg: &JailConfig) -> Result<PathBuf> {
    build_tree(cfg, None)
}

fn build_tree(cfg: &JailConfig, userns: Option<BorrowedFd<'_>>) -> Result<PathBuf> {
    let m = &cfg.mount_dir;
    let r = cfg.uid_base;
    match &cfg.disk_image {
        // Its own filesystem: full is ENOSPC for this sandbox alone. The loop device is held
        // by the mount alone (auto-clear), so it goes with this mount namespace.
        Some(img) => {
            mount_disk_image(img, m)?;
            fs::set_permissions(m, fs::Permissions::from_mode(0o711)).ctx("chmod disk root")?;
        }
        None => {
            let opts = format!("size={},mode=0711,nr_inodes={}", cfg.disk_bytes, inode_cap(cfg.disk_bytes));
            sys::mount(Some("glovebox"), m, Some("tmpfs"), MS_NOSUID | MS_NODEV, Some(&opts))
                .ctx_at("mount disk tmpfs", m)?;
        }
    }

    let mut lowers = Vec::new();
    for (i, layer) in cfg.layers.iter().enumerate() {
        let dst = m.join("lower").join(i.to_string());
        mkdir(&dst, 0o700)?;
        idmapped_bind(layer, &dst, userns)?;
        lowers.push(dst);
    }
    if lowers.is_empty() {
        return Err(crate::error::JailError::Config("no root filesystem layers".into()));
    }
    // The writes go to the tmpfs, or (template builds) to a host directory the daemon reads
    // back after the sandbox is gone; either way they are owned by the sandbox's range.
    let (upper, work) = match &cfg.upper_dir {
        Some(d) => (d.join("upper"), d.join("work")),
        None => (m.join("upper"), m.join("work")),
    };
    // A flat root's /etc is an overlay of its own; the others' is in the root's.
    // (A flat root is no overlay: it needs no work dir of its own.)
    let (upper_subs, work_subs): (&[&str], &[&str]) =
        if cfg.flat_root { (&["root", "usr", "etc"], &["usr", "etc"]) } else { (&["root", "usr"], &["root", "usr"]) };
    for (d, subs) in [(&upper, upper_subs), (&work, work_subs)] {
        mkdir(d, 0o700)?;
        for sub in subs {
            let p = d.join(sub);
            mkdir(&p, 0o755)?;
            chown(&p, r)?;
        }
    }
    fs::set_permissions(&upper, fs::Permissions::from_mode(0o711)).ctx("chmod upper")?;
    let root = root_dir(cfg);
    if cfg.flat_root {
        let [skel] = lowers.as_slice() else {
            return Err(crate::error::JailError::Config("a flat root has the skeleton as its only layer".into()));
        };
        if cfg.upper_dir.is_some() {
            return Err(crate::error::JailError::Config("a template build's root is an overlay".into()));
        }
        flat_skeleton(skel, &root, r)?;
        for d in SKEL_OVERLAID {
            overlay(&[skel.join(d)], &upper.join(d), &work.join(d), &root.join(d))?;
        }
        for d in SKEL_BOUND {
            let (src, dst) = (skel.join(d), root.join(d));
            // Its mount point was made with the skeleton (where the skeleton has it). A bind of
            // the id-mapped, read-only skeleton: it stays both.
            if dst.is_dir() {
                sys::mount(Some(&src.display().to_string()), &dst, None, libc::MS_BIND, None).ctx_at("bind", &dst)?;
            }
        }
    } else {
        mkdir(&root, 0o755)?;
        overlay(&lowers, &upper.join("root"), &work.join("root"), &root)?;
    }

    if cfg.host_usr {
        let usr_lower = m.join("lower/usr");
        mkdir(&usr_lower, 0o700)?;
        idmapped_bind(Path::new("/usr"), &usr_lower, userns)?;
        let target = root.join("usr");
        if !target.is_dir() {
            mkdir(&target, 0o755)?;
        }
        // Layers' own /usr content (e.g. packages in /usr/local) sits above the host's.
        let layer_usrs: Vec<PathBuf> = lowers.iter().map(|l| l.join("usr")).filter(|p| p.is_dir()).collect();
        if cfg.upper_dir.is_none() && only_usr_local(&layer_usrs, &usr_lower)? {
            // `/usr` the host's, read-only, no overlay to walk through (an overlay costs every
            // path under it 25-40 % of a `stat`, the id-mapping 0-3 %: docs/benchmarks.md);
            // `/usr/local`, where the layers' packages and the sandbox's own installs go, an
            // overlay as before. The upper stays `upper/usr` (`local/` in it), as snapshots
            // read it.
            sys::mount(Some(&usr_lower.display().to_string()), &target, None, libc::MS_BIND | libc::MS_REC, None)
                .ctx_at("bind", &target)?;
            let mut local_lowers: Vec<PathBuf> =
                layer_usrs.iter().map(|u| u.join("local")).filter(|p| p.is_dir()).collect();
            local_lowers.push(usr_lower.join("local"));
            // The overlay's root takes its upper's owner and mode: those the merged
            // directory had (the top-most layer's, ids as mapped).
            let top = fs::metadata(&local_lowers[0]).ctx_at("stat", &local_lowers[0])?;
            let up = upper.join("usr/local");
            mkdir(&up, top.permissions().mode() & 0o7777)?;
            std::os::unix::fs::chown(&up, Some(top.uid()), Some(top.gid())).ctx_at("chown", &up)?;
            overlay(&local_lowers, &up, &work.join("usr"), &target.join("local"))?;
        } else {
            let mut usr_lowers = layer_usrs;
            usr_lowers.push(usr_lower);
            overlay(&usr_lowers, &upper.join("usr"), &work.join("usr"), &target)?;
        }
    }

    for v in &cfg.volumes {
        bind_volume(v, &root, r, userns)?;
    }
    Ok(root)
}

/// Whether the layers' `/usr` trees (`layer_usrs`, top-most first) hold nothing but a
/// `local/` directory, so the sandbox's `/usr` can be the host's (`host_usr`) read-only with
/// only `/usr/local` merged and writable: what it sees there is what the whole overlay showed.
/// Not when a layer changed anything else in `/usr` (a file, a whiteout, an opaque `/usr` or
/// a `local` that is no directory) or the host has no `/usr/local`.
fn only_usr_local(layer_usrs: &[PathBuf], host_usr: &Path) -> Result<bool> {
    if !host_usr.join("local").is_dir() {
        return Ok(false);
    }
    for u in layer_usrs {
        if sys::is_opaque_dir(u).ctx_at("getxattr", u)? {
            return Ok(false);
        }
        for e in fs::read_dir(u).ctx_at("readdir", u)? {
            let e = e.ctx_at("readdir", u)?;
            if e.file_name() != "local" || !e.file_type().ctx_at("readdir", u)?.is_dir() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Where [`build`] makes the root: `upper/root` itself for a flat root, else the overlay's
/// mount point `root`.
pub fn root_dir(cfg: &JailConfig) -> PathBuf {
    if cfg.flat_root {
        cfg.mount_dir.join("upper/root")
    } else {
        cfg.mount_dir.join("root")
    }
}

/// The base skeleton's directories besides `/etc`'s content, parents first, with their modes;
/// all owned by the sandbox's root. [`build_host_skel`] writes them, [`flat_skeleton`] makes
/// them again in a flat root.
const SKEL_DIRS: &[(&str, u32)] = &[
    ("usr", 0o755),
    ("proc", 0o755),
    ("dev", 0o755),
    ("sys", 0o755),
    ("run", 0o755),
    ("mnt", 0o755),
    ("opt", 0o755),
    ("srv", 0o755),
    ("var", 0o755),
    ("var/lib", 0o755),
    ("var/cache", 0o755),
    ("var/log", 0o755),
    ("var/tmp", 0o1777),
    ("etc", 0o755),
    ("tmp", 0o1777),
    ("root", 0o700),
    ("home", 0o755),
    // Commands run as root (without capabilities) by default, so root owns the default
    // working directory; templates with `USER` hand it over at build time.
    ("home/user", 0o755),
];

/// The skeleton's directory with files in it that a sandbox may change (the generated
/// `/etc`): a flat root overlays it rather than copy its files. Keep the `subs` of [`build`]
/// in step.
const SKEL_OVERLAID: [&str; 1] = ["etc"];

/// What the daemon adds to the skeleton (the code interpreter's kernels, `code::KERNEL_DIR`):
/// a flat root binds it read-only (an overlay mount costs 40-90 us of each create, a bind
/// under 10). Besides these and [`SKEL_OVERLAID`], the skeleton holds only [`SKEL_DIRS`] and
/// [`SKEL_LINKS`] (`flat_root_covers_the_skeleton`).
const SKEL_BOUND: [&str; 1] = ["opt/glovebox"];

/// The host's merged-`/usr` symlinks the skeleton repeats (where the host has them).
const SKEL_LINKS: &[&str] = &["bin", "sbin", "lib", "lib64", "lib32", "libx32"];

/// Makes the skeleton's directories and symlinks (read from `skel`, the skeleton's id-mapped
/// bind) and the mount points of [`SKEL_BOUND`] in the empty `root` (owned by `uid`, the
/// sandbox's root), owned by `uid` too.
fn flat_skeleton(skel: &Path, root: &Path, uid: u32) -> Result<()> {
    // Read as host root: `skel` sits below the root-only `lower/`.
    let links: Vec<(&str, PathBuf)> =
        SKEL_LINKS.iter().filter_map(|l| fs::read_link(skel.join(l)).ok().map(|t| (*l, t))).collect();
    let bound: Vec<&str> = SKEL_BOUND.iter().copied().filter(|d| skel.join(d).is_dir()).collect();
    // Made as the sandbox's root (the filesystem ids only: no chown per entry, and host root's
    // capabilities come back with fsuid 0) and with the modes exactly as listed (the sticky
    // temp dirs): no umask. Single-threaded here, so nothing else sees either change.
    // SAFETY: setfsgid, setfsuid and umask only change the calling thread's/process's ids and
    // mask, restored below on every path.
    let (gid0, uid0, mask) = unsafe { (libc::setfsgid(uid), libc::setfsuid(uid), libc::umask(0)) };
    let made = (|| {
        for (p, mode) in SKEL_DIRS {
            let d = root.join(p);
            fs::DirBuilder::new().mode(*mode).create(&d).ctx_at("mkdir", &d)?;
        }
        for (l, t) in &links {
            let link = root.join(l);
            symlink(t, &link).ctx_at("symlink", &link)?;
        }
        // The mount points of what `build` binds, where the skeleton has it.
        for d in &bound {
            let dst = root.join(d);
            fs::DirBuilder::new().mode(0o755).create(&dst).ctx_at("mkdir", &dst)?;
        }
        Ok(())
    })();
    // SAFETY: as above.
    unsafe {
        libc::umask(mask);
        // setfsuid/setfsgid return the ids they replace (as c_int).
        libc::setfsuid(uid0 as libc::uid_t);
        libc::setfsgid(gid0 as libc::gid_t);
    }
    made
}

/// tmpfs counts inodes separately from bytes; cap them too so an inode flood stops at the
/// disk budget (one inode per 4 KiB, at least 16k).
fn inode_cap(disk_bytes: u64) -> u64 {
    (disk_bytes / 4096).max(16 * 1024)
}

/// The same `/dev` a sandbox's root gets, in `root` (a kernel zygote's, `kzygote`).
pub fn build_dev_for(root: &Path, shm_bytes: u64) -> Result<()> {
    build_dev(&root.join("dev"), shm_bytes)
}

fn build_dev(dev: &Path, shm_bytes: u64) -> Result<()> {
    if !dev.is_dir() {
        mkdir(dev, 0o755)?;
    }
    sys::mount(Some("dev"), dev, Some("tmpfs"), MS_NOSUID | MS_NOEXEC, Some("size=64k,mode=0755,nr_inodes=64"))
        .ctx_at("mount /dev", dev)?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let node = dev.join(name);
        fs::File::create(&node).ctx_at("create device stub", &node)?;
        let host = Path::new("/dev").join(name);
        sys::mount(Some(&host.display().to_string()), &node, None, libc::MS_BIND, None).ctx_at("bind device", &node)?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(to, dev.join(link)).ctx_at("symlink", dev.join(link))?;
    }
    mkdir(&dev.join("pts"), 0o755)?;
    let shm = dev.join("shm");
    mkdir(&shm, 0o1777)?;
    sys::mount(Some("shm"), &shm, Some("tmpfs"), MS_NOSUID | MS_NODEV, Some(&format!("size={shm_bytes},mode=1777")))
        .ctx_at("mount /dev/shm", &shm)
}

/// Inside, as the sandbox's PID 1 in its own mount namespace: makes `root` the root.
pub fn enter(root: &Path) -> Result<()> {
    // A fresh bind gives an unlocked top mount, which pivot_root needs (mounts copied into a
    // less privileged namespace are locked).
    sys::mount(Some(&root.display().to_string()), root, None, libc::MS_BIND | libc::MS_REC, None)
        .ctx_at("bind root", root)?;
    sys::mount(Some("proc"), &root.join("proc"), Some("proc"), MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        .ctx("mount /proc")?;
    sys::mount(
        Some("devpts"),
        &root.join("dev/pts"),
        Some("devpts"),
        MS_NOSUID | MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .ctx("mount /dev/pts")?;
    sys::chdir(root).ctx_at("chdir", root)?;
    sys::pivot_root(Path::new("."), Path::new(".")).ctx("pivot_root")?;
    // The old root is now stacked on top of the new one; detach it and every host mount
    // under it.
    sys::umount2(Path::new("."), libc::MNT_DETACH).ctx("detach old root")?;
    sys::chdir(Path::new("/")).ctx("chdir /")?;
    // /proc/sys read-only: the namespaced knobs it exposes are not the sandbox's to change.
    let ps = Path::new("/proc/sys");
    sys::mount(Some("/proc/sys"), ps, None, libc::MS_BIND | libc::MS_REC, None).ctx("bind /proc/sys")?;
    sys::mount(
        None,
        ps,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
        None,
    )
    .ctx("remount /proc/sys read-only")
}

/// The generated `/etc` and directory skeleton of the `base` root (host `/usr` underneath),
/// written into `dir` (replaced atomically; built beside it under a name of this process's).
pub fn build_host_skel(dir: &Path) -> std::io::Result<()> {
    let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    write_host_skel(&tmp)?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&tmp, dir)
}

/// Feeds `out` everything [`write_host_skel`] reads from the host, entry by entry: the path,
/// and its type, mode, owner, size, inode and change time (a write, `chmod`, `chown` or
/// replacement of an entry changes its ctime; a new entry adds a line). A symlink inside a
/// copied tree is only named: it cannot change in place, and replacing, adding or removing
/// one changes its directory's ctime (one `lstat` fewer for each of the hundreds of links in
/// `/etc/ssl` and `/etc/alternatives`). Two skeletons written from inputs that fed the same
/// bytes (and by the same code) are the same.
pub fn host_skel_inputs(out: &mut dyn FnMut(&[u8])) {
    fn entry(p: &Path, out: &mut dyn FnMut(&[u8])) {
        out(p.as_os_str().as_encoded_bytes());
        let Ok(md) = fs::symlink_metadata(p) else {
            out(b"\0-\n");
            return;
        };
        let line = format!(
            "\0{:o} {}:{} {} {}:{} {}.{}\n",
            md.mode(),
            md.uid(),
            md.gid(),
            md.size(),
            md.dev(),
            md.ino(),
            md.ctime(),
            md.ctime_nsec()
        );
        out(line.as_bytes());
        if md.is_dir() {
            // Sorted: the order read_dir gives may differ between two equal trees.
            let mut children: Vec<_> = fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| (e.file_name(), e.file_type().is_ok_and(|t| t.is_symlink())))
                .collect();
            children.sort();
            for (name, link) in children {
                let c = p.join(name);
                if link {
                    out(c.as_os_str().as_encoded_bytes());
                    out(b"\0l\n");
                } else {
                    entry(&c, out);
                }
            }
        }
    }
    for l in SKEL_LINKS {
        entry(&Path::new("/").join(l), out);
    }
    for name in HOST_ETC {
        entry(&Path::new("/etc").join(name), out);
    }
}

/// Writes the skeleton (see [`build_host_skel`]) into the new directory `tmp`.
pub fn write_host_skel(tmp: &Path) -> std::io::Result<()> {
    fs::create_dir_all(tmp)?;
    for (p, mode) in SKEL_DIRS {
        let path = tmp.join(p);
        fs::create_dir_all(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode))?;
        std::os::unix::fs::chown(&path, Some(0), Some(0))?;
    }
    for l in SKEL_LINKS {
        if let Ok(t) = fs::read_link(Path::new("/").join(l)) {
            symlink(t, tmp.join(l))?;
        }
    }
    let etc = tmp.join("etc");
    for name in HOST_ETC {
        let src = Path::new("/etc").join(name);
        if fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &etc.join(name))?;
        }
    }
    let files: [(&str, &str); 6] = [
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        ),
        ("group", "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n"),
        ("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tglovebox\n"),
        ("hostname", "glovebox\n"),
        ("resolv.conf", ""),
        ("machine-id", "00000000000000000000000000000000\n"),
    ];
    for (name, body) in files {
        let p = etc.join(name);
        let _ = fs::remove_file(&p);
        fs::write(&p, body)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// `/etc` entries programs on the host's `/usr` expect (dynamic linker cache, alternatives
/// symlinks, TLS roots, name service and locale configuration). Nothing secret.
const HOST_ETC: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
    "protocols",
    "services",
    "networks",
    "os-release",
    "debian_version",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "host.conf",
    "gai.conf",
    "shells",
    "login.defs",
    "magic",
    "magic.mime",
    "python3",
    "python3.11",
    "perl",
    "environment",
    "locale.alias",
    "mke2fs.conf",
    "papersize",
    // R's and the JDK's configuration (their trees under /usr link here), fontconfig's.
    "R",
    "java-17-openjdk",
    "fonts",
];

fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    let md = fs::symlink_metadata(src)?;
    if md.file_type().is_symlink() {
        symlink(fs::read_link(src)?, dst)
    } else if md.is_dir() {
        fs::create_dir_all(dst)?;
        fs::set_permissions(dst, md.permissions())?;
        for e in fs::read_dir(src)? {
            let e = e?;
            copy_tree(&e.path(), &dst.join(e.file_name()))?;
        }
        Ok(())
    } else if md.is_file() {
        // World-readable files only: a host file that is private stays private.
        if md.permissions().mode() & 0o004 == 0 {
            return Ok(());
        }
        fs::copy(src, dst).map(drop)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_cap_scales_with_disk() {
        assert_eq!(inode_cap(1 << 20), 16 * 1024);
        assert_eq!(inode_cap(1 << 32), (1 << 32) / 4096);
    }

    #[test]
    fn flat_root_covers_the_skeleton() {
        // What a flat root makes (SKEL_DIRS, SKEL_LINKS), overlays (SKEL_OVERLAID) and binds
        // (SKEL_BOUND) is the whole skeleton, with the daemon's kernels as it adds them.
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("skel");
        build_host_skel(&dir).unwrap();
        fs::create_dir_all(dir.join("opt/glovebox/kernels")).unwrap();
        fs::write(dir.join("opt/glovebox/kernels/k.py"), "").unwrap();
        fn walk(dir: &Path, rel: &Path, out: &mut Vec<(PathBuf, fs::FileType)>) {
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let (p, ft) = (rel.join(e.file_name()), e.file_type().unwrap());
                if !SKEL_OVERLAID.iter().chain(SKEL_BOUND.iter()).any(|o| p.starts_with(o)) {
                    out.push((p.clone(), ft));
                    if ft.is_dir() {
                        walk(&e.path(), &p, out);
                    }
                }
            }
        }
        let mut entries = Vec::new();
        walk(&dir, Path::new(""), &mut entries);
        for (p, ft) in &entries {
            let name = p.to_str().unwrap();
            if ft.is_dir() {
                let mode = fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
                assert_eq!(SKEL_DIRS.iter().find(|d| d.0 == name).map(|d| d.1), Some(mode), "{name}");
            } else {
                assert!(ft.is_symlink() && SKEL_LINKS.contains(&name), "{name} is neither made nor overlaid");
            }
        }
        for (d, _) in SKEL_DIRS {
            assert!(entries.iter().any(|(p, _)| p == Path::new(d)) || SKEL_OVERLAID.contains(d), "{d}");
        }
    }

    #[test]
    fn skel_has_no_private_host_files() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("skel");
        build_host_skel(&dir).unwrap();
        assert!(dir.join("etc/passwd").is_file());
        assert!(!dir.join("etc/shadow").exists());
        let passwd = fs::read_to_string(dir.join("etc/passwd")).unwrap();
        assert!(passwd.starts_with("root:x:0:0"));
        assert_eq!(fs::metadata(dir.join("tmp")).unwrap().permissions().mode() & 0o7777, 0o1777);
        // Rebuilding replaces it.
        build_host_skel(&dir).unwrap();
        assert!(!dir.with_extension(format!("tmp-{}", std::process::id())).exists());
    }
}
