//! Label and annotation keys the controller, router and hub read and write.
//! The strings are upstream agent-sandbox's, byte for byte.

/// `NameHash(sandbox.name)` on the Pod, Service and PVCs: the Service selector,
/// the router's Pod-cache filter and the controller's Pod index.
pub const SANDBOX_NAME_HASH: &str = "agents.x-k8s.io/sandbox-name-hash";
/// `NameHash(pool.name)` on pool-owned Sandboxes and their Pods; removed on adoption.
pub const WARM_POOL_SANDBOX: &str = "agents.x-k8s.io/warm-pool-sandbox";
pub const SANDBOX_TEMPLATE_REF_HASH: &str = "agents.x-k8s.io/sandbox-template-ref-hash";
pub const SANDBOX_TEMPLATE_HASH: &str = "agents.x-k8s.io/sandbox-template-hash";
pub const SANDBOX_POD_TEMPLATE_HASH: &str = "agents.x-k8s.io/sandbox-pod-template-hash";
pub const CLAIM_UID: &str = "agents.x-k8s.io/claim-uid";
pub const LAUNCH_TYPE: &str = "agents.x-k8s.io/launch-type";
pub const CREATED_BY: &str = "agents.x-k8s.io/created-by";
pub const ADOPTABLE: &str = "agents.x-k8s.io/adoptable";

pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
pub const SANDBOX_TEMPLATE_REF_ANNOTATION: &str = "agents.x-k8s.io/sandbox-template-ref";
pub const PROPAGATED_LABELS: &str = "agents.x-k8s.io/propagated-labels";
pub const PROPAGATED_ANNOTATIONS: &str = "agents.x-k8s.io/propagated-annotations";
pub const SANDBOX_NAME_ANNOTATION: &str = "agents.x-k8s.io/sandbox-name";
pub const CLAIM_NAME_ANNOTATION: &str = "agents.x-k8s.io/claim-name";
pub const CLIENT_FIRST_REQUESTED_AT: &str = "agents.x-k8s.io/client-first-requested-at";
pub const CONTROLLER_FIRST_OBSERVED_AT: &str = "agents.x-k8s.io/controller-first-observed-at";
pub const CLAIM_FIRST_READY_AT: &str = "agents.x-k8s.io/claim-first-ready-at";
pub const CREATION_LATENCY_RECORDED: &str = "agents.x-k8s.io/creation-latency-recorded";
pub const TRACE_CONTEXT: &str = "opentelemetry.io/trace-context";
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// Prefixes a user may not set through a pod template; the controller owns them.
pub const RESERVED_PREFIXES: [&str; 2] = ["agents.x-k8s.io/", "extensions.agents.x-k8s.io/"];

/// Upstream's `NameHash`: FNV-1a 32-bit of the name, as 8 lowercase hex digits.
/// Short enough for a label value whatever the name's length.
pub fn name_hash(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::name_hash;

    #[test]
    fn name_hash_is_fnv1a_32_in_lowercase_hex() {
        // FNV-1a reference vectors: "" and "a".
        assert_eq!(name_hash(""), "811c9dc5");
        assert_eq!(name_hash("a"), "e40c292c");
        assert_eq!(name_hash("foobar"), "bf9cf968");
    }
}
