//! `sandhub template set|ls|get|rm`: what a sandbox is.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use sandhub_api::hub::{NamedTemplate, Network, Template};
use sandhub_client::{Error, Result, Sandboxes};

use super::{
    args::{parse_key_value, parse_volume_mount, to_map},
    output, ClientArgs, Output,
};

#[derive(Debug, Args)]
pub struct TemplateArgs {
    #[command(subcommand)]
    command: TemplateCommand,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum TemplateCommand {
    /// Create or replace a template, from flags or a JSON file.
    Set(Box<SetArgs>),
    /// List templates.
    Ls,
    /// Show one template.
    Get {
        /// Template name.
        name: String,
    },
    /// Delete a template.
    Rm {
        /// Template name.
        name: String,
    },
}

#[derive(Debug, Args)]
struct SetArgs {
    /// Template name.
    name: String,

    /// The template as JSON (the body of `PUT /v1/templates/{name}`); `-`
    /// reads stdin.
    #[arg(long, value_name = "PATH", env = "SANDHUB_TEMPLATE_FILE",
          conflicts_with_all = ["image", "root_fs", "seed_dir", "workdir", "user", "cpu", "memory_mb", "pids", "disk_mb", "network", "env"])]
    file: Option<PathBuf>,

    /// Image (`name:tag`, in the hub's image store) whose filesystem is the
    /// read-only root; its Env is the default environment.
    #[arg(
        long,
        value_name = "REF",
        env = "SANDHUB_TEMPLATE_IMAGE",
        conflicts_with = "root_fs"
    )]
    image: Option<String>,

    /// Host directory to use as the read-only root filesystem (default:
    /// the host's, allowlisted).
    #[arg(long, value_name = "DIR", env = "SANDHUB_TEMPLATE_ROOT_FS")]
    root_fs: Option<String>,

    /// Host directory whose contents seed /workspace.
    #[arg(long, value_name = "DIR", env = "SANDHUB_TEMPLATE_SEED_DIR")]
    seed_dir: Option<String>,

    /// CPU limit in cores (e.g. 0.5).
    #[arg(long, env = "SANDHUB_TEMPLATE_CPU")]
    cpu: Option<f64>,

    /// Memory limit in MiB.
    #[arg(long, value_name = "MB", env = "SANDHUB_TEMPLATE_MEMORY_MB")]
    memory_mb: Option<u64>,

    /// Most processes and threads at once.
    #[arg(long, env = "SANDHUB_TEMPLATE_PIDS")]
    pids: Option<u64>,

    /// Disk quota in MiB for everything a sandbox writes (default: the
    /// hub's --default-disk-mb).
    #[arg(long, value_name = "MB", env = "SANDHUB_TEMPLATE_DISK_MB")]
    disk_mb: Option<u64>,

    /// `none` (loopback only), `host`, or `egress` (through the hub's
    /// gateway; lists need `template set --file`).
    #[arg(long, env = "SANDHUB_TEMPLATE_NETWORK", value_parser = ["none", "host", "egress"])]
    network: Option<String>,

    /// Where commands naming no cwd run (absolute; default: the image's
    /// WorkingDir, else /workspace).
    #[arg(long, value_name = "DIR", env = "SANDHUB_TEMPLATE_WORKDIR")]
    workdir: Option<String>,

    /// Who commands run as, `user[:group]` (default: the image's User,
    /// else the sandbox's root).
    #[arg(long, value_name = "USER", env = "SANDHUB_TEMPLATE_USER")]
    user: Option<String>,

    /// Environment for every process, repeatable (env: one per line).
    #[arg(long = "env", value_name = "KEY=VALUE", env = "SANDHUB_TEMPLATE_ENV",
          value_delimiter = '\n', value_parser = parse_key_value)]
    env: Vec<(String, String)>,

    /// A named volume to mount, `NAME:PATH[:ro]`, repeatable (env:
    /// comma-separated).
    #[arg(long = "volume", value_name = "NAME:PATH[:ro]", env = "SANDHUB_TEMPLATE_VOLUMES",
          value_delimiter = ',', value_parser = parse_volume_mount)]
    volumes: Vec<sandhub_api::volumes::VolumeMount>,
}

