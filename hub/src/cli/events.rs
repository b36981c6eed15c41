//! `sandhub events [-f]`: the caller's lifecycle events (`GET /v1/events`).
//! Without `-f`, what the hub's log keeps, then exit; with `-f`, new events
//! as they happen, reconnecting after the last one seen (a dropped
//! connection or a stream the hub cut off resumes without a gap).

use std::{io::Write, time::Duration};

use clap::Args;
use futures::StreamExt;
use sandhub_api::error::Code;
use sandhub_client::{
    http::{Event, EventFilter},
    Result,
};

use super::{args::parse_key_value, args::to_map, ClientArgs, Output};

/// Without `-f`, the replay is over once the stream is quiet this long.
const QUIET: Duration = Duration::from_secs(1);
/// Between reconnects of `-f`.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Follow: wait for new events (from now, or after --after).
    #[arg(short = 'f', long)]
    follow: bool,

    /// Only this sandbox's events.
    #[arg(long)]
    sandbox: Option<String>,

    /// Only these types (repeat, or comma-separate): created, deleted, ...
    #[arg(long = "type", value_delimiter = ',')]
    types: Vec<String>,

    /// Only events of sandboxes with this label (`KEY=VALUE`, repeatable).
    #[arg(long = "label", value_parser = parse_key_value)]
    labels: Vec<(String, String)>,

    /// Start after this event id (0: everything the hub keeps).
    #[arg(long)]
    after: Option<u64>,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn run(args: EventsArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let mut filter = EventFilter {
        sandbox: args.sandbox,
        types: args.types,
        labels: to_map(args.labels),
        last_event_id: match (args.after, args.follow) {
            (Some(id), _) => Some(id),
            (None, true) => None,
            (None, false) => Some(0),
        },
    };
    loop {
        let mut stream = hub.events(&filter).await?;
        loop {
            let next = if args.follow {
                stream.next().await
            } else {
                match tokio::time::timeout(QUIET, stream.next()).await {
                    Ok(next) => next,
                    Err(_) => return Ok(0),
                }
            };
            match next {
                Some(Ok(event)) => {
                    if let Some(id) = event["id"].as_u64() {
                        filter.last_event_id = Some(id);
                    }
                    print(&event, args.client.output);
                }
                // Cut off for being slow, or the connection broke: resume.
                Some(Err(e)) if args.follow && e.code != Code::InvalidArgument => {
                    eprintln!("events: {e}; resuming");
                    break;
                }
                Some(Err(e)) => return Err(e),
                None if args.follow => break,
                None => return Ok(0),
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

fn print(event: &Event, output: Output) {
    let line = match output {
        Output::Json => event.to_string(),
        Output::Text => {
            let subject = event["sandbox_id"].as_str().unwrap_or("-");
            let pool = event["pool"]
                .as_str()
                .map(|p| format!(" pool={p}"))
                .unwrap_or_default();
            let details = match &event["details"] {
                serde_json::Value::Object(m) if !m.is_empty() => format!(" {}", event["details"]),
                _ => String::new(),
            };
            format!(
                "{:>6} {} {:<20} {subject}{pool}{details}",
                event["id"],
                event["time"].as_str().unwrap_or(""),
                event["type"].as_str().unwrap_or(""),
            )
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
