//! Files over sandboxd's REST API, `/v1/files/{path}`.

use futures::{StreamExt, TryStreamExt};
use http::Method;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use sandhub_api::{
    error::Code,
    sandboxd::{DirectoryListing, FileEntry, MetaEntry, MetaListing, SetMode, META_ROUTE},
};

use super::{empty, full, json, SandboxdClient};
use crate::{
    paths::{encode_path, root_entry, split_parent, write_query},
    ByteStream, Error, Result, WriteOptions,
};

fn files_url(path: &str) -> String {
    format!("/v1/files/{}", encode_path(path))
}

fn meta_url(path: &str) -> String {
    format!("{META_ROUTE}/{}", encode_path(path))
}

impl SandboxdClient {
    /// Streams a file's bytes. A directory is refused (`?type=file`:
    /// CONFLICT), rather than handing back its listing as content.
    pub async fn read_file(&self, path: &str) -> Result<ByteStream> {
        let url = format!("{}?type=file", files_url(path));
        let response = self.send(Method::GET, &url, empty()).await?;
        let stream = response
            .into_body()
            .into_data_stream()
            .map_err(|e| Error::unavailable(format!("reading file from sandboxd: {e}")));
        Ok(Box::pin(stream))
    }

    /// Streams `data` into a file, creating parent directories. Without
    /// `append` the file is replaced atomically once the stream ends.
    pub async fn write_file(
        &self,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        let url = format!("{}{}", files_url(path), write_query(options));
        let body = StreamBody::new(data.map(|chunk| chunk.map(Frame::data))).boxed_unsync();
        self.send(Method::PUT, &url, body).await?;
        Ok(())
    }

    pub async fn list_files(&self, path: &str) -> Result<DirectoryListing> {
        let url = format!("{}?type=directory", files_url(path));
        json(self.send(Method::GET, &url, empty()).await?).await
    }

    /// `None` when nothing is at `path`. HEAD lets sandboxd judge the path
    /// (escapes stay errors); the entry itself comes from the parent's
    /// listing, the only place sandboxd reports mode and time.
    pub async fn stat(&self, path: &str) -> Result<Option<FileEntry>> {
        match self.send(Method::HEAD, &files_url(path), empty()).await {
            Ok(_) => {}
            Err(e) if e.code == Code::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        let Some((parent, name)) = split_parent(path) else {
            return Ok(Some(root_entry()));
        };
        match self.list_files(&parent).await {
            Ok(listing) => Ok(listing.entries.into_iter().find(|e| e.name == name)),
            // Removed between the two calls.
            Err(e) if e.code == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes a file or an empty directory; a non-empty directory needs
    /// `recursive` (else CONFLICT).
    pub async fn delete_file(&self, path: &str, recursive: bool) -> Result<()> {
        let mut url = files_url(path);
        if recursive {
            url.push_str("?recursive=true");
        }
        self.send(Method::DELETE, &url, empty()).await?;
        Ok(())
    }

    /// `path`'s ids, mode and times, its final name not followed (a link
    /// is PERMISSION_DENIED): sandboxd's own route, not upstream's.
    pub async fn meta(&self, path: &str) -> Result<MetaEntry> {
        json(self.send(Method::GET, &meta_url(path), empty()).await?).await
    }

    /// The regular files and directories of directory `path`, each with
    /// its ids, mode and times; links and special files left out.
    pub async fn meta_list(&self, path: &str) -> Result<Vec<MetaEntry>> {
        let url = format!("{}?list=true", meta_url(path));
        let listing: MetaListing = json(self.send(Method::GET, &url, empty()).await?).await?;
        Ok(listing.entries)
    }

    /// Makes directory `path` with `mode` (and its missing parents with
    /// `parents`, where one that exists is left as it is).
    pub async fn make_dir(&self, path: &str, parents: bool, mode: u32) -> Result<MetaEntry> {
        let url = format!("{}?mode={mode}&parents={parents}", meta_url(path));
        json(self.send(Method::POST, &url, empty()).await?).await
    }

    /// Sets `path`'s permission bits (a link is refused, not followed).
    pub async fn set_mode(&self, path: &str, mode: u32) -> Result<MetaEntry> {
        let body = serde_json::to_vec(&SetMode { mode })
            .map_err(|e| crate::Error::internal(format!("encoding a mode: {e}")))?;
        json(
            self.send(Method::PATCH, &meta_url(path), full(body))
                .await?,
        )
        .await
    }
}
