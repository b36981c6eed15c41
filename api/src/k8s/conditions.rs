//! Condition types, reasons, fixed messages and event reasons, exactly as upstream
//! agent-sandbox writes them. Clients (the upstream Python SDK among them) match on these
//! strings, so they are stated once here and never spelled inline elsewhere.

/// Condition types.
pub mod types {
    pub const READY: &str = "Ready";
    /// Persistent once set: not removed on resume, only flipped to `NotSuspended`.
    pub const SUSPENDED: &str = "Suspended";
    pub const POD_SCHEDULED: &str = "PodScheduled";
    pub const FINISHED: &str = "Finished";
}

/// Reasons of the Sandbox `Ready` condition.
pub mod sandbox {
    pub const DEPENDENCIES_READY: &str = "DependenciesReady";
    pub const DEPENDENCIES_NOT_READY: &str = "DependenciesNotReady";
    pub const SANDBOX_SUSPENDED: &str = "SandboxSuspended";
    pub const POD_SUCCEEDED: &str = "PodSucceeded";
    pub const POD_FAILED: &str = "PodFailed";
    pub const SANDBOX_EXPIRED: &str = "SandboxExpired";
    pub const MULTIPLE_PODS: &str = "MultiplePods";
    pub const RECONCILER_ERROR: &str = "ReconcilerError";
}

/// Reasons of the Sandbox `Suspended` condition.
pub mod suspended {
    pub const NOT_SUSPENDED: &str = "NotSuspended";
    pub const POD_TERMINATED: &str = "PodTerminated";
    pub const POD_TERMINATING: &str = "PodTerminating";
    /// Deprecated alias of `PodTerminating`; accepted when read, never written.
    pub const POD_NOT_TERMINATED: &str = "PodNotTerminated";
    pub const POD_NOT_OWNED: &str = "PodNotOwned";
    pub const POD_STATE_UNKNOWN: &str = "PodStateUnknown";
}

/// Reasons of the Sandbox `PodScheduled` condition when the Pod gives none.
pub mod scheduled {
    pub const POD_SCHEDULED: &str = "PodScheduled";
    pub const POD_SCHEDULING_UNKNOWN: &str = "PodSchedulingUnknown";
}

/// Reasons of the Sandbox `Finished` condition (also mirrored onto claims).
pub mod finished {
    pub const POD_SUCCEEDED: &str = "PodSucceeded";
    pub const POD_FAILED: &str = "PodFailed";
}

/// Reasons of the SandboxClaim `Ready` condition that the claim controller sets itself
/// (otherwise it forwards the Sandbox's `Ready` condition).
pub mod claim {
    pub const TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";
    pub const WARM_POOL_NOT_FOUND: &str = "WarmPoolNotFound";
    pub const ADOPTION_CONFLICT: &str = "AdoptionConflict";
    pub const SANDBOX_CREATE_PENDING: &str = "SandboxCreatePending";
    pub const INVALID_METADATA: &str = "InvalidMetadata";
    pub const ENV_VARS_INJECTION_REJECTED: &str = "EnvVarsInjectionRejected";
    pub const VOLUME_CLAIM_TEMPLATES_ERROR: &str = "VolumeClaimTemplatesError";
    pub const CLAIM_EXPIRED: &str = "ClaimExpired";
    pub const SANDBOX_EXPIRED: &str = "SandboxExpired";
    pub const SANDBOX_MISSING: &str = "SandboxMissing";
    pub const SANDBOX_NOT_READY: &str = "SandboxNotReady";
    pub const RECONCILER_ERROR: &str = "ReconcilerError";
}

/// Fixed condition messages.
pub mod messages {
    pub const SANDBOX_EXPIRED: &str = "Sandbox has expired";
    pub const SANDBOX_SUSPENDING: &str = "Sandbox is suspending";
    pub const SANDBOX_SUSPENDED: &str = "Sandbox is suspended";
    pub const POD_DOES_NOT_EXIST: &str = "Pod does not exist";
    pub const POD_RUNNING_NOT_READY: &str = "Pod is Running but not Ready";
    pub const POD_READY_NO_IPS: &str = "Pod is Ready but has no podIPs yet";
    pub const SERVICE_EXISTS: &str = "; Service Exists";
    pub const SERVICE_DOES_NOT_EXIST: &str = "; Service does not exist";
    pub const CLAIM_EXPIRED: &str = "Claim expired. Sandbox cleanup initiated.";

    /// `Pod exists with phase: <phase>`.
    pub fn pod_phase(phase: &str) -> String {
        format!("Pod exists with phase: {phase}")
    }
    /// `Error seen: <err>` (Ready=False/ReconcilerError).
    pub fn reconciler_error(err: &str) -> String {
        format!("Error seen: {err}")
    }
    /// `SandboxWarmPool "<name>" not found`.
    pub fn warm_pool_not_found(name: &str) -> String {
        format!("SandboxWarmPool \"{name}\" not found")
    }
}

/// Event reasons.
pub mod events {
    pub const SANDBOX_ADOPTED: &str = "SandboxAdopted";
    pub const SANDBOX_PROVISIONED: &str = "SandboxProvisioned";
    pub const WARM_POOL_NOT_PROGRESSING: &str = "WarmPoolNotProgressing";
    pub const WARM_POOL_PROGRESSING: &str = "WarmPoolProgressing";
    pub const MULTIPLE_PODS: &str = "MultiplePods";
    pub const CLAIM_EXPIRED: &str = "ClaimExpired";
}

/// Values of the `agents.x-k8s.io/launch-type` label.
pub mod launch_type {
    pub const COLD: &str = "cold";
    pub const WARM: &str = "warm";
}

/// Values of the `agents.x-k8s.io/created-by` label the controller writes itself.
pub mod created_by {
    pub const CONTROLLER: &str = "controller";
}
