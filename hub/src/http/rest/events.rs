//! `GET /v1/events`: the caller's lifecycle events as Server-Sent Events.
//!
//! A stream replays the log after `Last-Event-ID` (without one it starts
//! at the newest event), then follows the live feed. The replay runs before subscribing, then a short second replay covers
//! what was stored meanwhile, so a long catch-up never overflows the live
//! ring; ids already sent are skipped, so nothing repeats. A consumer that
//! falls `--event-buffer` events behind the live feed gets a final `error`
//! event naming the last id it was sent, and the stream ends: the hub's
//! memory never grows for a slow reader (the ring is shared and bounded).

use std::{collections::BTreeMap, convert::Infallible, sync::Arc};

use axum::{
    extract::State,
    http::HeaderMap,
    response::sse::{Event as SseEvent, KeepAlive, Sse},
    Extension,
};
use futures::Stream;
use sandhub_api::error::{Code, ErrorBody};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    events::{Event, EventLog, EventType, Filter, Live},
    http::{ApiError, ApiQuery, ApiResult, AppState, Tenant},
};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

/// Events replayed per read of the log.
const PAGE: usize = 256;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// Only this sandbox's events.
    sandbox: Option<String>,
    /// Comma-separated event types (`created,deleted`); all by default.
    r#type: Option<String>,
    /// Comma-separated `key=value` pairs the sandbox must carry.
    labels: Option<String>,
    /// As the `Last-Event-ID` header (for clients that cannot set headers);
    /// `0` replays every event kept.
    last_event_id: Option<String>,
}

fn invalid(msg: String) -> ApiError {
    ApiError::new(Code::InvalidArgument, msg)
}

fn parse_filter(q: &EventQuery) -> ApiResult<Filter> {
    let mut types = Vec::new();
    for t in q.r#type.as_deref().unwrap_or("").split(',') {
        let t = t.trim();
        if t.is_empty() {
            continue;
        }
        let Some(kind) = EventType::parse(t) else {
            return Err(invalid(format!(
                "type: unknown event type `{t}`; one of: {}",
                EventType::names()
            )));
        };
        types.push(kind);
    }
    let mut labels = BTreeMap::new();
    for pair in q.labels.as_deref().unwrap_or("").split(',') {
        if pair.is_empty() {
            continue;
        }
        let Some((k, v)) = pair.split_once('=') else {
            return Err(invalid(format!("labels: `{pair}` must be key=value")));
        };
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    if q.sandbox.as_deref() == Some("") {
        return Err(invalid("sandbox: must not be empty".into()));
    }
    Ok(Filter {
        sandbox_id: q.sandbox.clone(),
        types,
        labels,
    })
}

/// Where the stream starts: after the id the client last saw, else after
/// the newest event now (live only).
fn resume_from(headers: &HeaderMap, q: &EventQuery) -> ApiResult<Option<u64>> {
    let (what, raw) = match (headers.get("last-event-id"), &q.last_event_id) {
        (Some(h), _) => (
            "Last-Event-ID",
            h.to_str()
                .map_err(|_| invalid("Last-Event-ID: not text".into()))?
                .to_string(),
        ),
        (None, Some(q)) => ("last_event_id", q.clone()),
        (None, None) => return Ok(None),
    };
    raw.trim()
        .parse::<u64>()
        .map(Some)
        .map_err(|_| invalid(format!("{what}: `{raw}` is not an event id")))
}

/// `e` as sent to `tenant`: it names the caller, whatever key the log
/// files it under (kubernetes: a digest; an operator's pool: none).
/// A live event: its shared JSON when the stream's caller is the tenant it
/// is filed under (always on the local backend).
fn sse_live(e: &Live, tenant: &str) -> SseEvent {
    if e.tenant != tenant {
        return sse(e, tenant);
    }
    SseEvent::default().id(e.id.to_string()).data(e.json())
}

fn sse(e: &Event, tenant: &str) -> SseEvent {
    let data = if e.tenant == tenant {
        serde_json::to_string(e)
    } else {
        serde_json::to_string(&Event {
            tenant: tenant.to_string(),
            ..e.clone()
        })
    };
    SseEvent::default()
        .id(e.id.to_string())
        .data(data.unwrap_or_default())
}

fn final_error(code: Code, message: String) -> SseEvent {
    SseEvent::default()
        .event("error")
        .data(serde_json::to_string(&ErrorBody { code, message }).unwrap_or_default())
}

/// Stream the caller's lifecycle events (Server-Sent Events). Each event's
/// `data` is one JSON event (`id`, `type`, `time`, `sandbox_id`, `pool`,
/// `labels`, `details`); resume with `Last-Event-ID`. A consumer too slow
/// for the live feed gets a final `event: error` and is disconnected.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventQuery),
    responses(
        (status = 200, content_type = "text/event-stream", body = Event),
        (status = 400, body = ErrorBody, description = "an unknown type, filter or Last-Event-ID"),
        (status = 429, body = ErrorBody, description = "too many open streams for this tenant"),
        (status = 501, body = ErrorBody, description = "this backend keeps no event log"),
    ))]
async fn events(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<EventQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let filter = parse_filter(&q)?;
    let from = resume_from(&headers, &q)?;
    let log = state.events.clone().ok_or_else(|| {
        ApiError::new(
            Code::Unimplemented,
            "lifecycle events are not available on this backend",
        )
    })?;
    let slot = log.open_stream(&tenant)?;
    let start = match from {
        Some(id) => id,
        None => log.newest()?,
    };
    let heartbeat = log.args().event_heartbeat;
    let buffer = log.args().event_buffer;
    let stream = follow(log, tenant, filter, start, buffer, slot);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(heartbeat)))
}

fn follow(
    log: Arc<EventLog>,
    tenant: String,
    filter: Filter,
    start: u64,
    buffer: usize,
    slot: crate::events::StreamSlot,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    async_stream::stream! {
        let _slot = slot;
        let key = log.tenant_key(&tenant);
        let mut last = start;
        let mut live = None;
        // Catch up from the log; once subscribed, one more pass covers what
        // was stored between the last page and the subscription.
        loop {
            let page = match log.after(&key, last, PAGE) {
                Ok(p) => p,
                Err(e) => {
                    yield Ok(final_error(e.code, e.message));
                    return;
                }
            };
            let full = page.len() == PAGE;
            for e in page {
                last = e.id;
                if filter.matches(&e) {
                    yield Ok(sse(&e, &tenant));
                }
            }
            if full {
                continue;
            }
            if live.is_some() {
                break;
            }
            live = Some(log.subscribe());
        }
        let Some(mut live) = live else { return };
        loop {
            match live.recv().await {
                Ok(e) => {
                    if !log.visible(&e, &key) || e.id <= last {
                        continue;
                    }
                    last = e.id;
                    if filter.matches(&e) {
                        yield Ok(sse_live(&e, &tenant));
                    }
                }
                Err(RecvError::Lagged(_)) => {
                    yield Ok(final_error(
                        Code::ResourceExhausted,
                        format!(
                            "this consumer fell more than {buffer} events behind and is \
                             disconnected; reconnect with Last-Event-ID: {last} to resume"
                        ),
                    ));
                    return;
                }
                Err(RecvError::Closed) => return,
            }
        }
    }
}
