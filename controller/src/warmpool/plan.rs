//! What one warm-pool reconcile should do, decided from a snapshot of its
//! members: which to delete (stale, stuck, surplus), which to hold, and how
//! many to create. Pure, so every rule is unit-tested without a cluster.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Stale unclaimed members are deleted at once.
    Recreate,
    /// Stale members are only replaced when they are claimed or deleted.
    OnReplenish,
}

/// One member Sandbox as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub created: Timestamp,
    pub ready: bool,
    /// Has a deletionTimestamp.
    pub terminating: bool,
    /// Built from another template or another blueprint than the pool's current one.
    pub stale: bool,
    /// Its Pod's PodScheduled condition is False/Unschedulable.
    pub unschedulable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    Stale,
    /// Not Ready past the readiness grace period.
    NotReadyTooLong,
    ScaleDown,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub delete: Vec<(String, DeleteReason)>,
    /// Members past the readiness grace that are kept because their Pod
    /// cannot be scheduled: replacing them would not schedule either.
    pub held_unschedulable: Vec<String>,
    pub create: usize,
}

pub struct Inputs<'a> {
    pub desired: usize,
    pub members: &'a [Member],
    pub strategy: Strategy,
    pub now: Timestamp,
    pub readiness_grace: Duration,
    pub max_batch: usize,
}

pub fn plan(inp: &Inputs<'_>) -> Plan {
    let mut out = Plan::default();
    let terminating = inp.members.iter().filter(|m| m.terminating).count();
    let mut keep: Vec<&Member> = Vec::new();
    for m in inp.members.iter().filter(|m| !m.terminating) {
        if m.stale && inp.strategy == Strategy::Recreate {
            out.delete.push((m.name.clone(), DeleteReason::Stale));
        } else if !m.ready && age(m, inp.now) > inp.readiness_grace {
            if m.unschedulable {
                out.held_unschedulable.push(m.name.clone());
                keep.push(m);
            } else {
                out.delete
                    .push((m.name.clone(), DeleteReason::NotReadyTooLong));
            }
        } else {
            keep.push(m);
        }
    }
    if keep.len() > inp.desired {
        let surplus = keep.len() - inp.desired;
        for name in scale_down_order(&keep).into_iter().take(surplus) {
            out.delete.push((name, DeleteReason::ScaleDown));
        }
        return out;
    }
    // Members being deleted still count: their replacements come once they are
    // gone, so a slow deletion never pushes the pool above `desired`.
    let counted = keep.len() + terminating + out.delete.len();
    out.create = inp.desired.saturating_sub(counted).min(inp.max_batch);
    out
}

