//! The pure decisions behind disk quotas: sizes, names, what the mount
//! table says and what to do at hub start. No I/O here, so all of it is
//! unit-tested without root.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub const MIB: u64 = 1 << 20;

/// mkfs.btrfs refuses devices much below ~110 MiB (single profiles); a
/// volume this small would hold little more than its own metadata.
pub const MIN_VOLUME_BYTES: u64 = 256 * MIB;

/// The size of a new volume image. With no operator choice: nine tenths of
/// what is free on the host filesystem now, so sandboxes that fill the
/// whole volume still leave the host a tenth of its free space. The image
/// is sparse: it takes host space only as sandboxes write.
pub fn volume_size(flag_mb: Option<u64>, host_avail: u64) -> Result<u64, String> {
    let bytes = match flag_mb {
        Some(mb) => mb
            .checked_mul(MIB)
            .ok_or_else(|| format!("--disk-volume-mb {mb} is too large"))?,
        None => host_avail / 10 * 9,
    };
    if bytes < MIN_VOLUME_BYTES {
        return Err(match flag_mb {
            Some(mb) => format!(
                "--disk-volume-mb {mb} is below the minimum of {} MiB",
                MIN_VOLUME_BYTES / MIB
            ),
            None => format!(
                "only {} MiB are free for the sandboxes' disk volume; at least {} MiB are needed \
                 (free space, or pass --disk-volume-mb)",
                host_avail / MIB,
                MIN_VOLUME_BYTES * 10 / 9 / MIB
            ),
        });
    }
    Ok(bytes)
}

/// A quota in MiB as the byte limit the filesystem enforces.
pub fn limit_bytes(disk_mb: u64) -> u64 {
    disk_mb.saturating_mul(MIB)
}

/// Where the volume of `state_dir` is mounted: `run_dir/<hash of the
/// state dir>`, deliberately *outside* the state dir. Every process on the
/// host sees a mount of the host's namespace in its mount table, and
/// whoever cleans up after a hub (its tests, an operator) finds the hub's
/// sandbox processes by the state dir's path in their mount tables; a
/// volume mounted under the state dir would make every process match.
pub fn mount_point(run_dir: &Path, state_dir: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let digest = Sha256::digest(state_dir.as_os_str().as_bytes());
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    run_dir.join(name)
}

/// `/sys/block/loopN/loop/backing_file`: the image path, unless the file
/// was deleted (then it is not ours any more, whatever its old name).
pub fn parse_backing_file(text: &str) -> Option<PathBuf> {
    let path = text.strip_suffix('\n').unwrap_or(text);
    if path.is_empty() || path.ends_with(" (deleted)") {
        return None;
    }
    Some(PathBuf::from(path))
}

/// One line of `/proc/self/mountinfo`, the fields the volume needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// The mount on top at `mount_point` (later lines stack over earlier ones).
pub fn find_mount(mountinfo: &str, mount_point: &Path) -> Option<MountEntry> {
    mountinfo
        .lines()
        .rev()
        .filter_map(parse_mountinfo_line)
        .find(|m| m.mount_point == mount_point)
}

/// Every mount point in `mountinfo`, in its order.
pub fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo
        .lines()
        .filter_map(parse_mountinfo_line)
        .map(|m| m.mount_point)
}

/// `36 35 98:0 /root /mnt rw,noatime master:1 - ext4 /dev/sda1 rw`: the
/// fifth field is the mount point, then optional fields up to `-`, then
/// the filesystem type and the source.
fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let mut fields = line.split(' ');
    let mount_point = fields.nth(4)?;
    let mut rest = fields.skip_while(|f| *f != "-");
    rest.next()?;
    let fstype = rest.next()?;
    let source = rest.next()?;
    Some(MountEntry {
        mount_point: PathBuf::from(unescape(mount_point)),
        fstype: unescape(fstype),
        source: unescape(source),
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + (d - b'0') as u32);
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is at the volume's mount point now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtMountPoint {
    Nothing,
    /// A btrfs filesystem on the loop device backed by our image.
    OurVolume,
    /// Anything else: another filesystem, or a loop device of another file.
    Other(String),
}

/// How to bring the volume up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Mounted already (the hub restarted while sandboxes ran): use it.
    Reuse,
    /// The image is attached to this loop device but not mounted here (a
    /// hub that stopped cleanly while sandboxes kept running): mount that
    /// device. Attaching the image a second time would put two block
    /// devices under one filesystem.
    Mount(PathBuf),
    /// The image exists: attach it to a free loop device and mount it.
    AttachAndMount,
    /// First start: make the image, then attach and mount it.
    Create,
}

