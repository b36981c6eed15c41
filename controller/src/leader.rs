//! Leader election on a `coordination.k8s.io/v1` Lease, the way controller-runtime does it:
//! the holder renews `renewTime` every retry period; a standby takes the Lease over once
//! `renewTime + leaseDurationSeconds` has passed. Every write carries the resourceVersion
//! it read, so two candidates can never both win the same takeover.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    retry_period: Duration,
}

/// What one attempt found.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    Leading,
    Following { holder: String },
}

/// Whether a Lease held by someone else may be taken over at `now`.
pub fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renew) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    renew.0.as_second().saturating_add(secs) < now.as_second()
        || (renew.0.as_second().saturating_add(secs) == now.as_second()
            && renew.0.subsec_nanosecond() < now.subsec_nanosecond())
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        lease_duration: Duration,
        retry_period: Duration,
    ) -> Self {
        let host = std::env::var("POD_NAME")
            .or_else(|_| {
                std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|_| "sandhub-controller".into());
        let identity = format!("{host}_{:016x}", rand::random::<u64>());
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity,
            lease_duration,
            retry_period,
        }
    }

    fn spec(&self, now: Timestamp, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(acquire.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One acquire-or-renew round trip.
    pub async fn try_acquire_or_renew(&self) -> kube::Result<Attempt> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Following {
                    holder: String::new(),
                }),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let new_spec = if holder == self.identity {
            self.spec(
                now,
                spec.acquire_time.clone(),
                spec.lease_transitions.unwrap_or(0),
            )
        } else if holder.is_empty() || expired(&spec, now) {
            self.spec(now, None, spec.lease_transitions.unwrap_or(0) + 1)
        } else {
            return Ok(Attempt::Following { holder });
        };
        lease.spec = Some(new_spec);
        // replace() sends the resourceVersion we read: a concurrent writer makes this 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Leading),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Following { holder }),
            Err(e) => Err(e),
        }
    }

    /// Returns once this process holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                    return;
                }
                Ok(Attempt::Following { holder }) => {
                    tracing::debug!(%holder, "waiting for the leader Lease")
                }
                Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
            }
            tokio::time::sleep(self.retry_period).await;
        }
    }

    /// Renews until the Lease is lost (another holder, or no successful renewal within the
    /// lease duration); then returns so the process can stop reconciling.
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => last_ok = tokio::time::Instant::now(),
                Ok(Attempt::Following { holder }) => {
                    tracing::error!(%holder, "leader Lease taken over");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "leader Lease renewal failed"),
            }
            // Stop well before a standby may take over (controller-runtime's renew deadline
            // is 2/3 of the lease duration).
            if last_ok.elapsed() > self.lease_duration * 2 / 3 {
                tracing::error!("could not renew the leader Lease in time");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_expires_after_its_duration_since_the_last_renewal() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let spec = LeaseSpec {
            renew_time: Some(MicroTime(t0)),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        assert!(!expired(&spec, t0));
        assert!(!expired(&spec, "2026-01-01T00:00:15Z".parse().unwrap()));
        assert!(expired(&spec, "2026-01-01T00:00:15.001Z".parse().unwrap()));
        assert!(expired(&LeaseSpec::default(), t0));
    }
}
