//! `sandhub image import|ls|rm|prune`: the hub's image store (local
//! backend).

use std::{io::Write, path::PathBuf};

use clap::{Args, Subcommand};
use sandhub_api::hub::Image;
use sandhub_client::{Error, Result};

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
        ImageCommand::Import { path, tag, pick } => {
            let body = archive_body(path).await?;
            let image = hub
                .import_image(body, tag.as_deref(), pick.as_deref())
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

/// A file streams as it is; a directory is tarred on the fly (symlinks
/// kept as links), so neither is read whole into memory.
async fn archive_body(path: PathBuf) -> Result<reqwest::Body> {
    let meta =
        std::fs::metadata(&path).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
        return Ok(reqwest::Body::from(file));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4);
    std::thread::spawn(move || {
        let errors = tx.clone();
        let mut b = tar::Builder::new(ChannelWriter(tx));
        b.follow_symlinks(false);
        let done = b.append_dir_all(".", &path).and_then(|()| b.finish());
        if let Err(e) = done {
            let _ = errors.blocking_send(Err(e));
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    Ok(reqwest::Body::wrap_stream(stream))
}

struct ChannelWriter(tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(buf.to_vec()))
            .map_err(|_| std::io::Error::other("the upload stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
