//! `GET /v1/events`: the tenant's lifecycle events, server-sent. Each
//! message's `data` is one event (JSON with `id`, `type`, `time`, ...); an
//! event named `error` carries an `ErrorBody` and ends the stream (a
//! consumer the hub cut off for being too slow: resume with the last id).

use std::collections::{BTreeMap, VecDeque};

use futures::{stream::BoxStream, StreamExt, TryStreamExt};
use reqwest::{header, Method};
use sandhub_api::error::ErrorBody;

use super::{lines, lines::LineDecoder, transport_error, HubClient};
use crate::{Error, Result};

/// What `GET /v1/events` is asked for.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this sandbox's events.
    pub sandbox: Option<String>,
    /// Only these types (`created`, `deleted`, ...); empty: all.
    pub types: Vec<String>,
    /// Only events whose sandbox carries all these labels.
    pub labels: BTreeMap<String, String>,
    /// Resume after this id (`Last-Event-ID`); `Some(0)` replays the whole
    /// log, `None` starts at the newest event.
    pub last_event_id: Option<u64>,
}

/// One lifecycle event, as the hub sends it (see docs/events.md).
pub type Event = serde_json::Value;

impl HubClient {
    /// `GET /v1/events`: the caller's lifecycle events, oldest first, then
    /// live until the stream is dropped. Each item is one event's JSON.
    pub async fn events(&self, filter: &EventFilter) -> Result<BoxStream<'static, Result<Event>>> {
        let mut builder = self
            .request(Method::GET, "/v1/events")
            .header(header::ACCEPT, "text/event-stream");
        if let Some(s) = &filter.sandbox {
            builder = builder.query(&[("sandbox", s)]);
        }
        if !filter.types.is_empty() {
            builder = builder.query(&[("type", filter.types.join(","))]);
        }
        if !filter.labels.is_empty() {
            let labels: Vec<String> = filter
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            builder = builder.query(&[("labels", labels.join(","))]);
        }
        if let Some(id) = filter.last_event_id {
            builder = builder.header("Last-Event-ID", id.to_string());
        }
        let response = self.send_streaming(builder).await?;
        let body = Box::pin(response.bytes_stream().map_err(transport_error));
        Ok(lines::decode(body, EventSse::default()).boxed())
    }
}

#[derive(Default)]
struct EventSse {
    event: String,
    data: Vec<String>,
    done: bool,
}

impl LineDecoder for EventSse {
    type Item = Event;

    fn line(&mut self, line: &str, out: &mut VecDeque<Result<Event>>) {
        if line.starts_with(':') {
            return; // a heartbeat
        }
        if !line.is_empty() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => self.data.push(value.to_string()),
                "event" => self.event = value.to_string(),
                // The id is in the data too.
                _ => {}
            }
            return;
        }
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        if data.is_empty() {
            return;
        }
        let data = data.join("\n");
        if event == "error" {
            self.done = true;
            out.push_back(Err(match serde_json::from_str::<ErrorBody>(&data) {
                Ok(body) => body.into(),
                Err(_) => Error::internal(format!("the event stream failed: {data}")),
            }));
            return;
        }
        out.push_back(serde_json::from_str(&data).map_err(|e| {
            self.done = true;
            Error::internal(format!("the hub sent an event that is not JSON: {e}"))
        }));
    }

    fn end(&mut self, _: &mut VecDeque<Result<Event>>) {}

    fn finished(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_heartbeats_and_the_final_error() {
        let mut d = EventSse::default();
        let mut out = VecDeque::new();
        for line in [
            ": keep-alive",
            "",
            "id: 7",
            r#"data: {"id":7,"type":"created"}"#,
            "",
            "event: error",
            r#"data: {"code":"RESOURCE_EXHAUSTED","message":"too slow"}"#,
            "",
        ] {
            d.line(line, &mut out);
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].as_ref().unwrap()["type"], "created");
        let err = out[1].as_ref().unwrap_err();
        assert_eq!(err.code, sandhub_api::error::Code::ResourceExhausted);
        assert!(d.finished());
    }
}
