//! `sandhub image pull|prepull|import|ls|rm|prune`: the hub's image store
//! (local backend).

use std::{collections::HashMap, path::PathBuf};

use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sandhub_api::hub::{Image, PullEvent, PullRequest};
use sandhub_client::{http::HubClient, Error, Result};

use super::{output, ClientArgs};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Pull an image from a registry into the hub's store, with a
    /// progress bar per layer (on a terminal).
    Pull {
        /// `[registry/]repository[:tag|@sha256:...]`.
        reference: String,
        /// `name:tag` for the image in the store (default: the reference).
        #[arg(long, env = "SANDHUB_IMAGE_TAG")]
        tag: Option<String>,
        /// Registry user for this pull (else the hub's --registry-config).
        #[arg(long, env = "SANDHUB_REGISTRY_USERNAME", requires = "password_stdin")]
        username: Option<String>,
        /// Read the registry password from stdin (one line).
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// Pull several images (four at a time) with the hub's credentials, to
    /// warm a machine before a run. Fails when any of them fails.
    Prepull {
        /// Image references.
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Import an OCI layout (directory or tar) or a `docker save` tar.
    Import {
        /// The archive file, or an OCI layout directory (sent as a tar).
        path: PathBuf,
        /// `name:tag` for the image (default: the archive's own tag).
        #[arg(long, env = "SANDHUB_IMAGE_TAG")]
        tag: Option<String>,
        /// Which image of an OCI layout holding several (its
        /// `org.opencontainers.image.ref.name`, e.g. `app:1`).
        #[arg(long = "ref", env = "SANDHUB_IMAGE_REF")]
        pick: Option<String>,
    },
    /// List images.
    Ls,
    /// Remove a tag, or an image by id or by its last tag.
    Rm {
        /// `name:tag` or `sha256:<id>`.
        reference: String,
    },
    /// Remove untagged images no template uses, and unused layers.
    Prune,
}

pub async fn run(args: ImageArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let format = args.client.output;
    match args.command {
        ImageCommand::Pull {
            reference,
            tag,
            username,
            password_stdin,
        } => {
            let password = if password_stdin {
                Some(read_password()?)
            } else {
                None
            };
            let request = PullRequest {
                reference,
                tag,
                username,
                password,
            };
            let image = pull(&hub, &request).await?;
            output::show(format, &image, || image.id.clone())?;
        }
        ImageCommand::Prepull { references } => {
            let result = hub.prepull_images(&references).await?;
            output::show(format, &result, || {
                result
                    .images
                    .iter()
                    .map(|i| match (&i.id, &i.error) {
                        (Some(id), _) => format!("{}\t{id}", i.reference),
                        (_, Some(e)) => format!("{}\t{e}", i.reference),
                        _ => i.reference.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })?;
            if !result.ok {
                return Err(Error::new(
                    sandhub_api::error::Code::Unavailable,
                    format!(
                        "{} of {} images not pulled",
                        result.images.iter().filter(|i| !i.ok).count(),
                        result.images.len()
                    ),
                ));
            }
        }
        ImageCommand::Import { path, tag, pick } => {
            let image = hub
                .import_image_path(&path, tag.as_deref(), pick.as_deref())
                .await?;
            output::show(format, &image, || image.id.clone())?;
        }
        ImageCommand::Ls => {
            let images = hub.list_images().await?;
            output::show(format, &images, || table(&images))?;
        }
        ImageCommand::Rm { reference } => {
            let image = hub.remove_image(&reference).await?;
            output::show(format, &image, || image.id.clone())?;
        }
        ImageCommand::Prune => {
            let r = hub.prune_images().await?;
            output::show(format, &r, || {
                format!(
                    "{} images, {} layers, {} blobs removed",
                    r.images.len(),
                    r.layers,
                    r.blobs
                )
            })?;
        }
    }
    Ok(0)
}

fn read_password() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Error::invalid(format!("reading the password from stdin: {e}")))?;
    let password = line.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(Error::invalid("--password-stdin: stdin has no password"));
    }
    Ok(password)
}

/// Pulls with one bar per layer on stderr (indicatif draws nothing when
/// stderr is not a terminal).
async fn pull(hub: &HubClient, request: &PullRequest) -> Result<Image> {
    let bars = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let mut layers: HashMap<String, ProgressBar> = HashMap::new();
    let result = hub
        .pull_image_with(request, |event| match event {
            PullEvent::Resolved {
                reference,
                layers: ls,
                ..
            } => {
                let _ = bars.println(format!("{reference}: {} layers", ls.len()));
                for l in ls {
                    let bar = bars.add(ProgressBar::new(l.size));
                    bar.set_style(style.clone());
                    bar.set_prefix(short(&l.digest));
                    layers.insert(l.digest.clone(), bar);
                }
            }
            PullEvent::Layer {
                digest, downloaded, ..
            } => {
                if let Some(bar) = layers.get(digest) {
                    bar.set_position(*downloaded);
                }
            }
            PullEvent::LayerDone { digest, cached } => {
                if let Some(bar) = layers.get(digest) {
                    if *cached {
                        bar.set_position(bar.length().unwrap_or(0));
                    }
                    bar.finish_with_message(if *cached { "cached" } else { "done" });
                }
            }
            PullEvent::Done { .. } | PullEvent::Error { .. } => {}
        })
        .await;
    for bar in layers.values() {
        if !bar.is_finished() {
            bar.abandon();
        }
    }
    result
}

/// `sha256:0123456789ab`: enough of a digest to tell layers apart.
fn short(digest: &str) -> String {
    digest.chars().take(19).collect()
}

fn table(images: &[Image]) -> String {
    let rows: Vec<Vec<String>> = images
        .iter()
        .map(|i| {
            vec![
                if i.tags.is_empty() {
                    "<none>".into()
                } else {
                    i.tags.join(",")
                },
                i.id.chars().take(19).collect(),
                i.layers.len().to_string(),
                i.size_bytes.to_string(),
            ]
        })
        .collect();
    output::table(&["TAGS", "ID", "LAYERS", "SIZE_BYTES"], &rows)
}
