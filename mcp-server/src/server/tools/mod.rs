//! The tools, one module per concern. Each module's `#[tool_router]` impl
//! block makes a router; [`SandhubMcp::router`](crate::SandhubMcp) adds
//! them up.
//!
//! Names, parameters and result fields of the tools upstream's MCP server
//! has (`create_sandbox` ... `get_sandbox_status`) are upstream's, so that
//! prompts written for it work unchanged; `namespace` is accepted
//! everywhere and ignored (the hub's tenant decides where sandboxes live).

pub mod code;
pub mod exec;
pub mod files;
pub mod lifecycle;
pub mod metrics;
pub mod ports;
pub mod process;
pub mod sandbox;
pub mod volumes;

use std::{future::Future, time::Duration};

use sandhub_api::limits;

use crate::errors::ToolError;

/// The longest any single bounded wait may be asked to last (tighter than
/// the hub's own [`sandhub_api::limits::MAX_TIMEOUT_SECONDS`]: one tool call
/// should not hold a model for a day).
const MAX_TIMEOUT_SECONDS: f64 = 3600.0;

/// A caller's timeout in seconds, or `default`; refuses nonsense values
/// (NaN, negative, past any clock) with the accepted range rather than
/// clamping them silently.
pub(crate) fn seconds(name: &str, value: Option<f64>, default: f64) -> Result<f64, ToolError> {
    let v = value.unwrap_or(default);
    limits::seconds_in(name, v, limits::MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS)
        .map_err(|e| ToolError::invalid(e.message))?;
    Ok(v)
}

/// A wait in seconds (default `default`) from 0 (answer at once) to `max`;
/// anything else is refused with that range.
pub(crate) fn wait(
    name: &str,
    value: Option<f64>,
    default: f64,
    max: f64,
) -> Result<Duration, ToolError> {
    limits::seconds_in(name, value.unwrap_or(default), 0.0, max)
        .map_err(|e| ToolError::invalid(e.message))
}

/// A sandbox lifetime in whole seconds, in the hub's range.
pub(crate) fn lifetime(name: &str, value: u64) -> Result<u64, ToolError> {
    limits::lifetime(name, value).map_err(|e| ToolError::invalid(e.message))?;
    Ok(value)
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
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e9,
            1e19,
            u64::MAX as f64,
        ] {
            let e = seconds("timeout", Some(bad), 60.0).unwrap_err();
            assert!(
                e.message()
                    .starts_with("timeout must be between 0.001 and 3600 seconds"),
                "{bad}: {e}"
            );
            assert!(e.message().contains("INVALID_ARGUMENT"), "{e}");
        }
    }

    #[test]
    fn waits_are_range_checked() {
        assert_eq!(wait("w", None, 0.0, 30.0).unwrap(), Duration::ZERO);
        assert_eq!(
            wait("w", Some(30.0), 0.0, 30.0).unwrap(),
            Duration::from_secs(30)
        );
        for bad in [-3.0, 30.5, 1e19, f64::NAN, f64::NEG_INFINITY] {
            let e = wait("wait_seconds", Some(bad), 0.0, 30.0).unwrap_err();
            assert!(
                e.message()
                    .starts_with("wait_seconds must be between 0 and 30 seconds"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn lifetimes_are_range_checked() {
        assert_eq!(lifetime("l", 300).unwrap(), 300);
        for bad in [0, u64::MAX] {
            let e = lifetime("shutdown_after_seconds", bad).unwrap_err();
            assert!(e.message().contains("INVALID_ARGUMENT"), "{e}");
        }
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
