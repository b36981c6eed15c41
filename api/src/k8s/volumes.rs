//! Named volumes a create request adds on Kubernetes (issue #32 §1).
//!
//! A warm Pod exists before anyone asks for it, so a request's volumes
//! need a Pod made for the claim. The hub writes them on the SandboxClaim
//! as [`MOUNTS_ANNOTATION`], the JSON list of [`ClaimVolume`]s, with its
//! signature of that list for that claim ([`SIGNATURE_ANNOTATION`],
//! `SandboxdTokens::volumes_signature`). sandhub-controller then takes no
//! warm member (as for a claim's `env`), and builds the cold Sandbox's Pod
//! with each claim as a Pod volume mounted in the main container.
//!
//! The signature is why a PersistentVolumeClaim's name can sit in an
//! annotation: the hub checked each one is the tenant's own volume (or one
//! the operator shares, read-only), and the controller mounts nothing the
//! hub did not sign for that claim. Anyone else who may write claims gets
//! no way to mount a volume this way.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodSpec, Volume, VolumeMount};
use serde::{Deserialize, Serialize};

/// The claim annotation holding the JSON list of [`ClaimVolume`]s.
pub const MOUNTS_ANNOTATION: &str = "sandhub.io/volume-mounts";
/// The claim annotation holding the hub's signature of [`MOUNTS_ANNOTATION`].
pub const SIGNATURE_ANNOTATION: &str = "sandhub.io/volume-mounts-signature";
/// Pod volumes made from [`MOUNTS_ANNOTATION`] are named this, then an index.
pub const POD_VOLUME_PREFIX: &str = "sandhub-request-volume-";
/// The container that runs sandboxd, and gets the mounts, when the Pod has
/// one of this name (the hub's templates name their main container so);
/// else the first: see [`main_container`].
pub const MAIN_CONTAINER: &str = "sandboxd";

/// The index of a Pod's main container: the one the hub's templates run
/// sandboxd in and mount named volumes in, which the controller mounts a
/// claim's volumes in too. None for a Pod without containers.
pub fn main_container(pod: &PodSpec) -> Option<usize> {
    pod.containers
        .iter()
        .position(|c| c.name == MAIN_CONTAINER)
        .or((!pod.containers.is_empty()).then_some(0))
}

/// One volume a claim's Pod mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimVolume {
    /// The PersistentVolumeClaim, in the claim's namespace.
    pub claim: String,
    /// Where it is mounted in the main container.
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// The mounts a claim's annotation lists; a malformed list is an error,
/// never a partial one.
pub fn parse(value: &str) -> Result<Vec<ClaimVolume>, String> {
    let mounts: Vec<ClaimVolume> =
        serde_json::from_str(value).map_err(|e| format!("{MOUNTS_ANNOTATION}: {e}"))?;
    if mounts.len() > crate::volumes::MAX_VOLUME_MOUNTS {
        return Err(format!(
            "{MOUNTS_ANNOTATION}: at most {} volumes",
            crate::volumes::MAX_VOLUME_MOUNTS
        ));
    }
    Ok(mounts)
}

/// `a` is `b` or lies below it.
fn within(a: &str, b: &str) -> bool {
    a == b || (a.starts_with(b) && a.as_bytes().get(b.len()) == Some(&b'/'))
}

/// Adds each of `mounts` to `pod` as a volume of its claim, mounted in the
/// main container (read-only when asked, the claim too). The path must be
/// absolute and normalized, and not at or above a mount the container has
/// already (the workspace, the runtime's directories): nothing the
/// template mounts is shadowed. Below one is fine, as a template's own
/// named volumes sit below the workspace.
pub fn mount(pod: &mut PodSpec, mounts: &[ClaimVolume]) -> Result<(), String> {
    if mounts.is_empty() {
        return Ok(());
    }
    let main = main_container(pod).ok_or("the Pod has no container to mount volumes in")?;
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| !v.name.starts_with(POD_VOLUME_PREFIX));
    let c = &mut pod.containers[main];
    let have = c.volume_mounts.get_or_insert_with(Vec::new);
    have.retain(|m| !m.name.starts_with(POD_VOLUME_PREFIX));
    for (i, m) in mounts.iter().enumerate() {
        let normal = m.path.len() > 1
            && m.path.starts_with('/')
            && m.path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !normal {
            return Err(format!(
                "volume mount {:?}: not an absolute, normalized path below /",
                m.path
            ));
        }
        if let Some(other) = have.iter().find(|o| within(&o.mount_path, &m.path)) {
            return Err(format!(
                "volume mount {:?} would shadow the container's mount {:?}",
                m.path, other.mount_path
            ));
        }
        let (v, at) = claim_volume(
            format!("{POD_VOLUME_PREFIX}{i}"),
            &m.claim,
            &m.path,
            m.read_only,
        );
        volumes.push(v);
        have.push(at);
    }
    Ok(())
}

