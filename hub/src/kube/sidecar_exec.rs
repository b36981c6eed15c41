//! `exec` in one of a sandbox's sidecars: through the Pod's exec API (the
//! sidecar runs no sandboxd), only in containers the tenant's template made
//! (named by the Pod's sidecars annotation), never in the sandbox's own
//! container or the base's others. Output is bounded like sandboxd's.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{AttachParams, AttachedProcess},
    Api,
};
use sandhub_api::{
    error::Code,
    hub::{ExecRequest, ExecResult},
    limits::MAX_TIMEOUT_SECONDS,
};
use sandhub_client::{sandboxd::TIMED_OUT_EXIT_CODE, Error, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::template::sidecar_names_in;

/// Most bytes kept of each of stdout and stderr; the rest is read and dropped.
const MAX_OUTPUT_BYTES: usize = 16 << 20;

/// Whether `pod` has a tenant sidecar named `container`.
pub fn is_sidecar(pod: &Pod, container: &str) -> bool {
    let named = sidecar_names_in(pod.metadata.annotations.as_ref())
        .iter()
        .any(|n| n == container);
    let present = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.containers.iter().any(|c| c.name == container));
    named && present
}

/// Runs `request` in `container` of `pod` (which the caller has checked
/// with [`is_sidecar`]).
pub async fn exec(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    request: ExecRequest,
) -> Result<ExecResult> {
    let params = AttachParams::default()
        .container(container)
        .stdin(!request.stdin.is_empty())
        .stdout(true)
        .stderr(true);
    let mut process = pods
        .exec(pod, request.command.argv(), &params)
        .await
        .map_err(|e| Error::unavailable(format!("exec in {pod}/{container}: {e}")))?;
    let limit = Duration::from_secs_f64(request.timeout_seconds.unwrap_or(MAX_TIMEOUT_SECONDS));
    match tokio::time::timeout(limit, run(&mut process, request.stdin)).await {
        Ok(result) => result,
        Err(_) => {
            // The stream goes; what kubelet started may run on (the exec
            // API cannot signal it), bounded by the container's own limits.
            process.abort();
            Ok(ExecResult {
                exit_code: TIMED_OUT_EXIT_CODE,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            })
        }
    }
}

async fn run(process: &mut AttachedProcess, stdin: String) -> Result<ExecResult> {
    if let Some(mut input) = process.stdin() {
        input
            .write_all(stdin.as_bytes())
            .await
            .map_err(|e| Error::unavailable(format!("writing stdin: {e}")))?;
        input
            .shutdown()
            .await
            .map_err(|e| Error::unavailable(format!("closing stdin: {e}")))?;
    }
    let (stdout, stderr) = (process.stdout(), process.stderr());
    let status = process.take_status();
    let (stdout, stderr) = tokio::join!(read_bounded(stdout), read_bounded(stderr));
    let status = match status {
        Some(s) => s.await,
        None => None,
    };
    let exit_code = match status {
        Some(s) if s.status.as_deref() == Some("Success") => 0,
        Some(s) => match exit_code_of(&s) {
            Some(code) => code,
            // No exit code: the process never ran (no such program...).
            None => {
                return Err(Error::new(
                    Code::FailedPrecondition,
                    format!("exec: {}", s.message.unwrap_or_default()),
                ))
            }
        },
        None => return Err(Error::unavailable("exec: the stream ended with no status")),
    };
    Ok(ExecResult {
        exit_code,
        stdout: String::from_utf8_lossy(&stdout?).into_owned(),
        stderr: String::from_utf8_lossy(&stderr?).into_owned(),
        timed_out: false,
    })
}

fn exit_code_of(s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> Option<i32> {
    s.details
        .as_ref()?
        .causes
        .iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))?
        .message
        .as_deref()?
        .parse()
        .ok()
}

async fn read_bounded(reader: Option<impl AsyncRead + Unpin>) -> Result<Vec<u8>> {
    let Some(mut reader) = reader else {
        return Ok(Vec::new());
    };
    let mut kept = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = reader
            .read(&mut chunk)
            .await
            .map_err(|e| Error::unavailable(format!("reading exec output: {e}")))?;
        if n == 0 {
            return Ok(kept);
        }
        let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..n.min(room)]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::template::SIDECARS_ANNOTATION;
    use super::*;
    use serde_json::json;

    #[test]
    fn only_annotated_containers_of_the_pod_are_sidecars() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {SIDECARS_ANNOTATION: "grader,db"}},
            "spec": {"containers": [{"name": "sandboxd"}, {"name": "grader"}, {"name": "base-extra"}]}
        }))
        .unwrap();
        assert!(is_sidecar(&pod, "grader"));
        assert!(!is_sidecar(&pod, "sandboxd"));
        assert!(!is_sidecar(&pod, "base-extra"));
        assert!(!is_sidecar(&pod, "db"), "named but not in the Pod");
        assert!(!is_sidecar(&pod, "grader,db"));
    }

    #[test]
    fn exit_codes_come_from_the_status_causes() {
        let s = serde_json::from_value(json!({"status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}))
        .unwrap();
        assert_eq!(exit_code_of(&s), Some(3));
        let s =
            serde_json::from_value(json!({"status": "Failure", "message": "executable not found"}))
                .unwrap();
        assert_eq!(exit_code_of(&s), None);
    }
}
