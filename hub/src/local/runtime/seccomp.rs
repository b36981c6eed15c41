//! The seccomp filter every workload process runs under, and the pre-exec
//! hook that installs it.
//!
//! Root inside a sandbox holds every capability of the sandbox's user
//! namespace, which is what lets a workload `apt install` or bind a port.
//! The kernel already refuses anything that needs capabilities in the
//! *initial* namespace, but much host-level or risky kernel surface is
//! reachable with namespaced capabilities alone (mounting, new user
//! namespaces, bpf, io_uring, ...). This filter closes that surface with
//! EPERM, which programs treat as "not allowed here" rather than crashing.
//!
//! The filter is a static classic-BPF program built at compile time, so
//! installing it between fork and exec allocates nothing.
//!
//! Deliberately allowed:
//! - `ptrace`: the PID namespace hides every process outside the sandbox,
//!   so only the sandbox's own processes can be traced (debuggers, strace).
//! - `unshare`/`clone` without `CLONE_NEWUSER`: new network, UTS or IPC
//!   namespaces grant nothing beyond what the sandbox's own namespaces
//!   already do (and mounting is denied, so new mount namespaces are
//!   inert). A *new user namespace* is denied: it is the usual entry point
//!   into kernel code that is otherwise root-only.
//! - `clone3` returns ENOSYS: its flags live in memory a filter cannot
//!   read, and libc falls back to `clone`, whose flags it can.
//!
//! Denied beyond whole syscalls: every btrfs ioctl (type byte 0x94) but
//! the VFS clone and dedupe calls that share the type byte. Any user may
//! create a btrfs subvolume in a directory it can write, and a new
//! subvolume escapes the qgroup limit that is the sandbox's disk quota
//! (`quota.rs`); the workspace's upper layer is on btrfs and reachable
//! under `/.sandhub/overlay`.

use std::io;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// x32 syscalls are x86_64 numbers with this bit set; a filter written for
/// the 64-bit numbers would not see them.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Syscalls that get EPERM.
const DENIED: &[libc::c_long] = &[
    // Replacing or extending the running kernel.
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    // Kernel introspection and large attack surfaces.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_lookup_dcookie,
    libc::SYS_syslog,
    // File handles bypass path-based confinement.
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    // The kernel keyring is not namespaced.
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
    // Host-wide state: accounting, swap, power, clocks, quotas.
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_nfsservctl,
    libc::SYS_vhangup,
    // The mount table: a workload could otherwise remount the read-only
    // host binds writable (sandboxd keeps this right, for workspace reset).
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    467, // open_tree_attr (Linux 6.15; same number on every architecture)
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
];

/// Architecture-specific additions to [`DENIED`].
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: &[libc::c_long] = &[
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_uselib,
    // create_module, get_kernel_syms, query_module: removed from the
    // kernel (ENOSYS anyway); listed so the numbers stay closed.
    174,
    177,
    178,
];

#[cfg(not(target_arch = "x86_64"))]
const DENIED_ARCH: &[libc::c_long] = &[];

// Classic BPF opcodes (linux/filter.h).
const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
#[cfg(target_arch = "x86_64")]
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

// Offsets into struct seccomp_data.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of args[0] (little-endian).
const OFF_ARG0: u32 = 16;
/// Low 32 bits of args[1]: an ioctl's command (an `unsigned int` to the
/// kernel, so the high half is never looked at).
const OFF_ARG1: u32 = 24;

/// The ioctl type byte of btrfs (`BTRFS_IOCTL_MAGIC`), in place.
const BTRFS_IOCTL_TYPE: u32 = 0x94 << 8;
/// `FICLONE`, `FICLONERANGE`, `FIDEDUPERANGE`: generic reflink calls (what
/// `cp --reflink` uses) that kept btrfs's type byte; they create nothing
/// but shared extents, which the quota counts.
const ALLOWED_BTRFS_TYPE_IOCTLS: [u32; 3] = [0x4004_9409, 0x4020_940D, 0xC018_9436];

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

#[cfg(target_arch = "x86_64")]
const HEADER: usize = 6;
#[cfg(not(target_arch = "x86_64"))]
const HEADER: usize = 4;
/// ioctl (9) + clone3 (2) + unshare (5) + clone (5) + final allow (1).
const TAIL: usize = 22;
const LEN: usize = HEADER + 2 * (DENIED.len() + DENIED_ARCH.len()) + TAIL;

const fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Writes "if the syscall is `nr` and args[0] has `flag`, EPERM, else
/// ALLOW; if it is not `nr`, fall through" at `i`. Five instructions.
const fn deny_flag(f: &mut [libc::sock_filter; LEN], i: usize, nr: u32, flag: u32) -> usize {
    f[i] = ins(JEQ_K, 0, 4, nr);
    f[i + 1] = ins(LD_W_ABS, 0, 0, OFF_ARG0);
    f[i + 2] = ins(JSET_K, 0, 1, flag);
    f[i + 3] = ins(RET_K, 0, 0, RET_EPERM);
    f[i + 4] = ins(RET_K, 0, 0, RET_ALLOW);
    i + 5
}

/// Writes "if the syscall is ioctl: ALLOW the clone/dedupe commands, EPERM
/// any other command of the btrfs type, ALLOW the rest; otherwise fall
/// through" at `i`. Nine instructions; every ioctl path returns, so the
/// accumulator holding the command never reaches later checks.
const fn deny_btrfs_ioctls(f: &mut [libc::sock_filter; LEN], i: usize) -> usize {
    f[i] = ins(JEQ_K, 0, 8, libc::SYS_ioctl as u32);
    f[i + 1] = ins(LD_W_ABS, 0, 0, OFF_ARG1);
    f[i + 2] = ins(JEQ_K, 5, 0, ALLOWED_BTRFS_TYPE_IOCTLS[0]);
    f[i + 3] = ins(JEQ_K, 4, 0, ALLOWED_BTRFS_TYPE_IOCTLS[1]);
    f[i + 4] = ins(JEQ_K, 3, 0, ALLOWED_BTRFS_TYPE_IOCTLS[2]);
    f[i + 5] = ins(AND_K, 0, 0, 0xff00);
    f[i + 6] = ins(JEQ_K, 0, 1, BTRFS_IOCTL_TYPE);
    f[i + 7] = ins(RET_K, 0, 0, RET_EPERM);
    f[i + 8] = ins(RET_K, 0, 0, RET_ALLOW);
    i + 9
}

const fn build() -> [libc::sock_filter; LEN] {
    let mut f = [ins(RET_K, 0, 0, RET_KILL); LEN];
    let mut i = 0;
    // A foreign architecture (e.g. int 0x80 from a 64-bit process) would
    // be matched against the wrong syscall numbers: kill it outright.
    f[i] = ins(LD_W_ABS, 0, 0, OFF_ARCH);
    f[i + 1] = ins(JEQ_K, 1, 0, AUDIT_ARCH);
    f[i + 2] = ins(RET_K, 0, 0, RET_KILL);
    f[i + 3] = ins(LD_W_ABS, 0, 0, OFF_NR);
    i += 4;
    #[cfg(target_arch = "x86_64")]
    {
        f[i] = ins(JGE_K, 0, 1, X32_SYSCALL_BIT);
        f[i + 1] = ins(RET_K, 0, 0, RET_EPERM);
        i += 2;
    }
    let mut d = 0;
    while d < DENIED.len() {
        f[i] = ins(JEQ_K, 0, 1, DENIED[d] as u32);
        f[i + 1] = ins(RET_K, 0, 0, RET_EPERM);
        i += 2;
        d += 1;
    }
    d = 0;
    while d < DENIED_ARCH.len() {
        f[i] = ins(JEQ_K, 0, 1, DENIED_ARCH[d] as u32);
        f[i + 1] = ins(RET_K, 0, 0, RET_EPERM);
        i += 2;
        d += 1;
    }
    i = deny_btrfs_ioctls(&mut f, i);
    f[i] = ins(JEQ_K, 0, 1, libc::SYS_clone3 as u32);
    f[i + 1] = ins(RET_K, 0, 0, RET_ENOSYS);
    i += 2;
    let newuser = libc::CLONE_NEWUSER as u32;
    i = deny_flag(&mut f, i, libc::SYS_unshare as u32, newuser);
    // clone's flags are its first argument on x86_64 and aarch64.
    i = deny_flag(&mut f, i, libc::SYS_clone as u32, newuser);
    f[i] = ins(RET_K, 0, 0, RET_ALLOW);
    assert!(i + 1 == LEN);
    f
}

static FILTER: [libc::sock_filter; LEN] = build();

