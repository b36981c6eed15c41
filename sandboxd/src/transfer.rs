//! Moving file bodies between the network and the disk with as few copies
//! as the kernel allows.
//!
//! tokio's `fs::File` copies every byte through its own buffer on the way
//! to or from the blocking pool; that copy was the top user-space symbol of
//! a large upload or download. Here the blocking pool writes the body's own
//! `Bytes` (vectored) and reads straight into the `BytesMut` the response
//! sends, with one disk operation in flight while the next chunk moves on
//! the network.

use std::{
    fs::File,
    io::{self, IoSlice, Write},
};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Bytes moved per blocking-pool round trip: the per-trip cost (a thread
/// handoff each way), not the copy, dominates on big files.
pub const IO_CHUNK: usize = 256 * 1024;

type WriteJob = JoinHandle<(File, io::Result<()>)>;

/// Writes a request body to `file` as it arrives, in batches of about
/// [`IO_CHUNK`]; past `limit` bytes (0: no limit) it stops with `too_large`.
pub async fn write_body<S>(
    file: File,
    mut body: S,
    limit: u64,
    too_large: impl Fn() -> Error,
    io_error: impl Fn(io::Error) -> Error,
) -> Result<()>
where
    S: Stream<Item = Result<Bytes>> + Unpin,
{
    let mut idle = Some(file);
    let mut in_flight: Option<WriteJob> = None;
    let mut batch: Vec<Bytes> = Vec::new();
    let mut batched = 0;
    let mut written: u64 = 0;
    loop {
        let next = body.next().await;
        let end = next.is_none();
        if let Some(chunk) = next {
            let chunk = chunk?;
            written += chunk.len() as u64;
            if limit > 0 && written > limit {
                return Err(too_large());
            }
            batched += chunk.len();
            if !chunk.is_empty() {
                batch.push(chunk);
            }
        }
        if batched >= IO_CHUNK || (end && !batch.is_empty()) {
            // One write in flight: wait for the last before handing this one over.
            let file = match (idle.take(), in_flight.take()) {
                (Some(f), _) => f,
                (None, Some(job)) => finished(job).await.map_err(&io_error)?,
                (None, None) => unreachable!("the file is either idle or being written"),
            };
            let pieces = std::mem::take(&mut batch);
            batched = 0;
            in_flight = Some(tokio::task::spawn_blocking(move || {
                let mut file = file;
                let result = write_all_vectored(&mut file, pieces);
                (file, result)
            }));
        }
        if end {
            if let Some(job) = in_flight {
                finished(job).await.map_err(&io_error)?;
            }
            return Ok(());
        }
    }
}

async fn finished(job: WriteJob) -> io::Result<File> {
    let (file, result) = job.await.map_err(io::Error::other)?;
    result.map(|()| file)
}

fn write_all_vectored(file: &mut File, pieces: Vec<Bytes>) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `count` bytes of `file` from `start`, as a stream of chunks read by the
/// blocking pool straight into the buffers that are sent; the next chunk is
/// read while the last one is on its way.
pub fn read_body(file: File, start: u64, count: u64) -> impl Stream<Item = io::Result<Bytes>> {
    let file = std::sync::Arc::new(file);
    let read = move |offset: u64, len: usize| {
        let file = file.clone();
        tokio::task::spawn_blocking(move || read_exact_at(&file, offset, len))
    };
    let first = (count > 0).then(|| read(start, chunk_len(count)));
    futures::stream::unfold((first, start, count), move |(job, offset, left)| {
        let read = read.clone();
        async move {
            let job = job?;
            let chunk = match job.await.map_err(io::Error::other).and_then(|r| r) {
                Ok(chunk) => chunk,
                Err(e) => return Some((Err(e), (None, offset, 0))),
            };
            let (offset, left) = (offset + chunk.len() as u64, left - chunk.len() as u64);
            let next = (left > 0).then(|| read(offset, chunk_len(left)));
            Some((Ok(chunk), (next, offset, left)))
        }
    })
}

fn chunk_len(left: u64) -> usize {
    left.min(IO_CHUNK as u64) as usize
}

/// Reads exactly `len` bytes at `offset` into fresh, unzeroed memory; a
/// file that shrank meanwhile is an error (the response already promised
/// its Content-Length).
fn read_exact_at(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let at = offset + buf.len() as u64;
        let want = len - buf.len();
        let n = match rustix::io::pread(file, &mut buf.spare_capacity_mut()[..want], at) {
            Ok((filled, _)) => filled.len(),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: pread initialised the first n bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
    }
    Ok(buf.freeze())
}
