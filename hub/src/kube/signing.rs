//! Replicas agree on the signing key (issue #28).
//!
//! Every replica of a hub on Kubernetes signs E2B access tokens and port
//! links with the key in its `--signing-key-file`. Two replicas with
//! different keys would each refuse the other's tokens, which a client sees
//! as random 401s depending on where the Service sends it. So each replica
//! records its key's fingerprints (never the keys) in a ConfigMap it owns,
//! [`RECORD`], and refuses to start when its keys and the recorded ones
//! cannot verify each other's tokens.
//!
//! A rotation is compatible with the record: a file naming the new key
//! first and the previous one second still accepts everything the other
//! replicas sign, and the replica that has it becomes the record.

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams, PostParams},
    Api,
};

/// The ConfigMap holding the replicas' key fingerprints, newest first.
pub const RECORD: &str = "sandhub-hub-signing-keys";
const FIELD: &str = "fingerprints";
const MANAGER: &str = "sandhub-hub";

/// What a starting replica makes of the record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Same keys as recorded: nothing to do.
    Same,
    /// Tokens pass both ways, and these keys are at least as new: record them.
    Newer { warn: bool },
    /// Tokens pass at least one way, but the record is newer: keep it, warn.
    Older,
    /// Neither side's signing key is known to the other.
    Mismatch,
}

/// Compares this replica's fingerprints with the recorded ones (both
/// newest first, neither empty).
pub(crate) fn judge(mine: &[String], recorded: &[String]) -> Verdict {
    if mine == recorded {
        return Verdict::Same;
    }
    let they_accept_mine = recorded.contains(&mine[0]);
    let i_accept_theirs = mine.contains(&recorded[0]);
    match (they_accept_mine, i_accept_theirs) {
        (false, false) => Verdict::Mismatch,
        (_, true) => Verdict::Newer {
            warn: !they_accept_mine,
        },
        (true, false) => Verdict::Older,
    }
}

fn parse(cm: &ConfigMap) -> Vec<String> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(FIELD))
        .map(|v| {
            v.split(',')
                .map(str::to_owned)
                .filter(|f| !f.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn record(fingerprints: &[String]) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": RECORD,
            "labels": {"app.kubernetes.io/managed-by": MANAGER},
        },
        "data": {FIELD: fingerprints.join(",")},
    }))
    .expect("a well-formed ConfigMap")
}

/// Checks `mine` against the record in `namespace`, making or updating the
/// record as [`judge`] says; an error when the keys cannot agree.
pub async fn agree(client: &kube::Client, namespace: &str, mine: &[String]) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    // Two replicas starting at once may both find no record: the loser of
    // the create reads the winner's and judges again.
    for _ in 0..3 {
        let Some(cm) = api
            .get_opt(RECORD)
            .await
            .context("reading the signing-key record")?
        else {
            match api.create(&PostParams::default(), &record(mine)).await {
                Ok(_) => {
                    tracing::info!(fingerprints = ?mine, "recorded this hub's signing keys");
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e).context("recording the signing keys"),
            }
        };
        let recorded = parse(&cm);
        if recorded.is_empty() {
            // An emptied record holds nothing to disagree with.
            return write(&api, mine).await;
        }
        return match judge(mine, &recorded) {
            Verdict::Same => Ok(()),
            Verdict::Newer { warn } => {
                if warn {
                    tracing::warn!(
                        mine = ?mine, recorded = ?recorded,
                        "rotating the signing key: replicas still on the previous keys refuse tokens this one signs until they restart with this file"
                    );
                }
                write(&api, mine).await
            }
            Verdict::Older => {
                tracing::warn!(
                    mine = ?mine, recorded = ?recorded,
                    "other replicas sign with a key this one does not accept: give it the newer --signing-key-file"
                );
                Ok(())
            }
            Verdict::Mismatch => anyhow::bail!(
                "--signing-key-file does not agree with the other replicas of this hub: its keys \
                 (fingerprints {mine:?}) and theirs ({recorded:?}, in ConfigMap {namespace}/{RECORD}) \
                 cannot verify each other's tokens, so E2B tokens and port links would fail at \
                 random. Give every replica the same file; to rotate, put the new key first and \
                 keep the previous one as the second line"
            ),
        };
    }
    anyhow::bail!("the signing-key record {namespace}/{RECORD} keeps changing under this replica")
}

async fn write(api: &Api<ConfigMap>, mine: &[String]) -> anyhow::Result<()> {
    api.patch(
        RECORD,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(record(mine)),
    )
    .await
    .context("updating the signing-key record")?;
    tracing::info!(fingerprints = ?mine, "recorded this hub's signing keys");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn replicas_agree_through_a_rotation_and_refuse_strangers() {
        let (old, new, other) = ("aa", "bb", "cc");
        assert_eq!(judge(&fp(&[old]), &fp(&[old])), Verdict::Same);
        // Step 1 of a careful rotation: accept the new key, still sign with the old.
        assert_eq!(
            judge(&fp(&[old, new]), &fp(&[old])),
            Verdict::Newer { warn: false }
        );
        // Step 2: sign with the new key; every replica already accepts it.
        assert_eq!(
            judge(&fp(&[new, old]), &fp(&[old, new])),
            Verdict::Newer { warn: false }
        );
        // The one-step rotation works too, with a warning for the rollout.
        assert_eq!(
            judge(&fp(&[new, old]), &fp(&[old])),
            Verdict::Newer { warn: true }
        );
        // Step 3: the old key dropped.
        assert_eq!(
            judge(&fp(&[new]), &fp(&[new, old])),
            Verdict::Newer { warn: false }
        );
        // An old replica restarting mid-rollout keeps running, and the record stays.
        assert_eq!(judge(&fp(&[old]), &fp(&[new, old])), Verdict::Older);
        // A replica with another key entirely, or whose signing keys are
        // unknown to each other, is refused.
        assert_eq!(judge(&fp(&[other]), &fp(&[old])), Verdict::Mismatch);
        assert_eq!(
            judge(&fp(&[other, old]), &fp(&[new, old])),
            Verdict::Mismatch
        );
    }

    #[test]
    fn the_record_round_trips() {
        let cm = record(&fp(&["aa", "bb"]));
        assert_eq!(parse(&cm), fp(&["aa", "bb"]));
        assert_eq!(cm.metadata.name.as_deref(), Some(RECORD));
    }
}
