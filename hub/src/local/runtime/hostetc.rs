//! The sandbox's `/etc` when a template brings no root filesystem: a copy
//! of the host's `/etc` without its secrets, prepared once per hub state
//! dir and bind-mounted read-only into every sandbox.
//!
//! Two filters apply. A denylist drops what is secret even when readable
//! (ssh host keys, `ssl/private`, ...) or misleading inside (`hostname`,
//! `machine-id`), and anything not readable by every user is dropped too,
//! which catches secrets the list does not know (`shadow`, `sudoers`,
//! VPN and Wi-Fi credentials, keytabs are all mode 0600/0640/0440).
//!
//! Copies are content-addressed (`<state>/host-etc/<fingerprint>`): a hub
//! restart on an unchanged host reuses the copy, a changed host gets a new
//! one, and a copy is never rewritten under a running sandbox's bind mount.

use std::{
    io,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::{error::annotate, idmap::IdMap};

/// Paths (relative to `/etc`) never copied. A trailing `*` matches a prefix.
const DENY: &[&str] = &[
    "shadow",
    "gshadow",
    "sudoers",
    "sudoers.d",
    "ssh/ssh_host_*",
    "ssl/private",
    "security/opasswd",
    "krb5.keytab",
    "ipsec.secrets",
    "ipsec.d/private",
    "ppp/chap-secrets",
    "ppp/pap-secrets",
    "NetworkManager/system-connections",
    "wpa_supplicant",
    "openvpn",
    "wireguard",
    "letsencrypt",
    "docker/key.json",
    "libvirt/secrets",
    "machine-id",
    "hostname",
];

/// Copied with the symlink resolved: the usual targets live under `/run`,
/// which sandboxes do not see.
const DEREFERENCE: &[&str] = &["resolv.conf"];

/// Builds (or finds) the sanitized copy of `/etc` under `state_root` and
/// returns its path.
pub fn prepare_host_etc(state_root: &Path) -> io::Result<PathBuf> {
    prepare_from(Path::new("/etc"), state_root)
}

/// The same copy for `network: egress` sandboxes, whose `resolv.conf`
/// names the gateway's DNS responder instead of the host's resolver (which
/// such a sandbox can never reach), made from `host_copy` (what
/// [`prepare_host_etc`] returned) by hard links: only the files written
/// here are new. The built-in `default` template is egress, so every hub
/// needs both: a second walk and copy of `/etc` (1245 entries here) cost
/// each hub's first egress create 180-240 ms in a debug build; the links
/// take 60-130 ms, and the runtime makes them on a thread at start.
///
/// With the hub's CA (brokered secrets), the copy also holds
/// `sandhub/ca.pem`, and the system bundle with the CA appended as
/// `sandhub/ca-bundle.pem` and in place of `ssl/certs/ca-certificates.crt`
/// (the trust store most tools read when no variable names another): the
/// CA signs only for the names whose secrets the gateway brokers, so
/// trusting it opens nothing else.
pub fn prepare_egress_etc(
    host_copy: &Path,
    resolv_conf: &str,
    ca_pem: Option<&str>,
) -> io::Result<PathBuf> {
    let mut files = vec![("resolv.conf", resolv_conf.to_string())];
    if let Some(ca) = ca_pem {
        let system = SYSTEM_BUNDLES
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        let bundle = format!("{}\n{ca}", system.trim_end());
        files.push((CA_FILE, ca.to_string()));
        files.push((CA_BUNDLE, bundle.clone()));
        if host_copy.join("ssl/certs/ca-certificates.crt").exists() {
            files.push(("ssl/certs/ca-certificates.crt", bundle));
        }
    }
    derive_with(host_copy, &files)
}

/// The hub's CA and the bundle with it, relative to `/etc`.
pub const CA_FILE: &str = "sandhub/ca.pem";
pub const CA_BUNDLE: &str = "sandhub/ca-bundle.pem";

/// Where hosts keep their CA bundle (Debian, Fedora, Alpine/others).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

pub(crate) fn prepare_from(etc: &Path, state_root: &Path) -> io::Result<PathBuf> {
    let parent = state_root.join("host-etc");
    std::fs::create_dir_all(&parent)
        .map_err(|e| annotate(format!("creating {}", parent.display()), e))?;
    let mut plan = Vec::new();
    walk(etc, Path::new(""), &mut plan)
        .map_err(|e| annotate(format!("reading {}", etc.display()), e))?;
    let final_dir = parent.join(format!("{:016x}", fingerprint(&plan)));
    if final_dir.is_dir() {
        return Ok(final_dir);
    }
    let tmp = parent.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let built = copy(etc, &tmp, &plan).and_then(|()| IdMap::for_current_user().shift_tree(&tmp));
    publish(
        built,
        &tmp,
        final_dir,
        format!("copying {} to {}", etc.display(), tmp.display()),
    )
}

/// `<host copy>-resolv-<hash>`: the host copy hard-linked entry by entry
/// (owners and modes as they are there, already shifted), with its own
/// `resolv.conf`. Both are only ever mounted read-only, and neither is
/// written once renamed into place, so sharing inodes shares nothing a
/// sandbox could change.
fn derive_with(host: &Path, files: &[(&str, String)]) -> io::Result<PathBuf> {
    let name = host
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other("the host /etc copy has no name"))?;
    let mut all = Vec::new();
    for (rel, content) in files {
        all.extend_from_slice(rel.as_bytes());
        all.push(0);
        all.extend_from_slice(content.as_bytes());
        all.push(0);
    }
    let final_dir = host.with_file_name(format!("{name}-with-{:016x}", fnv(&all)));
    if final_dir.is_dir() {
        return Ok(final_dir);
    }
    let tmp = host.with_file_name(format!(
        ".tmp-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let is_root = super::sys::effective_ids().0 == 0;
    // Owned like the copy's root: the sandbox's root.
    let top = std::fs::metadata(host)?;
    let own = |path: &Path| -> io::Result<()> {
        if is_root {
            std::os::unix::fs::lchown(path, Some(top.uid()), Some(top.gid()))?;
        }
        Ok(())
    };
    let built = link_tree(host, &tmp, is_root).and_then(|()| {
        for (rel, content) in files {
            let path = tmp.join(rel);
            if let Some(dir) = path.parent() {
                if !dir.is_dir() {
                    std::fs::create_dir_all(dir)?;
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
                    own(dir)?;
                }
            }
            // Unlinked first: writing through the link would change the
            // host copy, which `network: none` sandboxes mount.
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            std::fs::write(&path, content)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
            own(&path)?;
        }
        Ok(())
    });
    publish(
        built,
        &tmp,
        final_dir,
        format!("linking {} to {}", host.display(), tmp.display()),
    )
}

/// Directories made (mode and owner as in `src`), files hard-linked,
/// symlinks made again. `src` is a copy this hub made: no entry in it is
/// a workload's.
/// Moves a copy `built` in `tmp` to `final_dir` (content-addressed), or
/// removes it on failure. Another hub process that already put an identical
/// copy there won the race: that one is used.
fn publish(
    built: io::Result<()>,
    tmp: &Path,
    final_dir: PathBuf,
    building: String,
) -> io::Result<PathBuf> {
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(tmp);
        return Err(annotate(building, e));
    }
    match std::fs::rename(tmp, &final_dir) {
        Ok(()) => Ok(final_dir),
        Err(_) if final_dir.is_dir() => {
            let _ = std::fs::remove_dir_all(tmp);
            Ok(final_dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(tmp);
            Err(annotate(
                format!("renaming into {}", final_dir.display()),
                e,
            ))
        }
    }
}

fn link_tree(src: &Path, dst: &Path, is_root: bool) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    std::fs::create_dir(dst)?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    if is_root {
        std::os::unix::fs::lchown(dst, Some(meta.uid()), Some(meta.gid()))?;
    }
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let m = std::fs::symlink_metadata(&from)?;
        if m.is_dir() {
            link_tree(&from, &to, is_root)?;
        } else if m.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            if is_root {
                std::os::unix::fs::lchown(&to, Some(m.uid()), Some(m.gid()))?;
            }
        } else {
            std::fs::hard_link(&from, &to)?;
        }
    }
    Ok(())
}

