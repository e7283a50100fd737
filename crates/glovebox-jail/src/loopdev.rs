//! Loop devices for volume images, in-process: attach an image file to a free loop device
//! (`LOOP_CTL_GET_FREE`, `LOOP_CONFIGURE`) and mount its filesystem, without `losetup` or
//! `mount`.
//!
//! Invariants:
//! - An image is never attached twice: a device already bound to it (its filesystem still
//!   alive, e.g. in a dying sandbox's mount namespace) is mounted again, which joins that
//!   filesystem instance; two devices on one image would be two ext4 instances on one disk.
//! - Devices are attached with `LO_FLAGS_AUTOCLEAR`: the kernel detaches one once its last
//!   user (the filesystem, or our open descriptor before the mount) is gone, so nothing
//!   here ever detaches one and a failed mount leaves nothing attached.
//! - A device is held open from the check of its backing file to the end of the mount, so it
//!   cannot be cleared and rebound to another file in between.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sys;

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn zero_info() -> LoopInfo64 {
    LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    }
}

fn open_rw(p: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(p)
}

/// Whether the open loop device `dev` is bound to the file with this device and inode.
fn bound_to(dev: &File, st_dev: u64, st_ino: u64) -> bool {
    let mut info = zero_info();
    // SAFETY: LOOP_GET_STATUS64 writes one `struct loop_info64` into `info`, which is a
    // properly sized and aligned `repr(C)` copy of it that lives across the call.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, &mut info as *mut LoopInfo64) };
    r == 0 && info.lo_inode == st_ino && info.lo_device == st_dev && info.lo_offset == 0
}

/// Loop devices whose sysfs `backing_file` names `image` (canonical path).
fn candidates(image: &Path) -> Vec<PathBuf> {
    let want = image.to_string_lossy();
    let Ok(rd) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            (name.starts_with("loop") && backing.trim_end() == want).then(|| PathBuf::from("/dev").join(name))
        })
        .collect()
}

/// Attaches `image` to a free loop device (autoclear); returns the device, held open
/// (read-only).
fn attach_new(image: &Path) -> io::Result<(PathBuf, File)> {
    let ctl = open_rw(Path::new("/dev/loop-control"))?;
    let backing = open_rw(image)?;
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = open_rw(&path)?;
        let cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 { lo_flags: LO_FLAGS_AUTOCLEAR, ..zero_info() },
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, of which `cfg` is a `repr(C)`
        // copy that lives across the call; its `fd` is open (`backing`) for the call, and the
        // kernel takes its own reference to the file.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) };
        if r == 0 {
            // The hold kept until the mount is read-only: a kernel that refuses to mount a
            // block device open for writing (CONFIG_BLK_DEV_WRITE_MOUNTED=n) accepts it.
            let hold = File::open(&path)?;
            return Ok((path, hold));
        }
        let e = io::Error::last_os_error();
        // Another process took the free device first: ask again.
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
    }
    Err(io::Error::new(io::ErrorKind::ResourceBusy, "no free loop device after 16 tries"))
}

/// Mounts the filesystem (`fstype`) in the image file `image` on `target` with `flags`,
/// through the loop device already bound to the image or a new one. Returns the device.
pub fn mount_image(image: &Path, target: &Path, fstype: &str, flags: libc::c_ulong) -> io::Result<PathBuf> {
    let image = std::fs::canonicalize(image)?;
    let md = std::fs::metadata(&image)?;
    for dev_path in candidates(&image) {
        let Ok(dev) = File::open(&dev_path) else { continue };
        if !bound_to(&dev, md.dev(), md.ino()) {
            continue;
        }
        // Held open: the device stays bound to the image until the mount has its own hold.
        sys::mount(Some(&dev_path.to_string_lossy()), target, Some(fstype), flags, None)?;
        return Ok(dev_path);
    }
    let (dev_path, dev) = attach_new(&image)?;
    let r = sys::mount(Some(&dev_path.to_string_lossy()), target, Some(fstype), flags, None);
    // On failure, closing the only hold detaches the device (autoclear).
    drop(dev);
    r.map(|()| dev_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structs_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    /// As root: a second mount of an image reuses its device (one filesystem instance); the
    /// device is gone once both mounts are.
    #[test]
    fn an_image_is_attached_once() {
        let root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
            .unwrap_or(false);
        if !root || !Path::new("/dev/loop-control").exists() {
            eprintln!("SKIPPED: needs root and loop devices");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let img = t.path().join("img");
        std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
        let ok = std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img).status().unwrap();
        assert!(ok.success());
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let flags = libc::MS_NOSUID | libc::MS_NODEV;
        let da = mount_image(&img, &a, "ext4", flags).unwrap();
        std::fs::write(a.join("f"), "x").unwrap();
        let db = mount_image(&img, &b, "ext4", flags).unwrap();
        assert_eq!(da, db, "the second mount reuses the device");
        assert_eq!(std::fs::read_to_string(b.join("f")).unwrap(), "x", "one filesystem instance");
        sys::umount2(&a, 0).unwrap();
        sys::umount2(&b, 0).unwrap();
        let canon = std::fs::canonicalize(&img).unwrap();
        let mut gone = false;
        for _ in 0..100 {
            if candidates(&canon).is_empty() {
                gone = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone, "the device is detached once unmounted (autoclear)");
        // A mount that fails (not a filesystem) leaves no device attached.
        let junk = t.path().join("junk");
        std::fs::File::create(&junk).unwrap().set_len(1 << 20).unwrap();
        assert!(mount_image(&junk, &a, "ext4", flags).is_err());
        let canon = std::fs::canonicalize(&junk).unwrap();
        let mut gone = false;
        for _ in 0..100 {
            if candidates(&canon).is_empty() {
                gone = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone, "a failed mount leaves no device");
    }
}
