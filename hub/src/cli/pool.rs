//! `sandhub pool set|ls|get|rm`: warm pools, with a progress bar while a
//! pool fills.

use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sandhub_api::{error::Code, hub::Pool, hub::PoolSpec};
use sandhub_client::{http::HubClient, Error, Result, Sandboxes};
use tokio::time::Instant;

use super::{args::parse_duration, output, ClientArgs, Output};

const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Args)]
pub struct PoolArgs {
    #[command(subcommand)]
    command: PoolCommand,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum PoolCommand {
    /// Create or resize a pool, then wait until it is full.
    Set(SetArgs),
    /// List pools.
    Ls,
    /// Show one pool.
    Get {
        /// Pool name.
        name: String,
    },
    /// Delete a pool and stop its warm sandboxes.
    Rm {
        /// Pool name.
        name: String,
    },
}

#[derive(Debug, Args)]
struct SetArgs {
    /// Pool name; `create --template NAME` claims from a pool of the same
    /// name first.
    name: String,

    /// Template of the pool's sandboxes.
    #[arg(long, env = "SANDHUB_POOL_TEMPLATE")]
    template: String,

    /// How many sandboxes to keep warm.
    #[arg(long, env = "SANDHUB_POOL_REPLICAS")]
    replicas: u32,

    /// Wait until every replica is ready (the default).
    #[arg(long, env = "SANDHUB_POOL_WAIT", overrides_with = "no_wait")]
    wait: bool,

    /// Return as soon as the hub has the new spec.
    #[arg(long, env = "SANDHUB_POOL_NO_WAIT", overrides_with = "wait")]
    no_wait: bool,

    /// Give up waiting after this long.
    #[arg(long, value_name = "DURATION", env = "SANDHUB_POOL_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    timeout: Duration,
}

pub async fn run(args: PoolArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let format = args.client.output;
    match args.command {
        PoolCommand::Set(set) => {
            let pool = hub
                .put_pool(
                    &set.name,
                    PoolSpec {
                        template: set.template,
                        replicas: set.replicas,
                    },
                )
                .await?;
            let pool = if set.no_wait {
                pool
            } else {
                wait_ready(&hub, pool, set.timeout).await?
            };
            output::show(format, &pool, || &pool.name)?;
        }
        PoolCommand::Ls => {
            let pools = hub.list_pools().await?;
            output::show(format, &pools, || pool_table(&pools))?;
        }
        PoolCommand::Get { name } => {
            let pool = hub.get_pool(&name).await?;
            output::show(format, &pool, || pool_table(std::slice::from_ref(&pool)))?;
        }
        PoolCommand::Rm { name } => {
            hub.delete_pool(&name).await?;
            if format == Output::Text {
                output::line(&name)?;
            }
        }
    }
    Ok(0)
}

/// Polls until `ready == replicas`, drawing `ready/replicas` on stderr
/// when it is a terminal (indicatif draws nothing otherwise).
async fn wait_ready(hub: &HubClient, mut pool: Pool, timeout: Duration) -> Result<Pool> {
    let deadline = Instant::now() + timeout;
    let bar =
        ProgressBar::with_draw_target(Some(u64::from(pool.replicas)), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} pool {msg} [{bar:30}] {pos}/{len} ready")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(pool.name.clone());
    bar.enable_steady_tick(Duration::from_millis(100));
    let result = loop {
        bar.set_length(u64::from(pool.replicas));
        bar.set_position(u64::from(pool.ready));
        if pool.ready >= pool.replicas {
            break Ok(pool);
        }
        if Instant::now() >= deadline {
            break Err(Error::new(
                Code::DeadlineExceeded,
                format!(
                    "pool {}: {}/{} ready after {}",
                    pool.name,
                    pool.ready,
                    pool.replicas,
                    humantime::format_duration(timeout)
                ),
            ));
        }
        tokio::time::sleep(POLL.min(deadline - Instant::now())).await;
        pool = hub.get_pool(&pool.name).await?;
    };
    match &result {
        Ok(_) => bar.finish(),
        Err(_) => bar.abandon(),
    }
    result
}

fn pool_table(pools: &[Pool]) -> String {
    let rows: Vec<Vec<String>> = pools
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.template.clone(),
                format!("{}/{}", p.ready, p.replicas),
                p.total.to_string(),
            ]
        })
        .collect();
    output::table(&["NAME", "TEMPLATE", "READY", "TOTAL"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let pool = Pool {
            name: "warm".into(),
            template: "default".into(),
            replicas: 3,
            ready: 1,
            total: 2,
            last_error: None,
        };
        assert_eq!(
            pool_table(&[pool]),
            "NAME   TEMPLATE   READY   TOTAL\nwarm   default    1/3     2"
        );
    }
}
