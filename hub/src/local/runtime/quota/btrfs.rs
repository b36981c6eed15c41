//! The btrfs ioctls disk quotas need: subvolumes (one per sandbox) and
//! qgroup limits on them. Layouts and numbers follow
//! `include/uapi/linux/btrfs.h`; the unit tests pin both.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

/// `BTRFS_SUPER_MAGIC`, the `f_type` statfs reports for btrfs.
pub const SUPER_MAGIC: i64 = 0x9123_683E;
/// The inode number of every subvolume's root directory.
pub const FIRST_FREE_OBJECTID: u64 = 256;
/// The ioctl type byte of every btrfs ioctl (and of the VFS ones hoisted
/// from it: FICLONE, FICLONERANGE, FIDEDUPERANGE, FS_IOC_[GS]ETFSLABEL).
pub const IOCTL_MAGIC: u32 = 0x94;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (IOCTL_MAGIC << 8) | nr
}

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_vol_args_v2` (the qgroup-inherit union left zero).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; 4040],
}

/// `BTRFS_SUBVOL_RDONLY`: the snapshot is read-only from birth.
const SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args`.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; 16],
    reserved: [u8; 944],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

const IOC_SUBVOL_CREATE: u32 = ioc(IOC_WRITE, 14, size_of::<VolArgs>());
const IOC_SNAP_DESTROY: u32 = ioc(IOC_WRITE, 15, size_of::<VolArgs>());
const IOC_SNAP_CREATE_V2: u32 = ioc(IOC_WRITE, 23, size_of::<VolArgsV2>());
const IOC_INO_LOOKUP: u32 = ioc(IOC_READ | IOC_WRITE, 18, size_of::<InoLookupArgs>());
const IOC_FS_INFO: u32 = ioc(IOC_READ, 31, size_of::<FsInfoArgs>());
const IOC_QUOTA_CTL: u32 = ioc(IOC_READ | IOC_WRITE, 40, size_of::<QuotaCtlArgs>());
// _IOR in the kernel's header, although the kernel only reads the argument.
const IOC_QGROUP_LIMIT: u32 = ioc(IOC_READ, 43, size_of::<QgroupLimitArgs>());