pub async fn run(args: TemplateArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let format = args.client.output;
    match args.command {
        TemplateCommand::Set(set) => {
            let name = set.name.clone();
            let template = match &set.file {
                Some(path) => read_file(path, &name)?,
                None => from_flags(*set),
            };
            let named = hub.put_template(&name, template).await?;
            output::show(format, &named, || &named.name)?;
        }
        TemplateCommand::Ls => {
            let templates = hub.list_templates().await?;
            output::show(format, &templates, || template_table(&templates))?;
        }
        TemplateCommand::Get { name } => {
            let template = hub.get_template(&name).await?;
            output::show(format, &template, || {
                template_table(std::slice::from_ref(&template))
            })?;
        }
        TemplateCommand::Rm { name } => {
            hub.delete_template(&name).await?;
            if format == Output::Text {
                output::line(&name)?;
            }
        }
    }
    Ok(0)
}

fn from_flags(set: SetArgs) -> Template {
    Template {
        image: set.image,
        root_fs: set.root_fs,
        seed_dir: set.seed_dir,
        env: to_map(set.env),
        workdir: set.workdir,
        user: set.user,
        entrypoint: None,
        cpu: set.cpu,
        memory_mb: set.memory_mb,
        pids: set.pids,
        disk_mb: set.disk_mb,
        egress_mb: None,
        network: match set.network.as_deref() {
            Some("host") => Network::Host.into(),
            Some("egress") => Network::Egress.into(),
            _ => Network::None.into(),
        },
        // Flags cannot say them; a JSON file (`template set --file`) can.
        sidecars: Vec::new(),
        secrets: Vec::new(),
        idle_action: None,
        auto_resume: false,
        volumes: set.volumes,
    }
}

/// Accepts what `template get --output json` prints, so a template can be
/// saved, edited and set again: a `name` field is dropped when it matches.
fn read_file(path: &std::path::Path, name: &str) -> Result<Template> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    }
    .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    parse_template(&text, name).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))
}

fn parse_template(text: &str, name: &str) -> std::result::Result<Template, String> {
    let mut value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(object) = value.as_object_mut() {
        match object.remove("name") {
            None => {}
            Some(serde_json::Value::String(n)) if n == name => {}
            Some(other) => {
                return Err(format!("the file names the template {other}, not {name:?}"))
            }
        }
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

fn template_table(templates: &[NamedTemplate]) -> String {
    let rows: Vec<Vec<String>> = templates
        .iter()
        .map(|t| {
            let x = &t.template;
            vec![
                t.name.clone(),
                output::optional(&x.cpu),
                output::optional(&x.memory_mb),
                output::optional(&x.pids),
                output::optional(&x.disk_mb),
                match x.network.mode {
                    Network::None => "none".into(),
                    Network::Host => "host".into(),
                    Network::Egress => "egress".into(),
                },
                output::optional(&x.root_fs),
                output::optional(&x.seed_dir),
                output::pairs(&x.env),
            ]
        })
        .collect();
    output::table(
        &[
            "NAME",
            "CPU",
            "MEMORY_MB",
            "PIDS",
            "DISK_MB",
            "NETWORK",
            "ROOT_FS",
            "SEED_DIR",
            "ENV",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_may_carry_their_own_name() {
        let t = parse_template(r#"{"name":"py","cpu":0.5,"network":"host"}"#, "py").unwrap();
        assert_eq!(t.cpu, Some(0.5));
        assert_eq!(t.network, Network::Host.into());
        assert!(parse_template(r#"{"name":"other"}"#, "py")
            .unwrap_err()
            .contains("other"));
        assert!(parse_template(r#"{"cpus":1}"#, "py").is_err());
        assert_eq!(parse_template("{}", "py").unwrap(), Template::default());
    }
}
