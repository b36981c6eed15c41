//! The Gym API: reset latency of one env, and batch-step throughput over
//! several envs with the action `true`.

use std::time::{Duration, Instant};

use anyhow::ensure;
use reqwest::Method;
use serde_json::{json, Value};

use super::{
    rest::Series,
    server::{str_field, Hub},
};
use crate::report::Progress;

async fn create_env(hub: &mut Hub) -> anyhow::Result<String> {
    let v = hub
        .call(Method::POST, "/gym/v1/envs", Some(json!({})))
        .await?;
    let id = str_field(&v, "env_id")?;
    hub.track_env(id.clone());
    Ok(id)
}

async fn reset(hub: &Hub, env: &str) -> anyhow::Result<Value> {
    hub.call(
        Method::POST,
        &format!("/gym/v1/envs/{env}/reset"),
        Some(json!({})),
    )
    .await
}

/// `n` resets of one env (the first, untimed, starts its episode).
pub async fn resets(hub: &mut Hub, n: u32, deadline: Instant) -> anyhow::Result<Series> {
    let env = create_env(hub).await?;
    reset(hub, &env).await?;
    let mut s = Series {
        samples: Vec::with_capacity(n as usize),
        stopped_early: false,
    };
    let mut progress = Progress::new("gym reset", n.into());
    for done in 1..=n {
        if Instant::now() >= deadline {
            eprintln!(
                "gym reset: phase deadline reached after {} samples",
                done - 1
            );
            s.stopped_early = true;
            break;
        }
        let t = Instant::now();
        reset(hub, &env).await?;
        s.samples.push(t.elapsed());
        progress.update(done.into());
    }
    Ok(s)
}

pub struct Throughput {
    pub envs: usize,
    pub batches: u32,
    pub elapsed: Duration,
    pub stopped_early: bool,
}

impl Throughput {
    pub fn steps_per_sec(&self) -> f64 {
        (self.envs as f64 * f64::from(self.batches)) / self.elapsed.as_secs_f64()
    }
}

/// `envs` envs reset, then up to `n` batch steps of all of them at once.
pub async fn steps(
    hub: &mut Hub,
    envs: u32,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<Throughput> {
    let mut ids = Vec::new();
    for _ in 0..envs {
        let id = create_env(hub).await?;
        reset(hub, &id).await?;
        ids.push(id);
    }
    let body = json!({"steps": ids.iter().map(|id| json!({"env_id": id, "action": "true"})).collect::<Vec<_>>()});
    // One untimed batch: connections and the envs' first exec.
    hub.call(Method::POST, "/gym/v1/step", Some(body.clone()))
        .await?;
    let mut progress = Progress::new("gym step", n.into());
    let mut batches = 0;
    let mut stopped_early = false;
    let start = Instant::now();
    for done in 1..=n {
        if Instant::now() >= deadline {
            eprintln!("gym step: phase deadline reached after {batches} batches");
            stopped_early = true;
            break;
        }
        let v = hub
            .call(Method::POST, "/gym/v1/step", Some(body.clone()))
            .await?;
        if done == 1 {
            let results = v["results"].as_array().map_or(0, Vec::len);
            ensure!(results == ids.len() || results == 0, "gym step: {v}");
        }
        batches += 1;
        progress.update(done.into());
    }
    Ok(Throughput {
        envs: ids.len(),
        batches,
        elapsed: start.elapsed(),
        stopped_early,
    })
}
