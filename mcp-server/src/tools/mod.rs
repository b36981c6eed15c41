//! The tools, one module per concern. Each module's `#[tool_router]` impl
//! block makes a router; [`SandhubMcp::router`](crate::SandhubMcp) adds
//! them up.
//!
//! Names, parameters and result fields of the tools upstream's MCP server
//! has (`create_sandbox` ... `get_sandbox_status`) are upstream's, so that
//! prompts written for it work unchanged; `namespace` is accepted
//! everywhere and ignored (the hub's tenant decides where sandboxes live).

pub mod exec;
pub mod files;
pub mod lifecycle;
pub mod process;
pub mod sandbox;

use std::{future::Future, time::Duration};

use crate::errors::ToolError;

/// The longest any single bounded wait may be asked to last.
const MAX_TIMEOUT_SECONDS: f64 = 3600.0;

/// A caller's timeout in seconds, or `default`; refuses nonsense values
/// with the accepted range rather than clamping them silently.
pub(crate) fn seconds(name: &str, value: Option<f64>, default: f64) -> Result<f64, ToolError> {
    let v = value.unwrap_or(default);
    if v.is_finite() && v > 0.0 && v <= MAX_TIMEOUT_SECONDS {
        Ok(v)
    } else {
        Err(ToolError::new(format!(
            "{name} must be a number of seconds greater than 0 and at most \
             {MAX_TIMEOUT_SECONDS}; got {v}"
        )))
    }
}

/// `value` (default `default`) clamped to `0..=max`: for waits where
/// asking for more than the bound is harmless and just means "the most".
pub(crate) fn wait(value: Option<f64>, default: f64, max: f64) -> Duration {
    let v = value.unwrap_or(default);
    let v = if v.is_finite() {
        v.clamp(0.0, max)
    } else {
        0.0
    };
    Duration::from_secs_f64(v)
}

/// Runs `fut` for at most `seconds`.
pub(crate) async fn bounded<T>(
    what: &str,
    seconds: f64,
    fut: impl Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::time::timeout(Duration::from_secs_f64(seconds), fut)
        .await
        .unwrap_or_else(|_| Err(ToolError::timed_out(what, seconds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_validated() {
        assert_eq!(seconds("timeout", None, 60.0).unwrap(), 60.0);
        assert_eq!(seconds("timeout", Some(0.5), 60.0).unwrap(), 0.5);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e9] {
            let e = seconds("timeout", Some(bad), 60.0).unwrap_err();
            assert!(e.message().starts_with("timeout must be"), "{bad}");
        }
    }

    #[test]
    fn waits_are_clamped() {
        assert_eq!(wait(None, 0.0, 30.0), Duration::ZERO);
        assert_eq!(wait(Some(100.0), 0.0, 30.0), Duration::from_secs(30));
        assert_eq!(wait(Some(-3.0), 0.0, 30.0), Duration::ZERO);
        assert_eq!(wait(Some(f64::NAN), 0.0, 30.0), Duration::ZERO);
    }

    #[tokio::test]
    async fn bounded_waits_end() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(())
        };
        let e = bounded("sleeping", 0.05, slow).await.unwrap_err();
        assert!(e.message().contains("did not finish within 0.05s"));
    }
}
