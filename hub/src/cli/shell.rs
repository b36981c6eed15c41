//! `sandhub shell ID`: an interactive terminal in a sandbox over the hub's
//! WebSocket `GET /v1/sandboxes/{id}/pty`. Binary frames carry terminal
//! bytes both ways, a text frame `{"cols":C,"rows":R}` resizes, and the
//! hub ends with a text frame `{"exit_code":N}` before closing.

use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use futures::{SinkExt, StreamExt};
use http::{header, HeaderValue};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sandhub_api::{error::ErrorBody, hub::ResizeRequest};
use sandhub_client::{Error, PtySize, Result};
use serde::Deserialize;
use tokio::{
    io::AsyncReadExt,
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

use super::{terminal, ClientArgs};

/// RFC 3986 unreserved characters stay as they are.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Ctrl-D: what ends input on a terminal. Piped stdin has no keystroke for
/// it, so its end is sent as this byte.
const EOF_CHAR: u8 = 0x04;

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Sandbox id.
    id: String,

    /// Program to run, split on spaces (the hub's default is /bin/sh).
    #[arg(long, value_name = "PROGRAM", env = "SANDHUB_SHELL_COMMAND")]
    command: Option<String>,

    #[command(flatten)]
    client: ClientArgs,
}

/// The hub's last text frame is one of these.
#[derive(Deserialize)]
#[serde(untagged)]
enum Final {
    Exit { exit_code: i32 },
    Error(ErrorBody),
}

pub async fn run(args: ShellArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let size = terminal::size().unwrap_or(terminal::DEFAULT_SIZE);
    let url = pty_url(hub.base_url(), &args.id, args.command.as_deref(), size)?;
    let mut request = url
        .into_client_request()
        .map_err(|e| Error::invalid(format!("terminal URL: {e}")))?;
    if let Some(key) = args.client.api_key.as_deref().filter(|k| !k.is_empty()) {
        let value = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| Error::invalid("the API key is not a valid header value"))?;
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    let connect = tokio_tungstenite::connect_async_with_config(request, None, true);
    let (socket, _) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| Error::unavailable("the hub did not open the terminal in time"))?
        .map_err(handshake_error)?;

    let tty = terminal::stdin_is_tty();
    let raw = terminal::RawMode::enable()?;
    let code = session(socket, tty).await;
    drop(raw);
    code
}

async fn session<S>(socket: S, tty: bool) -> Result<i32>
where
    S: futures::Stream<Item = tungstenite::Result<Message>>
        + futures::Sink<Message, Error = tungstenite::Error>
        + Unpin,
{
    let (mut sink, mut frames) = socket.split();
    let install = |kind: SignalKind| {
        signal(kind).map_err(|e| Error::internal(format!("installing a signal handler: {e}")))
    };
    let mut resize = install(SignalKind::window_change())?;
    let mut terminate = install(SignalKind::terminate())?;
    let mut hangup = install(SignalKind::hangup())?;
    let mut input = read_stdin();
    let mut input_open = true;
    let mut exit_code = None;
    loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(Message::Binary(data))) => write_stdout(&data)?,
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<Final>(text.as_str()) {
                    Ok(Final::Exit { exit_code: code }) => exit_code = Some(code),
                    Ok(Final::Error(body)) => return Err(body.into()),
                    Err(_) => {}
                },
                Some(Ok(Message::Close(_))) | None => break,
                // Pings are answered by tungstenite itself.
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    // A hub that sent the exit code may drop the connection
                    // without a close frame; that is still a clean end.
                    if exit_code.is_some() {
                        break;
                    }
                    return Err(Error::unavailable(format!("terminal connection: {e}")));
                }
            },
            chunk = input.recv(), if input_open => {
                let frame = match chunk {
                    Some(data) => data,
                    None => {
                        input_open = false;
                        // In raw mode Ctrl-D is an ordinary byte; only piped
                        // input can end, and the remote shell should see it.
                        if tty {
                            continue;
                        }
                        Bytes::from_static(&[EOF_CHAR])
                    }
                };
                if sink.send(Message::Binary(frame)).await.is_err() {
                    input_open = false;
                }
            }
            _ = resize.recv() => {
                if let Some(size) = terminal::size() {
                    let _ = sink.send(resize_frame(size)).await;
                }
            }
            _ = terminate.recv() => return Ok(hang_up(&mut sink, libc::SIGTERM).await),
            _ = hangup.recv() => return Ok(hang_up(&mut sink, libc::SIGHUP).await),
        }
    }
    exit_code
        .ok_or_else(|| Error::unavailable("the terminal closed without reporting an exit code"))
}

/// Closing the socket makes the hub kill the remote shell.
async fn hang_up<K: futures::Sink<Message> + Unpin>(sink: &mut K, sig: i32) -> i32 {
    let _ = tokio::time::timeout(Duration::from_secs(2), sink.close()).await;
    128 + sig
}

/// Stdin as a channel of chunks, closed at its end. A task of its own
/// because a read of stdin cannot be cancelled (see [`super::exit`]).
fn read_stdin() -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = stdin.read(&mut buf).await {
            if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                return;
            }
        }
    });
    rx
}

fn write_stdout(data: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(data)
        .and_then(|()| out.flush())
        .map_err(|e| Error::internal(format!("writing to the terminal: {e}")))
}

fn resize_frame(size: PtySize) -> Message {
    let body = ResizeRequest {
        cols: size.cols,
        rows: size.rows,
    };
    Message::Text(serde_json::to_string(&body).unwrap_or_default().into())
}

/// `ws(s)://…/v1/sandboxes/{id}/pty?…` from the hub's `http(s)://…` URL.
fn pty_url(base: &str, id: &str, command: Option<&str>, size: PtySize) -> Result<String> {
    let rest = if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        return Err(Error::invalid(format!(
            "hub URL {base}: expected http(s)://"
        )));
    };
    let encode = |s: &str| utf8_percent_encode(s, QUERY).to_string();
    let mut url = format!(
        "{rest}/v1/sandboxes/{}/pty?cols={}&rows={}",
        encode(id),
        size.cols,
        size.rows
    );
    if let Some(command) = command {
        url.push_str("&command=");
        url.push_str(&encode(command));
    }
    Ok(url)
}

/// A refused upgrade carries the hub's usual `{code, message}` body.
fn handshake_error(e: tungstenite::Error) -> Error {
    match e {
        tungstenite::Error::Http(response) => {
            let body = response.body().as_deref().unwrap_or_default();
            Error::from_http(response.status().as_u16(), body)
        }
        other => Error::unavailable(format!("opening the terminal: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let size = PtySize {
            cols: 100,
            rows: 30,
        };
        assert_eq!(
            pty_url("http://127.0.0.1:7070", "sb-1", None, size).unwrap(),
            "ws://127.0.0.1:7070/v1/sandboxes/sb-1/pty?cols=100&rows=30"
        );
        assert_eq!(
            pty_url("https://hub/x", "a", Some("/bin/bash -l"), size).unwrap(),
            "wss://hub/x/v1/sandboxes/a/pty?cols=100&rows=30&command=%2Fbin%2Fbash%20-l"
        );
    }

    #[test]
    fn final_frames() {
        assert!(matches!(
            serde_json::from_str::<Final>(r#"{"exit_code":3}"#).unwrap(),
            Final::Exit { exit_code: 3 }
        ));
        assert!(matches!(
            serde_json::from_str::<Final>(r#"{"code":"NOT_FOUND","message":"x"}"#).unwrap(),
            Final::Error(_)
        ));
    }
}
