//! A sandbox's `network` on the command line: the flags `create` takes to
//! narrow its template's policy, and `sandhub network ID`, which shows or
//! changes a running sandbox's (`PATCH /v1/sandboxes/{id}/network`).
//! The words are the API's (docs/networking.md): a mode and two pattern
//! lists; the hub checks them, so the CLI refuses exactly what the API does.

use clap::Args;
use sandhub_api::hub::{Network, NetworkSpec, Sandbox};
use sandhub_client::{Result, Sandboxes};

use super::{output, ClientArgs};

/// `--network`, `--allow-out`, `--deny-out`.
#[derive(Debug, Clone, Default, Args)]
pub struct NetworkFlags {
    /// Narrow the template's network: `none` (offline) or the template's
    /// own mode. Lists without it mean `egress`.
    #[arg(long = "network", value_name = "MODE", env = "SANDHUB_NETWORK",
          value_parser = ["none", "host", "egress"])]
    mode: Option<String>,

    /// A destination the sandbox may reach, within its template's
    /// `allow_out` (a name, `*.name`, a CIDR, each with an optional TCP
    /// `:PORT`; `udp:HOST:PORT` for UDP), repeatable (env: comma-separated).
    #[arg(
        long = "allow-out",
        value_name = "PATTERN",
        env = "SANDHUB_ALLOW_OUT",
        value_delimiter = ','
    )]
    allow_out: Vec<String>,

    /// A destination the sandbox may never reach, repeatable (env:
    /// comma-separated).
    #[arg(
        long = "deny-out",
        value_name = "PATTERN",
        env = "SANDHUB_DENY_OUT",
        value_delimiter = ','
    )]
    deny_out: Vec<String>,
}

impl NetworkFlags {
    /// The request's `network`, or `None` when no flag was given.
    pub fn spec(&self) -> Option<NetworkSpec> {
        if self.mode.is_none() && self.allow_out.is_empty() && self.deny_out.is_empty() {
            return None;
        }
        let mode = match self.mode.as_deref() {
            Some("none") => Network::None,
            Some("host") => Network::Host,
            _ => Network::Egress,
        };
        Some(NetworkSpec {
            mode,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
        })
    }
}

#[derive(Debug, Args)]
pub struct NetworkArgs {
    /// Sandbox id.
    id: String,

    /// Cut the sandbox off: every new connection and name refused (the
    /// same as `--network none`).
    #[arg(long, conflicts_with_all = ["mode", "allow_out", "deny_out"])]
    none: bool,

    #[command(flatten)]
    network: NetworkFlags,

    #[command(flatten)]
    client: ClientArgs,
}

/// With no flag, prints the sandbox's own narrowing; with flags, replaces
/// it (new connections follow at once) and prints the result.
pub async fn run(args: NetworkArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let spec = if args.none {
        Some(Network::None.into())
    } else {
        args.network.spec()
    };
    let sandbox = match spec {
        Some(spec) => hub.set_network(&args.id, spec).await?,
        None => hub.get(&args.id).await?,
    };
    output::show(args.client.output, &sandbox, || describe(&sandbox))?;
    Ok(0)
}

/// `ID {"mode": ...}`, or `ID template` when it has no narrowing.
fn describe(sandbox: &Sandbox) -> String {
    match &sandbox.network {
        Some(n) => format!(
            "{} {}",
            sandbox.id,
            serde_json::to_string(n).unwrap_or_default()
        ),
        None => format!("{} template", sandbox.id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_the_api_words() {
        assert_eq!(NetworkFlags::default().spec(), None);
        let lists = NetworkFlags {
            allow_out: vec!["pypi.test".into()],
            deny_out: vec!["x.test".into()],
            ..Default::default()
        };
        let spec = lists.spec().unwrap();
        assert_eq!(spec.mode, Network::Egress);
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            serde_json::json!({"mode": "egress", "allow_out": ["pypi.test"], "deny_out": ["x.test"]})
        );
        let none = NetworkFlags {
            mode: Some("none".into()),
            ..Default::default()
        };
        assert_eq!(none.spec(), Some(Network::None.into()));
    }
}
