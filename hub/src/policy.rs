//! What the operator grants tenants: the limits a sandbox gets when its
//! template names none, the per-tenant quotas, and the switches for
//! anything that reaches past a sandbox (the host's network).
//!
//! Every resource a tenant can grow is bounded here or in the template
//! checks: sandboxes (count and summed memory), warm replicas, and through
//! the defaults each sandbox's pids, memory and CPU. Quota answers are
//! `RESOURCE_EXHAUSTED` with the numbers, so a caller knows what to free.

use clap::Args;
use sandhub_api::{
    error::Code,
    hub::{Network, Template},
};
use sandhub_client::Error;

#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Let templates ask for `network: host`. Off by default: such a
    /// sandbox shares the host's network namespace, reaches the hub and
    /// every service on loopback, and can listen on the host's interfaces.
    #[arg(long, env = "SANDHUB_ALLOW_HOST_NETWORK")]
    pub allow_host_network: bool,

    /// Memory limit (MiB) of a sandbox whose template sets none
    /// [default: a sixteenth of this machine's memory, 512 to 1024].
    #[arg(long, env = "SANDHUB_DEFAULT_MEMORY_MB")]
    pub default_memory_mb: Option<u64>,

    /// CPU limit (cores) of a sandbox whose template sets none
    /// [default: half of this machine's CPUs, at least 1].
    #[arg(long, env = "SANDHUB_DEFAULT_CPU")]
    pub default_cpu: Option<f64>,

    /// Most processes and threads of a sandbox whose template sets none
    /// (its own daemon's included).
    #[arg(long, env = "SANDHUB_DEFAULT_PIDS", default_value_t = 1024)]
    pub default_pids: u64,

    /// Most sandboxes one tenant may have at once: running, suspended and
    /// warm pool members.
    #[arg(long, env = "SANDHUB_TENANT_MAX_SANDBOXES", default_value_t = 128)]
    pub tenant_max_sandboxes: u64,

    /// Most warm replicas over all of one tenant's pools.
    #[arg(long, env = "SANDHUB_TENANT_MAX_POOL_REPLICAS", default_value_t = 32)]
    pub tenant_max_pool_replicas: u64,

    /// Most memory (MiB) the limits of one tenant's sandboxes may add up to
    /// [default: eight times this machine's memory; limits are ceilings,
    /// not reservations, and all sandboxes together are held below the
    /// machine's memory by their parent cgroup].
    #[arg(long, env = "SANDHUB_TENANT_MAX_MEMORY_MB")]
    pub tenant_max_memory_mb: Option<u64>,

    /// Most MiB the named volumes of one tenant may add up to (their
    /// `size_mb`, each a hard limit on the disk-quota volume).
    #[arg(long, env = "SANDHUB_TENANT_MAX_VOLUME_MB", default_value_t = 10240)]
    pub tenant_max_volume_mb: u64,

    /// Publishes a named volume read-only to every tenant, as
    /// `[TENANT/]NAME` (the tenant that owns it; `default`, the tenant of
    /// a hub without an API keys file, when left out): a dataset or a
    /// package cache that many sandboxes mount. A tenant's own volume of
    /// the same name wins. Repeatable; comma-separated in the variable.
    #[arg(
        long = "shared-volume",
        env = "SANDHUB_SHARED_VOLUMES",
        value_delimiter = ','
    )]
    pub shared_volumes: Vec<String>,
}

impl Default for PolicyArgs {
    fn default() -> Self {
        PolicyArgs {
            allow_host_network: false,
            default_memory_mb: None,
            default_cpu: None,
            default_pids: 1024,
            tenant_max_sandboxes: 128,
            tenant_max_pool_replicas: 32,
            tenant_max_memory_mb: None,
            tenant_max_volume_mb: 10240,
            shared_volumes: Vec::new(),
        }
    }
}

/// The operator's policy with every default resolved for this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub allow_host_network: bool,
    pub default_memory_mb: u64,
    pub default_cpu: f64,
    pub default_pids: u64,
    pub tenant_max_sandboxes: u64,
    pub tenant_max_pool_replicas: u64,
    pub tenant_max_memory_mb: u64,
    pub tenant_max_volume_mb: u64,
    /// `--shared-volume`: (owner tenant, volume name) pairs.
    pub shared_volumes: Vec<SharedVolume>,
}