fn age(m: &Member, now: Timestamp) -> Duration {
    now.duration_since(m.created)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// Names in the order a scale-down deletes them: non-ready first, then the
/// newest first (old Ready members have proven themselves and have warm caches).
pub fn scale_down_order(members: &[&Member]) -> Vec<String> {
    let mut v: Vec<&Member> = members.to_vec();
    v.sort_by(|a, b| {
        a.ready
            .cmp(&b.ready)
            .then(b.created.cmp(&a.created))
            .then(a.name.cmp(&b.name))
    });
    v.into_iter().map(|m| m.name.clone()).collect()
}

/// Slow start (as Kubernetes' ReplicaSet controller does it): batches of
/// 1, 2, 4, … that add up to `total`, none larger than `max_batch`. A failing
/// batch stops the rest, so a broken template costs one failed create, not 300.
pub fn slow_start_batches(total: usize, max_batch: usize) -> Vec<usize> {
    let max_batch = max_batch.max(1);
    let mut out = Vec::new();
    let (mut left, mut next) = (total, 1usize);
    while left > 0 {
        let n = next.min(left).min(max_batch);
        out.push(n);
        left -= n;
        next = next.saturating_mul(2);
    }
    out
}

/// Stale = built from another template, or from another blueprint of the same
/// template. Members without a hash label predate hashing and are kept.
pub fn is_stale(
    member_hash: Option<&str>,
    member_template: Option<&str>,
    current_hash: &str,
    current_template: &str,
) -> bool {
    member_template.is_some_and(|t| t != current_template)
        || member_hash.is_some_and(|h| h != current_hash)
}

/// The `sandbox-template-hash` label value: NameHash of the blueprint's JSON
/// with the pod template's labels and annotations left out, so that
/// label/annotation-only edits never make members stale.
pub fn blueprint_hash(blueprint: &serde_json::Value) -> String {
    let mut v = blueprint.clone();
    if let Some(pt) = v.get_mut("podTemplate").and_then(|p| p.as_object_mut()) {
        pt.remove("metadata");
    }
    sandhub_api::k8s::names::name_hash(&canonical_json(&v))
}

/// JSON with object keys sorted at every level, whatever serde_json's map order.
fn canonical_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let body: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k])))
                .collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(a) => {
            let body: Vec<String> = a.iter().map(canonical_json).collect();
            format!("[{}]", body.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::DEFAULT_MAX_BATCH;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn m(name: &str, created: i64, ready: bool) -> Member {
        Member {
            name: name.into(),
            created: ts(created),
            ready,
            terminating: false,
            stale: false,
            unschedulable: false,
        }
    }

    fn inputs(desired: usize, members: &[Member], strategy: Strategy) -> Inputs<'_> {
        Inputs {
            desired,
            members,
            strategy,
            now: ts(1000),
            readiness_grace: Duration::from_secs(300),
            max_batch: DEFAULT_MAX_BATCH,
        }
    }

    #[test]
    fn slow_start_doubles_and_respects_the_cap() {
        assert_eq!(slow_start_batches(0, 300), Vec::<usize>::new());
        assert_eq!(slow_start_batches(1, 300), vec![1]);
        assert_eq!(slow_start_batches(10, 300), vec![1, 2, 4, 3]);
        assert_eq!(
            slow_start_batches(300, 300),
            vec![1, 2, 4, 8, 16, 32, 64, 128, 45]
        );
        assert_eq!(slow_start_batches(20, 4), vec![1, 2, 4, 4, 4, 4, 1]);
        assert_eq!(slow_start_batches(3, 0), vec![1, 1, 1]);
    }

    #[test]
    fn scale_down_deletes_non_ready_first_then_newest() {
        // Non-ready members young enough to be inside the readiness grace.
        let ms = [
            m("old", 0, true),
            m("new", 10, true),
            m("nr-old", 901, false),
            m("nr-new", 905, false),
        ];
        let refs: Vec<&Member> = ms.iter().collect();
        assert_eq!(scale_down_order(&refs), ["nr-new", "nr-old", "new", "old"]);
        let p = plan(&inputs(2, &ms, Strategy::OnReplenish));
        let names: Vec<_> = p.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["nr-new", "nr-old"]);
        assert_eq!(p.create, 0);
    }

    #[test]
    fn scale_up_counts_terminating_members_and_is_capped() {
        let mut gone = m("gone", 0, true);
        gone.terminating = true;
        let ms = [m("a", 0, true), gone];
        assert_eq!(plan(&inputs(5, &ms, Strategy::OnReplenish)).create, 3);
        let mut inp = inputs(500, &ms, Strategy::OnReplenish);
        inp.max_batch = 300;
        assert_eq!(plan(&inp).create, 300);
    }

    #[test]
    fn recreate_deletes_stale_members_and_onreplenish_keeps_them() {
        let mut s = m("stale", 0, true);
        s.stale = true;
        let ms = [s, m("fresh", 0, true)];
        let p = plan(&inputs(2, &ms, Strategy::Recreate));
        assert_eq!(p.delete, vec![("stale".to_string(), DeleteReason::Stale)]);
        // The replacement waits until the stale member is gone.
        assert_eq!(p.create, 0);
        let p = plan(&inputs(2, &ms, Strategy::OnReplenish));
        assert!(p.delete.is_empty());
        assert_eq!(p.create, 0);
    }

    #[test]
    fn stuck_members_are_replaced_unless_unschedulable() {
        let stuck = m("stuck", 0, false); // 1000 s old, grace 300 s
        let young = m("young", 900, false);
        let mut unsched = m("unsched", 0, false);
        unsched.unschedulable = true;
        let ms = [stuck, young, unsched];
        let p = plan(&inputs(3, &ms, Strategy::OnReplenish));
        assert_eq!(
            p.delete,
            vec![("stuck".to_string(), DeleteReason::NotReadyTooLong)]
        );
        assert_eq!(p.held_unschedulable, vec!["unsched".to_string()]);
        assert_eq!(p.create, 0);
    }

    #[test]
    fn staleness_is_template_or_blueprint_drift() {
        assert!(!is_stale(Some("h"), Some("t"), "h", "t"));
        assert!(is_stale(Some("h0"), Some("t"), "h", "t"));
        assert!(is_stale(Some("h"), Some("other"), "h", "t"));
        assert!(!is_stale(None, None, "h", "t"));
    }

    #[test]
    fn blueprint_hash_ignores_pod_metadata_and_key_order() {
        let a = serde_json::json!({"podTemplate": {"metadata": {"labels": {"x": "1"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}});
        let b = serde_json::json!({"podTemplate": {"spec": {"containers": [{"image": "i", "name": "c"}]},
            "metadata": {"labels": {"x": "2"}}}});
        let c = serde_json::json!({"podTemplate": {"spec": {"containers": [{"name": "c", "image": "j"}]}}});
        assert_eq!(blueprint_hash(&a), blueprint_hash(&b));
        assert_ne!(blueprint_hash(&a), blueprint_hash(&c));
        assert_eq!(blueprint_hash(&a).len(), 8);
    }
}
