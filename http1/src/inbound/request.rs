//! A fast-path request on its way upstream, as the outbound side's
//! [`Outgoing`]: the head already rewritten for the sandbox, then the
//! client's Content-Length body, streamed from the client socket.

use bytes::{Buf, BufMut, BytesMut};
use tokio::{io::AsyncWriteExt, net::TcpStream};

use super::ClientIo;
use crate::{
    outbound::{ExchangeError, Outgoing},
    wire::read_some,
};

/// The request as it goes to the sandbox: the rewritten head, followed by
/// the Content-Length body, partly already read (`buffered` bytes at the
/// front of `inbuf`) and partly (`remaining`) still on the client socket.
pub struct FastRequest<'a, S> {
    head: &'a [u8],
    inbuf: &'a mut BytesMut,
    /// `None` when the whole body came with the head: then the server
    /// watches the client for a hang-up meanwhile.
    client: Option<&'a mut S>,
    pub(super) buffered: usize,
    pub(super) remaining: u64,
    /// Body bytes streamed after the head.
    sent: u64,
}

impl<'a, S> FastRequest<'a, S> {
    /// `head` for the sandbox, then a body of `content_length` bytes that
    /// starts at the front of `inbuf`.
    pub(super) fn new(
        head: &'a [u8],
        inbuf: &'a mut BytesMut,
        client: Option<&'a mut S>,
        content_length: u64,
    ) -> Self {
        let buffered = (inbuf.len() as u64).min(content_length) as usize;
        Self {
            head,
            inbuf,
            client,
            buffered,
            remaining: content_length - buffered as u64,
            sent: 0,
        }
    }

    /// Body bytes streamed to the sandbox after the head (those that
    /// travelled with the head are not counted here).
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Takes a body that travelled whole with the head off the client's bytes.
    pub(super) fn settle(&mut self) {
        if self.remaining == 0 {
            self.inbuf.advance(self.buffered);
            self.buffered = 0;
        }
    }

    /// Whether the whole body has been taken from the client.
    pub(super) fn consumed(&self) -> bool {
        self.buffered == 0 && self.remaining == 0
    }
}

impl<S: ClientIo> Outgoing for FastRequest<'_, S> {
    /// A body already read travels with the head, so only one still on the
    /// client socket counts: until then a stale pooled connection can be
    /// replaced and the head (body included) written again.
    fn bodyless(&self) -> bool {
        self.remaining == 0
    }

    fn head(&self, buf: &mut BytesMut) {
        buf.put_slice(self.head);
        buf.put_slice(&self.inbuf[..self.buffered]);
    }

    async fn send_body(&mut self, s: &mut TcpStream) -> Result<(), ExchangeError> {
        self.inbuf.advance(self.buffered);
        self.sent += self.buffered as u64;
        self.buffered = 0;
        while self.remaining > 0 {
            if self.inbuf.is_empty() {
                let Some(client) = self.client.as_deref_mut() else {
                    return Err(ExchangeError::Body(
                        "the body is not on the client socket".into(),
                    ));
                };
                let n = read_some(client, self.inbuf).await?;
                if n == 0 {
                    return Err(ExchangeError::Body("client closed mid-body".into()));
                }
            }
            let take = (self.inbuf.len() as u64).min(self.remaining) as usize;
            s.write_all(&self.inbuf[..take]).await?;
            self.inbuf.advance(take);
            self.remaining -= take as u64;
            self.sent += take as u64;
        }
        Ok(())
    }
}