const QUOTA_CTL_ENABLE: u64 = 1;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`: limit the bytes a subvolume references
/// (what its files take, shared extents included), so a reflinked copy
/// counts in full for each side and deleting files frees the quota.
const QGROUP_LIMIT_MAX_RFER: u64 = 1;

/// `ioctl(fd, cmd, arg)`.
///
/// # Safety
/// `arg` must be the structure `cmd` expects, valid for reads and writes.
unsafe fn ioctl<T>(fd: BorrowedFd<'_>, cmd: u32, arg: &mut T) -> io::Result<()> {
    // SAFETY: the caller passes the structure the command is defined with.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as libc::Ioctl, arg as *mut T) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn vol_args(name: &str) -> io::Result<Box<VolArgs>> {
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; 4088],
    });
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= args.name.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad subvolume name {name:?}"),
        ));
    }
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

/// Creates the subvolume `parent/name` (a directory to everyone else).
pub fn create_subvolume(parent: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let mut args = vol_args(name)?;
    // SAFETY: SUBVOL_CREATE takes a btrfs_ioctl_vol_args.
    unsafe { ioctl(parent, IOC_SUBVOL_CREATE, &mut *args) }
}

/// Deletes the subvolume `parent/name` and everything in it at once (the
/// space is reclaimed in the background). Fails with ENOTEMPTY when it
/// holds other subvolumes.
pub fn destroy_subvolume(parent: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let mut args = vol_args(name)?;
    // SAFETY: SNAP_DESTROY takes a btrfs_ioctl_vol_args.
    unsafe { ioctl(parent, IOC_SNAP_DESTROY, &mut *args) }
}

/// Makes `parent/name` a snapshot of the subvolume whose root is
/// `source`: read-only with `read_only`, else a writable copy. Either way
/// it shares every block with its source until one side changes it, and
/// is made at once whatever its size.
pub fn snapshot_subvolume(
    source: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    name: &str,
    read_only: bool,
) -> io::Result<()> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= 4040 || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad subvolume name {name:?}"),
        ));
    }
    let mut args = Box::new(VolArgsV2 {
        fd: i64::from(source.as_raw_fd()),
        transid: 0,
        flags: if read_only { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; 4040],
    });
    args.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: SNAP_CREATE_V2 takes a btrfs_ioctl_vol_args_v2.
    unsafe { ioctl(parent, IOC_SNAP_CREATE_V2, &mut *args) }
}

/// The id of the subvolume `fd` lies in (its qgroup is `0/<id>`).
pub fn subvolume_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut args = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: FIRST_FREE_OBJECTID,
        name: [0; 4080],
    });
    // SAFETY: INO_LOOKUP takes a btrfs_ioctl_ino_lookup_args; with treeid
    // 0 and the subvolume root's objectid it only fills in treeid.
    unsafe { ioctl(fd, IOC_INO_LOOKUP, &mut *args) }?;
    Ok(args.treeid)
}

/// The filesystem's UUID (how `/sys/fs/btrfs/` names it).
pub fn fsid(fd: BorrowedFd<'_>) -> io::Result<[u8; 16]> {
    // SAFETY: FsInfoArgs is plain integers and bytes; all zero is valid.
    let mut args: Box<FsInfoArgs> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: FS_INFO takes a btrfs_ioctl_fs_info_args.
    unsafe { ioctl(fd, IOC_FS_INFO, &mut *args) }?;
    Ok(args.fsid)
}

/// Turns qgroup accounting and limits on (a no-op when they are on).
pub fn enable_quota(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut args = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: QUOTA_CTL takes a btrfs_ioctl_quota_ctl_args.
    unsafe { ioctl(fd, IOC_QUOTA_CTL, &mut args) }
}

/// Caps what subvolume `id` may reference at `bytes` (writes beyond fail
/// with EDQUOT).
pub fn limit_qgroup(fd: BorrowedFd<'_>, id: u64, bytes: u64) -> io::Result<()> {
    let mut args = QgroupLimitArgs {
        qgroupid: id,
        lim: QgroupLimit {
            flags: QGROUP_LIMIT_MAX_RFER,
            max_rfer: bytes,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    // SAFETY: QGROUP_LIMIT takes a btrfs_ioctl_qgroup_limit_args.
    unsafe { ioctl(fd, IOC_QGROUP_LIMIT, &mut args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(size_of::<VolArgs>(), 4096);
        assert_eq!(size_of::<InoLookupArgs>(), 4096);
        assert_eq!(size_of::<VolArgsV2>(), 4096);
        assert_eq!(std::mem::offset_of!(VolArgsV2, name), 56);
        assert_eq!(size_of::<FsInfoArgs>(), 1024);
        assert_eq!(std::mem::offset_of!(FsInfoArgs, fsid), 16);
        assert_eq!(size_of::<QuotaCtlArgs>(), 16);
        assert_eq!(size_of::<QgroupLimitArgs>(), 48);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel() {
        // As strace prints them.
        assert_eq!(IOC_SUBVOL_CREATE, 0x5000_940E);
        assert_eq!(IOC_SNAP_DESTROY, 0x5000_940F);
        assert_eq!(IOC_INO_LOOKUP, 0xD000_9412);
        assert_eq!(IOC_SNAP_CREATE_V2, 0x5000_9417);
        assert_eq!(IOC_FS_INFO, 0x8400_941F);
        assert_eq!(IOC_QUOTA_CTL, 0xC010_9428);
        assert_eq!(IOC_QGROUP_LIMIT, 0x8030_942B);
    }

    #[test]
    fn names_are_checked() {
        assert!(vol_args("sb-1").is_ok());
        assert!(vol_args("").is_err());
        assert!(vol_args("a\0b").is_err());
        assert!(vol_args(&"x".repeat(4088)).is_err());
    }
}
