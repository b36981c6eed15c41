//! The process stream of `POST /v1/sandboxes/{id}/processes`: one JSON
//! object per line, a `ProcessEventWire` with base64 output, or an
//! `ErrorBody` when the process stream failed after the 200 went out.

use std::collections::VecDeque;

use base64::Engine;
use sandhub_api::{error::ErrorBody, hub::ProcessEventWire};
use serde::Deserialize;

use super::lines::LineDecoder;
use crate::{Error, ProcessEvent, Result};

#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Event(ProcessEventWire),
    Error(ErrorBody),
}

#[derive(Default)]
pub(crate) struct ProcessLines {
    done: bool,
}

impl LineDecoder for ProcessLines {
    type Item = ProcessEvent;

    fn line(&mut self, line: &str, out: &mut VecDeque<Result<ProcessEvent>>) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let item = match serde_json::from_str::<Line>(line) {
            Ok(Line::Event(wire)) => decode(wire),
            Ok(Line::Error(body)) => Err(body.into()),
            Err(e) => Err(Error::internal(format!(
                "the hub sent a process event that is not valid JSON: {e}"
            ))),
        };
        self.done = matches!(item, Ok(ProcessEvent::Exited { .. }) | Err(_));
        out.push_back(item);
    }

    fn end(&mut self, out: &mut VecDeque<Result<ProcessEvent>>) {
        out.push_back(Err(Error::unavailable(
            "the process stream ended before the exit event",
        )));
    }

    fn finished(&self) -> bool {
        self.done
    }
}

pub fn decode(wire: ProcessEventWire) -> Result<ProcessEvent> {
    let bytes = |data: String| {
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| Error::internal(format!("process output is not base64: {e}")))
    };
    Ok(match wire {
        ProcessEventWire::Started { pid } => ProcessEvent::Started { pid },
        ProcessEventWire::Stdout { data } => ProcessEvent::Stdout { data: bytes(data)? },
        ProcessEventWire::Stderr { data } => ProcessEvent::Stderr { data: bytes(data)? },
        ProcessEventWire::Exited { exit_code } => ProcessEvent::Exited { exit_code },
    })
}

/// The inverse, for servers (the hub) that write this stream.
pub fn encode(event: &ProcessEvent) -> ProcessEventWire {
    let text = |data: &[u8]| base64::engine::general_purpose::STANDARD.encode(data);
    match event {
        ProcessEvent::Started { pid } => ProcessEventWire::Started { pid: *pid },
        ProcessEvent::Stdout { data } => ProcessEventWire::Stdout { data: text(data) },
        ProcessEvent::Stderr { data } => ProcessEventWire::Stderr { data: text(data) },
        ProcessEvent::Exited { exit_code } => ProcessEventWire::Exited {
            exit_code: *exit_code,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::error::Code;

    fn feed(lines: &[&str]) -> (Vec<Result<ProcessEvent>>, bool) {
        let mut d = ProcessLines::default();
        let mut out = VecDeque::new();
        for l in lines {
            if !d.finished() {
                d.line(l, &mut out);
            }
        }
        let finished = d.finished();
        if !finished {
            d.end(&mut out);
        }
        (out.into_iter().collect(), finished)
    }

    #[test]
    fn events_decode_in_order() {
        let (items, finished) = feed(&[
            r#"{"type":"started","pid":7}"#,
            "",
            r#"{"type":"stdout","data":"aGk="}"#,
            r#"{"type":"stderr","data":"AP8="}"#,
            r#"{"type":"exited","exit_code":3}"#,
            r#"{"type":"stdout","data":"aWdub3JlZA=="}"#,
        ]);
        assert!(finished);
        let items: Vec<_> = items.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            items,
            [
                ProcessEvent::Started { pid: 7 },
                ProcessEvent::Stdout {
                    data: b"hi".to_vec()
                },
                ProcessEvent::Stderr { data: vec![0, 255] },
                ProcessEvent::Exited { exit_code: 3 },
            ]
        );
    }

    #[test]
    fn error_lines_and_truncation_are_errors() {
        let (items, _) = feed(&[r#"{"code":"NOT_FOUND","message":"gone"}"#]);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].as_ref().unwrap_err().code, Code::NotFound);

        let (items, finished) = feed(&[r#"{"type":"started","pid":1}"#]);
        assert!(!finished);
        assert_eq!(items[1].as_ref().unwrap_err().code, Code::Unavailable);

        let (items, _) = feed(&["not json"]);
        assert_eq!(items[0].as_ref().unwrap_err().code, Code::Internal);
    }

    #[test]
    fn encode_round_trips() {
        let e = ProcessEvent::Stdout {
            data: vec![1, 2, 255],
        };
        assert_eq!(decode(encode(&e)).unwrap(), e);
    }
}
