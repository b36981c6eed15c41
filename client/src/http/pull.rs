//! The stream of `POST /v1/images/pull`: one `PullEvent` per line, the
//! last `done` or `error`. An `error` event becomes the stream's `Err`.

use std::collections::VecDeque;

use sandhub_api::hub::PullEvent;

use super::lines::LineDecoder;
use crate::{Error, Result};

#[derive(Default)]
pub(crate) struct PullLines {
    done: bool,
}

impl LineDecoder for PullLines {
    type Item = PullEvent;

    fn line(&mut self, line: &str, out: &mut VecDeque<Result<PullEvent>>) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let item = match serde_json::from_str::<PullEvent>(line) {
            Ok(PullEvent::Error { code, message }) => Err(Error::new(code, message)),
            Ok(event) => Ok(event),
            Err(e) => Err(Error::internal(format!(
                "the hub sent a pull event that is not valid JSON: {e}"
            ))),
        };
        self.done = matches!(item, Ok(PullEvent::Done { .. }) | Err(_));
        out.push_back(item);
    }

    fn end(&mut self, out: &mut VecDeque<Result<PullEvent>>) {
        out.push_back(Err(Error::unavailable(
            "the pull stream ended before its last event",
        )));
    }

    fn finished(&self) -> bool {
        self.done
    }
}
