//! Loop devices: attaching the volume image to a free one, and finding the
//! one it is attached to already.

use std::{
    fs::{File, OpenOptions},
    io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use super::plan;

const LOOP_GET_STATUS64: u32 = 0x4C05;
const LOOP_CONFIGURE: u32 = 0x4C0A;
const LOOP_CTL_GET_FREE: u32 = 0x4C82;

/// Detach the device once nothing holds it (the filesystem is unmounted
/// everywhere): a stopped volume leaves no device behind.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Bypass the page cache for the image: the filesystem above caches
/// already, so without this every block would sit in memory twice.
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64`.
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

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn zeroed_info() -> LoopInfo64 {
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

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The (device, inode) of the file behind loop device `dev`.
fn backing_ids(dev: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let mut info = zeroed_info();
    // SAFETY: LOOP_GET_STATUS64 fills a struct loop_info64.
    cvt(unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            LOOP_GET_STATUS64 as libc::Ioctl,
            &mut info as *mut LoopInfo64,
        )
    })?;
    Ok((info.lo_device, info.lo_inode))
}

/// The loop device `image` is attached to, if any. The sysfs name is only
/// a hint; the device's own record of the file's device and inode decides.
pub fn find_attached(image: &Path) -> io::Result<Option<PathBuf>> {
    let meta = std::fs::metadata(image)?;
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Ok(None);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("loop")) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        if plan::parse_backing_file(&text).as_deref() != Some(image) {
            continue;
        }
        let dev = PathBuf::from("/dev").join(name);
        let Ok(file) = File::open(&dev) else {
            continue;
        };
        if backing_ids(file.as_fd())? == (meta.dev(), meta.ino()) {
            return Ok(Some(dev));
        }
    }
    Ok(None)
}

/// Whether loop device `dev` is backed by `image` (same device and inode).
pub fn is_backed_by(dev: &Path, image: &Path) -> io::Result<bool> {
    let meta = std::fs::metadata(image)?;
    let file = File::open(dev)?;
    Ok(backing_ids(file.as_fd())? == (meta.dev(), meta.ino()))
}

/// Attaches `image` to a free loop device (autoclear, direct I/O) and
/// returns the device's path with an open handle; the caller mounts it,
/// after which the handle may be dropped.
pub fn attach(image: &Path) -> io::Result<(PathBuf, File)> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // Another process may take the free device between GET_FREE and
    // CONFIGURE (EBUSY): ask again.
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let n = cvt(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as libc::Ioctl) })?;
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(dev) => dev,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let configure = |flags: u32| {
            let mut config = LoopConfig {
                fd: backing.as_raw_fd() as u32,
                block_size: 4096,
                info: zeroed_info(),
                reserved: [0; 8],
            };
            config.info.lo_flags = flags;
            let name = image.as_os_str().as_encoded_bytes();
            let n = name.len().min(63);
            config.info.lo_file_name[..n].copy_from_slice(&name[..n]);
            // SAFETY: LOOP_CONFIGURE takes a struct loop_config; the
            // backing fd stays open for the call (the kernel takes its own
            // reference).
            cvt(unsafe {
                libc::ioctl(
                    dev.as_raw_fd(),
                    LOOP_CONFIGURE as libc::Ioctl,
                    &config as *const LoopConfig,
                )
            })
        };
        let r = match configure(LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO) {
            // A backing filesystem without O_DIRECT (tmpfs) may refuse.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => configure(LO_FLAGS_AUTOCLEAR),
            r => r,
        };
        match r {
            Ok(_) => return Ok((path, dev)),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "no free loop device after 64 attempts (others keep taking them)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(size_of::<LoopInfo64>(), 232);
        assert_eq!(size_of::<LoopConfig>(), 304);
    }
}
