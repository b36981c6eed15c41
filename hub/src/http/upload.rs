//! A request body taken as an upload, the same way by every route that
//! stores one (sandbox files, volume files, E2B's volume content, image
//! imports): refused at once when its declared length passes
//! `--max-upload-bytes`, else streamed, cut off with an error as it passes
//! the cap (so the receiver discards its temporary file instead of
//! committing a truncated one), and drainable, so that a refusal given
//! before the body ended still reaches a client that is sending.

use axum::{
    body::Body,
    http::{header, HeaderMap},
};
use futures::TryStreamExt;
use sandhub_client::{ByteStream, Error};

use crate::guard::{drainable, Limits, Remainder, Tripped};

/// `UPLOAD_TOO_LARGE` before a byte is read when the declared
/// `Content-Length` is over the cap.
pub fn refuse_declared(limits: &Limits, headers: &HeaderMap) -> Result<(), Error> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limits.max_upload_bytes) {
        return Err(limits.upload_too_large());
    }
    Ok(())
}

/// The body as a stream capped at the upload limit.
pub struct Upload {
    pub data: ByteStream,
    /// Set once the body passed the cap: answer 413 whatever the receiver
    /// made of the cut.
    pub tripped: Tripped,
    /// What the receiver left unread: drain it before a refusal.
    pub remainder: Remainder,
}

pub fn capped(limits: &Limits, body: Body) -> Upload {
    let data: ByteStream = Box::pin(
        body.into_data_stream()
            .map_err(|e| Error::invalid(format!("reading the request body: {e}"))),
    );
    let (data, tripped) = limits.cap_upload(data);
    let (data, remainder) = drainable(data);
    Upload {
        data,
        tripped,
        remainder,
    }
}