/// A volume the operator published read-only to every tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedVolume {
    pub owner: String,
    pub name: String,
}

impl SharedVolume {
    /// `[TENANT/]NAME`; the name is a DNS label, so the last `/` splits.
    pub fn parse(spec: &str) -> anyhow::Result<Self> {
        let (owner, name) = spec
            .rsplit_once('/')
            .unwrap_or((crate::http::OPEN_TENANT, spec));
        sandhub_api::validate::name("volume", name)
            .map_err(|e| anyhow::anyhow!("--shared-volume {spec:?}: {}", e.message))?;
        if owner.is_empty() {
            anyhow::bail!("--shared-volume {spec:?}: the tenant before `/` is empty");
        }
        Ok(SharedVolume {
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }
}

impl Policy {
    /// Defaults sized to this machine: `host_memory_kib` is its MemTotal
    /// (the caller reads it with `local::runtime::host_memory_kib`, so
    /// this module, which both backends use, depends on neither).
    pub fn resolve(args: &PolicyArgs, host_memory_kib: u64) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::resolve_for(args, host_memory_kib / 1024, cpus)
    }

    fn resolve_for(args: &PolicyArgs, mem_mb: u64, cpus: usize) -> Self {
        Policy {
            allow_host_network: args.allow_host_network,
            default_memory_mb: args
                .default_memory_mb
                .unwrap_or_else(|| (mem_mb / 16).clamp(512, 1024)),
            default_cpu: args
                .default_cpu
                .unwrap_or_else(|| ((cpus / 2).max(1)) as f64),
            default_pids: args.default_pids,
            tenant_max_sandboxes: args.tenant_max_sandboxes,
            tenant_max_pool_replicas: args.tenant_max_pool_replicas,
            tenant_max_memory_mb: args
                .tenant_max_memory_mb
                .unwrap_or(mem_mb.saturating_mul(8)),
            tenant_max_volume_mb: args.tenant_max_volume_mb,
            // Checked by `validate`, which start-up calls.
            shared_volumes: args
                .shared_volumes
                .iter()
                .filter_map(|s| SharedVolume::parse(s).ok())
                .collect(),
        }
    }

    /// Checks the operator's own flags against the template bounds, so a
    /// typo fails at start-up instead of failing every sandbox.
    pub fn validate(&self) -> anyhow::Result<()> {
        let t = Template {
            memory_mb: Some(self.default_memory_mb),
            cpu: Some(self.default_cpu),
            pids: Some(self.default_pids),
            ..Template::default()
        };
        sandhub_api::validate::template_limits(&t)
            .map_err(|e| anyhow::anyhow!("--default-*: {}", e.message))
    }

    /// Checks `--shared-volume`, which `resolve` skips when malformed.
    pub fn validate_args(args: &PolicyArgs) -> anyhow::Result<()> {
        for s in &args.shared_volumes {
            SharedVolume::parse(s)?;
        }
        Ok(())
    }

    /// The template as sandboxes run it: the operator's defaults fill every
    /// limit it leaves open.
    pub fn effective(&self, t: &Template) -> Template {
        let mut t = t.clone();
        t.memory_mb.get_or_insert(self.default_memory_mb);
        t.cpu.get_or_insert(self.default_cpu);
        t.pids.get_or_insert(self.default_pids);
        t
    }

    /// Refuses what only the operator may grant.
    pub fn admit_template(&self, t: &Template) -> Result<(), Error> {
        if t.network.mode == Network::Host && !self.allow_host_network {
            return Err(Error::new(
                Code::PermissionDenied,
                "network: host is not allowed on this hub: such a sandbox shares the host's \
                 network (the hub's own port included); the operator can allow it with \
                 `sandhub serve --allow-host-network`",
            ));
        }
        Ok(())
    }

    /// A tenant that has `have` sandboxes with `memory_mb` of limits may
    /// add one more of `more_mb`.
    pub fn admit_sandbox(&self, have: u64, memory_mb: u64, more_mb: u64) -> Result<(), Error> {
        if have >= self.tenant_max_sandboxes {
            return Err(exhausted(format!(
                "tenant quota: {have} of {} sandboxes in use (running, suspended and warm); \
                 delete some or ask the operator for --tenant-max-sandboxes",
                self.tenant_max_sandboxes
            )));
        }
        if memory_mb.saturating_add(more_mb) > self.tenant_max_memory_mb {
            let left = self.tenant_max_memory_mb.saturating_sub(memory_mb);
            let fits = if left >= sandhub_api::hub::MIN_MEMORY_MB {
                format!("a template with `memory_mb: {left}` or less would fit; ")
            } else {
                "delete a sandbox first; ".to_string()
            };
            return Err(exhausted(format!(
                "tenant quota: {memory_mb} MiB of {} MiB of memory limits in use, this \
                 sandbox needs {more_mb} MiB more; {fits}or ask the operator for \
                 --tenant-max-memory-mb (or a smaller --default-memory-mb)",
                self.tenant_max_memory_mb
            )));
        }
        Ok(())
    }

    /// Whether a tenant's pools may hold `replicas` warm sandboxes in all.
    pub fn admit_replicas(&self, replicas: u64) -> Result<(), Error> {
        if replicas > self.tenant_max_pool_replicas {
            return Err(exhausted(format!(
                "tenant quota: pools would hold {replicas} warm replicas in all, at most {} \
                 allowed (--tenant-max-pool-replicas)",
                self.tenant_max_pool_replicas
            )));
        }
        Ok(())
    }
}

fn exhausted(message: String) -> Error {
    Error::new(Code::ResourceExhausted, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_sized_to_the_machine() {
        let p = Policy::resolve_for(&PolicyArgs::default(), 24 * 1024, 2);
        assert_eq!(p.default_memory_mb, 1024);
        assert_eq!(p.default_cpu, 1.0);
        assert_eq!(p.tenant_max_memory_mb, 192 * 1024);
        // A tenant can fill its sandbox count at the default limit.
        assert!(p.tenant_max_sandboxes * p.default_memory_mb <= p.tenant_max_memory_mb);
        let laptop = Policy::resolve_for(&PolicyArgs::default(), 8 * 1024, 4);
        assert_eq!(laptop.default_memory_mb, 512);
        assert!(
            laptop.tenant_max_sandboxes * laptop.default_memory_mb <= laptop.tenant_max_memory_mb
        );
        let small = Policy::resolve_for(&PolicyArgs::default(), 1024, 1);
        assert_eq!(small.default_memory_mb, 512);
        assert_eq!(small.default_cpu, 1.0);
        p.validate().unwrap();
    }

    #[test]
    fn effective_fills_only_open_limits() {
        let p = Policy::resolve_for(&PolicyArgs::default(), 8192, 4);
        let t = Template {
            memory_mb: Some(64),
            ..Template::default()
        };
        let e = p.effective(&t);
        assert_eq!(e.memory_mb, Some(64));
        assert_eq!(e.cpu, Some(2.0));
        assert_eq!(e.pids, Some(1024));
    }

    #[test]
    fn quotas_name_their_numbers() {
        let p = Policy::resolve_for(&PolicyArgs::default(), 1024, 1);
        let e = p.admit_sandbox(128, 0, 1).unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
        assert!(e.message.contains("128 of 128"), "{}", e.message);
        let e = p.admit_sandbox(1, 8000, 200).unwrap_err();
        assert!(e.message.contains("8000 MiB of 8192 MiB"), "{}", e.message);
        assert!(e.message.contains("`memory_mb: 192`"), "{}", e.message);
        assert!(
            e.message.contains("--tenant-max-memory-mb"),
            "{}",
            e.message
        );
        assert!(p.admit_sandbox(1, 100, 200).is_ok());
        assert!(p.admit_replicas(32).is_ok());
        assert!(p.admit_replicas(33).is_err());
        let host = Template {
            network: Network::Host.into(),
            ..Template::default()
        };
        assert_eq!(
            p.admit_template(&host).unwrap_err().code,
            Code::PermissionDenied
        );
    }
}
