//! The watch stream of `GET /v1/sandboxes/{id}/watch`: server-sent events
//! whose `data` is a JSON array of `WatchEvent`, or, for an event named
//! `error`, an `ErrorBody` that ends the stream.

use std::collections::VecDeque;

use sandhub_api::error::ErrorBody;

use super::lines::LineDecoder;
use crate::{Error, Result, WatchEvent};

#[derive(Default)]
pub(crate) struct WatchSse {
    event: String,
    data: Vec<String>,
    done: bool,
}

impl WatchSse {
    fn dispatch(&mut self, out: &mut VecDeque<Result<Vec<WatchEvent>>>) {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        // The spec: an event with no data lines is not dispatched
        // (keep-alive comments and bare `event:` lines end up here).
        if data.is_empty() {
            return;
        }
        let data = data.join("\n");
        if event == "error" {
            self.done = true;
            out.push_back(Err(match serde_json::from_str::<ErrorBody>(&data) {
                Ok(body) => body.into(),
                Err(_) => Error::internal(format!("watch failed: {data}")),
            }));
            return;
        }
        match serde_json::from_str::<Vec<WatchEvent>>(&data) {
            Ok(events) if events.is_empty() => {}
            Ok(events) => out.push_back(Ok(events)),
            Err(e) => {
                self.done = true;
                out.push_back(Err(Error::internal(format!(
                    "the hub sent watch events that are not valid JSON: {e}"
                ))));
            }
        }
    }
}

impl LineDecoder for WatchSse {
    type Item = Vec<WatchEvent>;

    fn line(&mut self, line: &str, out: &mut VecDeque<Result<Vec<WatchEvent>>>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => self.data.push(value.to_string()),
            "event" => self.event = value.to_string(),
            // `id` and `retry` mean nothing to a watch, which is not resumable.
            _ => {}
        }
    }

    /// A watch may end at any time (the directory went away); a partial
    /// event at the end is dropped, as the SSE spec says.
    fn end(&mut self, _: &mut VecDeque<Result<Vec<WatchEvent>>>) {}

    fn finished(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WatchKind;
    use sandhub_api::error::Code;

    fn feed(lines: &[&str]) -> Vec<Result<Vec<WatchEvent>>> {
        let mut d = WatchSse::default();
        let mut out = VecDeque::new();
        for l in lines {
            d.line(l, &mut out);
        }
        d.end(&mut out);
        out.into_iter().collect()
    }

    #[test]
    fn events_comments_and_multiline_data() {
        let items = feed(&[
            ": keep-alive",
            "",
            "event: watch",
            r#"data: [{"type":"CREATE","path":"/a","is_dir":false,"timestamp_ms":1},"#,
            r#"data:  {"type":"REMOVE","path":"/b","is_dir":true,"timestamp_ms":2}]"#,
            "id: 1",
            "",
            "data: []",
            "",
            r#"data: [{"type":"WRITE","path":"/partial","is_dir":false,"timestamp_ms":3}]"#,
        ]);
        assert_eq!(items.len(), 1);
        let batch = items[0].as_ref().unwrap();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].kind, WatchKind::Create);
        assert_eq!(batch[1].path, "/b");
        assert!(batch[1].is_dir);
    }

    #[test]
    fn error_events_end_the_stream() {
        let mut d = WatchSse::default();
        let mut out = VecDeque::new();
        for l in [
            "event: error",
            r#"data: {"code":"RESOURCE_EXHAUSTED","message":"too many"}"#,
            "",
        ] {
            d.line(l, &mut out);
        }
        assert!(d.finished());
        assert_eq!(
            out.pop_front().unwrap().unwrap_err().code,
            Code::ResourceExhausted
        );
    }
}