/// Pod volume `name` of PersistentVolumeClaim `claim`, and its mount at
/// `path`; read-only both, when asked.
pub fn claim_volume(
    name: String,
    claim: &str,
    path: &str,
    read_only: bool,
) -> (Volume, VolumeMount) {
    let v = Volume {
        name: name.clone(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_string(),
            read_only: Some(read_only),
        }),
        ..Default::default()
    };
    let at = VolumeMount {
        name,
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..Default::default()
    };
    (v, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    fn pod() -> PodSpec {
        PodSpec {
            containers: vec![
                Container {
                    name: "helper".into(),
                    ..Default::default()
                },
                Container {
                    name: MAIN_CONTAINER.into(),
                    volume_mounts: Some(vec![VolumeMount {
                        name: "ws".into(),
                        mount_path: "/workspace".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn v(claim: &str, path: &str, read_only: bool) -> ClaimVolume {
        ClaimVolume {
            claim: claim.into(),
            path: path.into(),
            read_only,
        }
    }

    #[test]
    fn mounts_go_to_the_main_container_as_claim_volumes() {
        let mut p = pod();
        mount(
            &mut p,
            &[v("data-a", "/data", false), v("ds-b", "/srv/ds", true)],
        )
        .unwrap();
        let vols = p.volumes.as_ref().unwrap();
        assert_eq!(vols.len(), 2);
        let pvc = vols[1].persistent_volume_claim.as_ref().unwrap();
        assert_eq!(
            (pvc.claim_name.as_str(), pvc.read_only),
            ("ds-b", Some(true))
        );
        assert!(p.containers[0].volume_mounts.is_none(), "not the helper");
        let m = p.containers[1].volume_mounts.as_ref().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[1].name.as_str(), m[1].mount_path.as_str()),
            ("sandhub-request-volume-0", "/data")
        );
        assert_eq!(m[2].read_only, Some(true));
        // Applied again (a retried build): the same, not doubled.
        mount(
            &mut p,
            &[v("data-a", "/data", false), v("ds-b", "/srv/ds", true)],
        )
        .unwrap();
        assert_eq!(p.volumes.as_ref().unwrap().len(), 2);
        assert_eq!(p.containers[1].volume_mounts.as_ref().unwrap().len(), 3);
    }

    #[test]
    fn a_mount_never_shadows_one_the_container_has() {
        for path in [
            "/workspace",
            "/",
            "",
            "rel",
            "/workspace/x/..",
            "/a//b",
            "/a/",
        ] {
            assert!(
                mount(&mut pod(), &[v("c", path, false)]).is_err(),
                "{path:?}"
            );
        }
        // Below the workspace, or beside it: mounted.
        assert!(mount(&mut pod(), &[v("c", "/workspace/sub", false)]).is_ok());
        assert!(mount(&mut pod(), &[v("c", "/workspaces", false)]).is_ok());
        // Nor may one of the list be at or above an earlier one.
        assert!(mount(&mut pod(), &[v("a", "/d/e", false), v("b", "/d", false)]).is_err());
        assert!(mount(&mut pod(), &[v("a", "/d", false), v("b", "/d", false)]).is_err());
    }

    #[test]
    fn the_annotation_is_parsed_whole_or_refused() {
        let ok = parse(r#"[{"claim":"c","path":"/d","read_only":true}]"#).unwrap();
        assert_eq!(ok, vec![v("c", "/d", true)]);
        assert!(parse(r#"[{"claim":"c","path":"/d","extra":1}]"#).is_err());
        assert!(parse("{").is_err());
        let many = format!(
            "[{}]",
            vec![r#"{"claim":"c","path":"/d"}"#; crate::volumes::MAX_VOLUME_MOUNTS + 1].join(",")
        );
        assert!(parse(&many).is_err());
    }
}
