//! Start-up order: client, ConfigMap overrides, shared config, HTTP endpoints, leader
//! election, then the controllers until a signal or the loss of the Lease.

use std::sync::Arc;

use anyhow::Context as _;
use clap::ArgMatches;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::config::{self, SharedConfig};
use crate::context::Context;
use crate::flags::Flags;
use crate::leader::LeaderElector;
use crate::ratelimit::QpsLayer;
use crate::{claim, sandbox, serve, template, warmpool};

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
const DEFAULT_NAMESPACE: &str = "agent-sandbox-system";

pub async fn connect(flags: &Flags) -> anyhow::Result<Client> {
    let config = match &flags.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::infer()
            .await
            .context("no kubeconfig and not running in a cluster")?,
    };
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(
        match QpsLayer::from_flags(flags.kube_api_qps, flags.kube_api_burst) {
            Some(limit) => builder.with_layer(&limit).build(),
            None => builder.build(),
        },
    )
}

/// The controller's own namespace: flag/env, the service account's, or the default.
pub fn controller_namespace(flags: &Flags) -> String {
    flags
        .controller_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string())
}

/// Applies the `agent-sandbox-config` tuning keys; returns the effective flags.
async fn effective_flags(
    client: &Client,
    namespace: &str,
    args: &[String],
    matches: &ArgMatches,
    flags: Flags,
) -> anyhow::Result<(Flags, Option<k8s_openapi::api::core::v1::ConfigMap>)> {
    let cm = match config::read_config_map(client, namespace).await {
        Ok(cm) => cm,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(%namespace, "not allowed to read ConfigMap {}: using flags only", config::CONFIG_MAP_NAME);
            None
        }
        Err(e) => return Err(e).context("reading the agent-sandbox-config ConfigMap"),
    };
    let Some(data) = cm.as_ref().and_then(|c| c.data.clone()) else {
        return Ok((flags, cm));
    };
    let (cli, ignored) =
        config::apply_tuning_overrides(args, matches, &data).map_err(anyhow::Error::msg)?;
    for key in ignored {
        tracing::warn!(%key, "ignoring unknown key in ConfigMap {}", config::CONFIG_MAP_NAME);
    }
    Ok((cli.flags, cm))
}

pub async fn run(args: Vec<String>, matches: ArgMatches, flags: Flags) -> anyhow::Result<()> {
    let own_namespace = controller_namespace(&flags);
    // The ConfigMap may set the client's rate limit: read it with a bootstrap
    // client, then connect with the effective flags.
    let (flags, cm) = {
        let bootstrap = connect(&flags).await?;
        effective_flags(&bootstrap, &own_namespace, &args, &matches, flags).await?
    };
    let client = connect(&flags).await?;
    let watch_client = if flags.separate_watch_connection {
        connect(&flags).await?
    } else {
        client.clone()
    };

    let shared = Arc::new(SharedConfig::from_config_map(cm.as_ref()));
    tokio::spawn(config::watch_config_map(
        watch_client.clone(),
        own_namespace.clone(),
        shared.clone(),
    ));
    let sandboxd_tokens = flags
        .sandboxd_token_key_file
        .as_deref()
        .map(sandhub_api::sandboxd_token::SandboxdTokens::from_file)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--sandboxd-token-key-file: {e}"))?;
    if sandboxd_tokens.is_some() {
        tracing::info!("each sandbox Pod gets its own sandboxd token");
    }
    let ctx = Arc::new(
        Context::new(client.clone(), watch_client, flags.clone(), shared)
            .with_sandboxd_tokens(sandboxd_tokens),
    );

    serve::spawn(
        sandhub_common::parse_bind(&flags.metrics_bind_address)?,
        "metrics",
        serve::metrics_router(ctx.clone()),
    )
    .await?;
    serve::spawn(
        sandhub_common::parse_bind(&flags.health_probe_bind_address)?,
        "health probes",
        serve::probes_router(ctx.clone()),
    )
    .await?;

    let elector = flags.leader_elect.then(|| {
        let ns = flags
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| own_namespace.clone());
        LeaderElector::new(
            client.clone(),
            &ns,
            &flags.leader_election_id,
            flags.leader_election_lease_duration,
            flags.leader_election_retry_period,
        )
    });
    if let Some(elector) = &elector {
        tokio::select! {
            _ = elector.acquire() => {}
            r = sandhub_common::terminated() => {
                r.context("SIGTERM/SIGINT handler")?;
                return Ok(());
            }
        }
    }

    let lost_lease = async {
        match &elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    let extensions = async {
        if ctx.flags.extensions {
            tokio::try_join!(claim::run(ctx.clone()), warmpool::run(ctx.clone())).map(|_| ())
        } else {
            std::future::pending().await
        }
    };
    tracing::info!(extensions = ctx.flags.extensions, namespace = ?ctx.watch_namespace(), "starting controllers");
    // Ready once this replica leads and its controllers start (controller-runtime's readyz
    // reports the same); the watches then sync within the first list round trip.
    ctx.mark_ready();
    tokio::select! {
        r = sandbox::run(ctx.clone()) => r.context("sandbox controller stopped"),
        r = template::run(ctx.clone()) => r.context("sandboxtemplate controller stopped"),
        r = extensions => r.context("extension controllers stopped"),
        _ = lost_lease => anyhow::bail!("lost the leader Lease"),
        r = sandhub_common::terminated() => {
            r.context("SIGTERM/SIGINT handler")?;
            tracing::info!("shutting down");
            Ok(())
        }
    }
}