#[derive(Debug)]
enum Kind {
    Dir,
    File,
    Symlink(PathBuf),
}

#[derive(Debug)]
struct Entry {
    rel: PathBuf,
    kind: Kind,
    meta: std::fs::Metadata,
}

fn denied(rel: &Path) -> bool {
    let Some(rel) = rel.to_str() else {
        return true;
    };
    // Backups (`passwd-`, `shadow-`, ...) written by shadow-utils.
    if rel.ends_with('-') {
        return true;
    }
    DENY.iter().any(|pat| match pat.strip_suffix('*') {
        Some(prefix) => rel.starts_with(prefix),
        None => rel == *pat,
    })
}

fn walk(root: &Path, rel: &Path, plan: &mut Vec<Entry>) -> io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))?.collect::<Result<_, _>>()?;
    // Sorted so the fingerprint does not depend on directory order.
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let rel = rel.join(entry.file_name());
        if denied(&rel) {
            continue;
        }
        let path = root.join(&rel);
        let mut meta = std::fs::symlink_metadata(&path)?;
        let mut kind = if meta.file_type().is_symlink() {
            Kind::Symlink(std::fs::read_link(&path)?)
        } else if meta.is_dir() {
            Kind::Dir
        } else if meta.is_file() {
            Kind::File
        } else {
            continue; // sockets, fifos, device nodes
        };
        if matches!(kind, Kind::Symlink(_)) && DEREFERENCE.iter().any(|d| rel == Path::new(d)) {
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => {
                    meta = m;
                    kind = Kind::File;
                }
                _ => continue,
            }
        }
        let world = meta.mode() & 0o007;
        match kind {
            Kind::Dir if world & 0o5 != 0o5 => continue,
            Kind::File if world & 0o4 == 0 => continue,
            _ => {}
        }
        let is_dir = matches!(kind, Kind::Dir);
        plan.push(Entry {
            rel: rel.clone(),
            kind,
            meta,
        });
        if is_dir {
            walk(root, &rel, plan)?;
        }
    }
    Ok(())
}

