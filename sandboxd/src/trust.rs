//! The trust bundle of a Pod whose egress proxy brokers secrets (issue
//! #27 on Kubernetes): the image's own system roots with the proxy's CA
//! appended, written once at start where the Pod's `SSL_CERT_FILE` and
//! friends point.
//!
//! Why sandboxd writes it: the roots are the image's (only a process in
//! the Pod can read them), and sandboxd is the one process every sandbox
//! Pod runs first. The hub sets `--extra-ca-file` (the proxy's CA, a
//! ConfigMap mount) and `--ca-bundle-out` (an emptyDir) on egress Pods; a
//! tenant cannot set `SANDBOXD_*` variables.

use std::{io, path::Path};

/// Where images keep their system bundle (Debian, Fedora, Alpine/others).
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The bundle: the first of `system` that exists, then the CA (when its
/// file exists: the ConfigMap is optional, so a Pod may start before the
/// proxy wrote it; then the image's roots alone, so no other host
/// breaks). Written to a temporary name and renamed.
pub fn write_bundle(extra_ca: &Path, out: &Path, system: &[&str]) -> io::Result<()> {
    let roots = system
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let ca = match std::fs::read_to_string(extra_ca) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            tracing::warn!(ca = %extra_ca.display(), "the egress CA is not there yet: the bundle holds the image's roots only");
            String::new()
        }
        Err(e) => return Err(e),
    };
    let mut bundle = roots.trim_end().to_string();
    if !bundle.is_empty() {
        bundle.push('\n');
    }
    bundle.push_str(&ca);
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, bundle)?;
    std::fs::rename(&tmp, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_keeps_the_images_roots_and_appends_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let (roots, ca, out) = (
            dir.path().join("roots.pem"),
            dir.path().join("ca.crt"),
            dir.path().join("bundle.crt"),
        );
        std::fs::write(&roots, "ROOTS\n\n").unwrap();
        std::fs::write(&ca, "CA\n").unwrap();
        let missing = dir.path().join("missing").to_string_lossy().into_owned();
        let system = [missing.as_str(), roots.to_str().unwrap()];
        write_bundle(&ca, &out, &system).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "ROOTS\nCA\n");
        // No CA yet: the image's roots alone; no roots: the CA alone.
        write_bundle(&dir.path().join("nope"), &out, &system).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "ROOTS\n");
        write_bundle(&ca, &out, &[missing.as_str()]).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "CA\n");
    }
}