/// Sets `no_new_privs` and installs the filter on the calling thread (and
/// everything it execs or forks). Async-signal-safe: no allocation, only
/// two prctl calls on static data, so it may run between fork and exec.
pub fn install_seccomp() -> io::Result<()> {
    set_no_new_privs()?;
    let prog = libc::sock_fprog {
        len: LEN as libc::c_ushort,
        filter: FILTER.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at a valid, static filter of `len`
    // instructions; the kernel copies it before returning.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog as *const libc::sock_fprog as libc::c_ulong,
            0,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes plain integers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The pre-exec hook for every process sandboxd starts: gives up the
/// OOM protection sandboxd inherited (so the OOM killer picks the workload,
/// never the daemon), then `no_new_privs` and the seccomp filter.
/// Async-signal-safe.
pub fn child_setup() -> io::Result<()> {
    // Raising oom_score_adj needs no privilege. A failure (no /proc) must
    // not keep a command from running, so it is ignored.
    const PATH: &[u8] = b"/proc/self/oom_score_adj\0";
    // SAFETY: PATH is NUL-terminated; open/write/close are
    // async-signal-safe and the fd is closed on every path.
    unsafe {
        let fd = libc::open(PATH.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let _ = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
        }
    }
    install_seccomp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_shape() {
        // Starts by checking the architecture, ends allowing.
        assert_eq!(FILTER[0].k, OFF_ARCH);
        assert_eq!(FILTER[1].k, AUDIT_ARCH);
        assert_eq!(FILTER[LEN - 1].k, RET_ALLOW);
        // Every denied syscall is followed by an EPERM return.
        for nr in DENIED.iter().chain(DENIED_ARCH) {
            let at = FILTER
                .iter()
                .position(|f| f.code == JEQ_K && f.k == *nr as u32)
                .unwrap();
            assert_eq!(FILTER[at + 1].k, RET_EPERM, "syscall {nr}");
        }
        const { assert!(LEN < 4096, "classic BPF limit") };
    }

    /// Runs the filter on one syscall, as the kernel would.
    fn verdict(nr: i64, arg0: u64, arg1: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH.to_le_bytes());
        data[16..24].copy_from_slice(&arg0.to_le_bytes());
        data[24..32].copy_from_slice(&arg1.to_le_bytes());
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let f = FILTER[pc];
            pc += 1;
            match f.code {
                LD_W_ABS => {
                    let k = f.k as usize;
                    a = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                AND_K => a &= f.k,
                RET_K => return f.k,
                _ => {
                    let taken = match f.code {
                        JEQ_K => a == f.k,
                        JGE_K => a >= f.k,
                        JSET_K => a & f.k != 0,
                        other => panic!("unexpected opcode {other:#x}"),
                    };
                    pc += if taken { f.jt } else { f.jf } as usize;
                }
            }
        }
    }

    #[test]
    fn btrfs_ioctls_are_denied_but_reflinks_are_not() {
        let ioctl = libc::SYS_ioctl;
        // BTRFS_IOC_SUBVOL_CREATE, SUBVOL_CREATE_V2, SNAP_CREATE_V2.
        for cmd in [0x5000_940E_u64, 0x5000_9418, 0x5000_9417] {
            assert_eq!(verdict(ioctl, 3, cmd), RET_EPERM, "{cmd:#x}");
            // The kernel reads an unsigned int: high bits change nothing.
            assert_eq!(verdict(ioctl, 3, cmd | 0xffff_ffff_0000_0000), RET_EPERM);
        }
        for cmd in ALLOWED_BTRFS_TYPE_IOCTLS {
            assert_eq!(verdict(ioctl, 3, cmd as u64), RET_ALLOW, "{cmd:#x}");
        }
        // Other ioctls: TCGETS, FS_IOC_GETFLAGS.
        assert_eq!(verdict(ioctl, 0, 0x5401), RET_ALLOW);
        assert_eq!(verdict(ioctl, 3, 0x8008_6601), RET_ALLOW);
        // The rest of the filter still sees syscall numbers.
        assert_eq!(verdict(libc::SYS_mount, 0, 0), RET_EPERM);
        assert_eq!(verdict(libc::SYS_read, 0x9400, 0x9400), RET_ALLOW);
        assert_eq!(
            verdict(libc::SYS_unshare, libc::CLONE_NEWUSER as u64, 0),
            RET_EPERM
        );
    }
}