/// FNV-1a over everything that defines the copy's content; stable across
/// Rust versions, unlike `DefaultHasher`.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn fingerprint(plan: &[Entry]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for e in plan {
        eat(e.rel.as_os_str().as_encoded_bytes());
        eat(&[0]);
        match &e.kind {
            Kind::Dir => eat(b"d"),
            Kind::File => eat(b"f"),
            Kind::Symlink(t) => {
                eat(b"l");
                eat(t.as_os_str().as_encoded_bytes());
            }
        }
        for n in [
            u64::from(e.meta.mode()),
            u64::from(e.meta.uid()),
            u64::from(e.meta.gid()),
            e.meta.size(),
            e.meta.mtime() as u64,
            e.meta.mtime_nsec() as u64,
        ] {
            eat(&n.to_le_bytes());
        }
    }
    h
}

fn copy(src_root: &Path, dst_root: &Path, plan: &[Entry]) -> io::Result<()> {
    std::fs::create_dir(dst_root)?;
    std::fs::set_permissions(dst_root, std::fs::Permissions::from_mode(0o755))?;
    let is_root = super::sys::effective_ids().0 == 0;
    for e in plan {
        let dst = dst_root.join(&e.rel);
        match &e.kind {
            Kind::Dir => std::fs::create_dir(&dst)?,
            Kind::File => {
                std::fs::copy(src_root.join(&e.rel), &dst)?;
            }
            Kind::Symlink(target) => std::os::unix::fs::symlink(target, &dst)?,
        }
        if !matches!(e.kind, Kind::Symlink(_)) {
            std::fs::set_permissions(
                &dst,
                std::fs::Permissions::from_mode(e.meta.mode() & 0o7777),
            )?;
        }
        if is_root {
            std::os::unix::fs::lchown(&dst, Some(e.meta.uid()), Some(e.meta.gid()))?;
            if !matches!(e.kind, Kind::Symlink(_)) && e.meta.mode() & 0o6000 != 0 {
                std::fs::set_permissions(
                    &dst,
                    std::fs::Permissions::from_mode(e.meta.mode() & 0o7777),
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn denylist_and_unreadable_files_are_dropped() {
        let src = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let e = src.path();
        fs::write(e.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        fs::write(e.join("passwd-"), "backup").unwrap();
        fs::write(e.join("shadow"), "root:$6$secret").unwrap();
        fs::set_permissions(e.join("shadow"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::write(e.join("private.conf"), "secret").unwrap();
        fs::set_permissions(e.join("private.conf"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::create_dir_all(e.join("ssh")).unwrap();
        fs::write(e.join("ssh/ssh_host_ed25519_key.pub"), "pub").unwrap();
        fs::write(e.join("ssh/ssh_config"), "Host *").unwrap();
        fs::create_dir_all(e.join("ssl/private")).unwrap();
        fs::write(e.join("ssl/private/key.pem"), "k").unwrap();
        std::os::unix::fs::symlink("../proc/self/mounts", e.join("mtab")).unwrap();
        fs::write(e.join("real-resolv"), "nameserver 1.1.1.1\n").unwrap();
        std::os::unix::fs::symlink(e.join("real-resolv"), e.join("resolv.conf")).unwrap();

        let out = prepare_from(e, state.path()).unwrap();
        assert!(out.join("passwd").is_file());
        assert!(out.join("ssh/ssh_config").is_file());
        for gone in [
            "passwd-",
            "shadow",
            "private.conf",
            "ssh/ssh_host_ed25519_key.pub",
            "ssl/private",
        ] {
            assert!(!out.join(gone).exists(), "{gone} was copied");
        }
        assert_eq!(
            fs::read_link(out.join("mtab")).unwrap(),
            PathBuf::from("../proc/self/mounts")
        );
        let resolv = fs::symlink_metadata(out.join("resolv.conf")).unwrap();
        assert!(resolv.is_file(), "resolv.conf is dereferenced");
        // Unchanged source: the same copy is reused.
        assert_eq!(prepare_from(e, state.path()).unwrap(), out);
        // The egress copy differs only in resolv.conf.
        let eg = prepare_egress_etc(&out, "nameserver 100.127.0.1\n", None).unwrap();
        assert_ne!(eg, out);
        assert_eq!(
            fs::read_to_string(eg.join("resolv.conf")).unwrap(),
            "nameserver 100.127.0.1\n"
        );
        assert!(eg.join("passwd").is_file());
        assert_eq!(
            fs::read_link(eg.join("mtab")).unwrap(),
            PathBuf::from("../proc/self/mounts")
        );
        assert!(eg.join("ssh/ssh_config").is_file());
        // The host copy keeps its own resolv.conf; the files are shared.
        assert_eq!(
            fs::read_to_string(out.join("resolv.conf")).unwrap(),
            "nameserver 1.1.1.1\n"
        );
        let (a, b) = (
            fs::metadata(out.join("passwd")).unwrap(),
            fs::metadata(eg.join("passwd")).unwrap(),
        );
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
        assert_eq!(
            prepare_egress_etc(&out, "nameserver 100.127.0.1\n", None).unwrap(),
            eg
        );
        // With the hub's CA: its own files, and the host copy untouched.
        let with_ca = prepare_egress_etc(&out, "nameserver 100.127.0.1\n", Some("CA\n")).unwrap();
        assert_ne!(with_ca, eg);
        assert_eq!(fs::read_to_string(with_ca.join(CA_FILE)).unwrap(), "CA\n");
        assert!(!out.join(CA_FILE).exists() && !eg.join(CA_FILE).exists());
        fs::write(e.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        assert_ne!(prepare_from(e, state.path()).unwrap(), out);
    }
}
