//! An image archive as a request body: a file streams as it is; an OCI
//! layout directory is tarred on the fly (symlinks kept as links), so
//! neither is read whole into memory. For `POST /v1/images/import`.

use std::{io::Write, path::Path};

use sandhub_api::hub::Image;

use crate::{http::HubClient, Error, Result};

impl HubClient {
    /// Imports the OCI layout directory or archive file (OCI layout or
    /// `docker save`) at `path`; `pick` names one image of a layout that
    /// holds several.
    pub async fn import_image_path(
        &self,
        path: &Path,
        tag: Option<&str>,
        pick: Option<&str>,
    ) -> Result<Image> {
        let body = archive_body(path).await?;
        self.import_image(body, tag, pick).await
    }
}

async fn archive_body(path: &Path) -> Result<reqwest::Body> {
    let meta =
        std::fs::metadata(path).map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))?;
        return Ok(reqwest::Body::from(file));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4);
    let path = path.to_path_buf();
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
