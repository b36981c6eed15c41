//! The code interpreter's routes (`/v1/sandboxes/{id}/code...`): contexts
//! and executions streamed as [`CodeEvent`]s. Inherent methods of
//! [`HubClient`]: the [`crate::Sandboxes`] trait has no kernels in it.

use std::{collections::VecDeque, time::Duration};

use futures::TryStreamExt;
use reqwest::{header, Method};
use sandhub_api::{
    code::{CodeEvent, Context, ContextList, CreateContext, ExecuteCode, DEFAULT_TIMEOUT_SECONDS},
    error::ErrorBody,
};
use serde::Deserialize;

use super::{
    lines::{self, LineDecoder},
    transport_error, HubClient, QUICK,
};
use crate::{paths::encode, CodeEvents, Error, Result};

/// A kernel's start (create, restart) may take seconds on a cold sandbox.
const START: Duration = Duration::from_secs(120);

impl HubClient {
    /// `POST /v1/sandboxes/{id}/code/contexts`.
    pub async fn create_context(&self, id: &str, request: &CreateContext) -> Result<Context> {
        self.call(
            self.sandbox(Method::POST, id, "/code/contexts")
                .json(request)
                .timeout(START),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/code/contexts`.
    pub async fn list_contexts(&self, id: &str) -> Result<Vec<Context>> {
        let list: ContextList = self
            .call(
                self.sandbox(Method::GET, id, "/code/contexts")
                    .timeout(QUICK),
            )
            .await?;
        Ok(list.contexts)
    }

    /// `POST /v1/sandboxes/{id}/code/contexts/{context}/restart`.
    pub async fn restart_context(&self, id: &str, context: &str) -> Result<Context> {
        let rest = format!("/code/contexts/{}/restart", encode(context));
        self.call(self.sandbox(Method::POST, id, &rest).timeout(START))
            .await
    }

    /// `DELETE /v1/sandboxes/{id}/code/contexts/{context}`.
    pub async fn delete_context(&self, id: &str, context: &str) -> Result<()> {
        let rest = format!("/code/contexts/{}", encode(context));
        self.call_empty(self.sandbox(Method::DELETE, id, &rest).timeout(QUICK))
            .await
    }

    /// `POST /v1/sandboxes/{id}/code`: the execution's events as they come.
    pub async fn run_code(&self, id: &str, request: &ExecuteCode) -> Result<CodeEvents> {
        let timeout = request.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        let builder = self
            .sandbox(Method::POST, id, "/code")
            .header(header::ACCEPT, "application/x-ndjson")
            .json(request)
            // The hub cuts a stream at its timeout plus a grace; so do we.
            .timeout(START + Duration::from_secs(timeout) + Duration::from_secs(60));
        let response = self.send_streaming(builder).await?;
        let body = Box::pin(response.bytes_stream().map_err(transport_error));
        Ok(Box::pin(lines::decode(body, CodeLines::default())))
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Event(CodeEvent),
    Error(ErrorBody),
}

#[derive(Default)]
struct CodeLines {
    done: bool,
}

impl LineDecoder for CodeLines {
    type Item = CodeEvent;

    fn line(&mut self, line: &str, out: &mut VecDeque<Result<CodeEvent>>) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let item = match serde_json::from_str::<Line>(line) {
            Ok(Line::Event(e)) => Ok(e),
            Ok(Line::Error(body)) => Err(body.into()),
            Err(e) => Err(Error::internal(format!(
                "the hub sent a code event that is not valid JSON: {e}"
            ))),
        };
        self.done = matches!(item, Ok(CodeEvent::End { .. }) | Err(_));
        out.push_back(item);
    }

    fn end(&mut self, out: &mut VecDeque<Result<CodeEvent>>) {
        out.push_back(Err(Error::unavailable(
            "the code stream ended before its end event",
        )));
    }

    fn finished(&self) -> bool {
        self.done
    }
}