pub fn plan(
    at_mount_point: &AtMountPoint,
    attached: Option<&Path>,
    image_exists: bool,
) -> Result<Step, String> {
    match at_mount_point {
        AtMountPoint::OurVolume => return Ok(Step::Reuse),
        AtMountPoint::Other(what) => {
            return Err(format!(
                "{what} is mounted where the sandboxes' disk volume belongs"
            ))
        }
        AtMountPoint::Nothing => {}
    }
    Ok(match (attached, image_exists) {
        (Some(dev), _) => Step::Mount(dev.to_path_buf()),
        (None, true) => Step::AttachAndMount,
        (None, false) => Step::Create,
    })
}

/// A name the hub gives a directory on the volume (a sandbox or snapshot
/// id): one plain path component, so it can never reach outside its parent.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0']);
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a plain directory name"))
    }
}

/// The canonical text form of a filesystem UUID (as `/sys/fs/btrfs/` names it).
pub fn uuid_text(fsid: &[u8; 16]) -> String {
    let hex: Vec<String> = fsid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_size_defaults_to_nine_tenths_of_free_space() {
        assert_eq!(volume_size(None, 100 * 1024 * MIB), Ok(90 * 1024 * MIB));
        assert_eq!(volume_size(Some(4096), 0), Ok(4096 * MIB));
        assert!(volume_size(Some(100), u64::MAX)
            .unwrap_err()
            .contains("minimum"));
        assert!(volume_size(None, 200 * MIB).unwrap_err().contains("free"));
        assert!(volume_size(Some(u64::MAX), 0)
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn limits_never_overflow() {
        assert_eq!(limit_bytes(64), 64 * MIB);
        assert_eq!(limit_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn mount_point_is_outside_the_state_dir_and_stable() {
        let run = Path::new("/run/sandhub/volumes");
        let a = mount_point(run, Path::new("/tmp/sandhub-api-test-x1/state"));
        let b = mount_point(run, Path::new("/tmp/sandhub-api-test-x2/state"));
        assert_ne!(a, b);
        assert_eq!(
            a,
            mount_point(run, Path::new("/tmp/sandhub-api-test-x1/state"))
        );
        assert!(a.starts_with(run));
        assert!(!a.to_string_lossy().contains("sandhub-api-test"));
        assert_eq!(a.file_name().unwrap().len(), 16);
    }

    #[test]
    fn backing_files() {
        assert_eq!(
            parse_backing_file("/var/lib/sandhub/disk.img\n"),
            Some(PathBuf::from("/var/lib/sandhub/disk.img"))
        );
        assert_eq!(
            parse_backing_file("/var/lib/sandhub/disk.img (deleted)\n"),
            None
        );
        assert_eq!(parse_backing_file(""), None);
    }

    #[test]
    fn mountinfo_lines() {
        let text = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
98 22 0:51 / /run/sandhub/volumes/ab rw,nosuid shared:50 - btrfs /dev/loop3 rw,discard=async
99 22 0:52 / /run/with\\040space rw master:7 - tmpfs tmp\\134fs rw
100 98 0:53 / /run/sandhub/volumes/ab rw - tmpfs none rw
";
        let ab = Path::new("/run/sandhub/volumes/ab");
        // The last mount at a path is the one on top.
        assert_eq!(find_mount(text, ab).unwrap().fstype, "tmpfs");
        let first_two: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
        assert_eq!(
            find_mount(&first_two, ab),
            Some(MountEntry {
                mount_point: ab.into(),
                fstype: "btrfs".into(),
                source: "/dev/loop3".into()
            })
        );
        let spaced = find_mount(text, Path::new("/run/with space")).unwrap();
        assert_eq!(spaced.source, "tmp\\fs");
        assert_eq!(find_mount(text, Path::new("/nowhere")), None);
        assert_eq!(find_mount("garbage\n\n1 2 3\n", ab), None);
    }

    #[test]
    fn start_plan() {
        let dev = Path::new("/dev/loop7");
        use AtMountPoint::*;
        assert_eq!(plan(&OurVolume, None, true), Ok(Step::Reuse));
        assert_eq!(plan(&Nothing, Some(dev), true), Ok(Step::Mount(dev.into())));
        assert_eq!(plan(&Nothing, None, true), Ok(Step::AttachAndMount));
        assert_eq!(plan(&Nothing, None, false), Ok(Step::Create));
        assert!(plan(&Other("tmpfs".into()), None, true).is_err());
    }

    #[test]
    fn names_are_single_components() {
        for good in ["sb-1", "snap-abc", "a.b"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "/abs", "nul\0", &"x".repeat(256)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn uuids() {
        let fsid = [
            0x6c, 0xbd, 0x0e, 0xd2, 0x21, 0xf9, 0x4f, 0x11, 0xb6, 0xf7, 0x2e, 0xdb, 0xb6, 0x93,
            0x15, 0x30,
        ];
        assert_eq!(uuid_text(&fsid), "6cbd0ed2-21f9-4f11-b6f7-2edbb6931530");
    }
}
