//! Where E2B's volume content API finds a volume's files: the hub's own
//! directory fd on the local backend ([`VolumeDir`], every step an
//! `openat2` that follows no link), or, on Kubernetes, the sandboxd of the
//! volume's helper Pod, whose `/v1/_sandhub/meta` route reports ids, modes
//! and times and never follows a final link either. Each call answers in
//! the same shapes whichever it is.

use std::time::SystemTime;

use axum::{
    body::Body,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use sandhub_api::{
    error::Code,
    sandboxd::{EntryType, FileEntry, MetaEntry},
};
use sandhub_client::{sandboxd::SandboxdClient, ByteStream, Error, Result, WriteOptions};

use crate::{
    backend::TenantView,
    volume_files::{Found, Meta, VolPath, VolumeDir},
};

/// One entry as the content API describes it.
pub struct Stat {
    pub name: String,
    pub kind: EntryType,
    pub size: u64,
    pub meta: Meta,
}

pub enum Store {
    Local(VolumeDir),
    Pod(Box<SandboxdClient>),
}

fn local(e: FileEntry, meta: Meta) -> Stat {
    Stat {
        name: e.name,
        kind: e.kind,
        size: e.size,
        meta,
    }
}

fn time(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).unwrap_or(SystemTime::UNIX_EPOCH)
}

fn remote(e: MetaEntry) -> Stat {
    Stat {
        meta: Meta {
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            atime: time(&e.atime),
            mtime: time(&e.mtime),
            ctime: time(&e.ctime),
        },
        name: e.name,
        kind: e.kind,
        size: e.size,
    }
}

impl Store {
    /// The caller's volume `name`: its directory, or its helper Pod's
    /// sandboxd where the backend has no local directories.
    pub async fn open(api: &dyn TenantView, name: &str) -> Result<Self> {
        match api.volume_dir(name).await {
            Ok(d) => Ok(Store::Local(d)),
            Err(e) if e.code == Code::Unimplemented => {
                Ok(Store::Pod(Box::new(api.volume_sandboxd(name).await?)))
            }
            Err(e) => Err(e),
        }
    }

    /// The ids of the sandboxes' root, as the entries' ids are recorded:
    /// the local backend's are shifted per sandbox; a Pod's are the ids
    /// its containers use.
    pub fn owner(&self) -> (u32, u32) {
        match self {
            Store::Local(d) => d.owner(),
            Store::Pod(_) => (0, 0),
        }
    }

    pub async fn stat(&self, path: &VolPath) -> Result<Stat> {
        match self {
            Store::Local(d) => {
                let (e, m) = d.stat_meta(path.clone()).await.map_err(|e| e.error)?;
                Ok(local(e, m))
            }
            Store::Pod(s) => s.meta(&path.relative()).await.map(remote),
        }
    }

    pub async fn list(&self, path: &VolPath) -> Result<Vec<Stat>> {
        match self {
            Store::Local(d) => Ok(d
                .list_meta(path.clone())
                .await
                .map_err(|e| e.error)?
                .into_iter()
                .map(|(e, m)| local(e, m))
                .collect()),
            Store::Pod(s) => Ok(s
                .meta_list(&path.relative())
                .await?
                .into_iter()
                .map(remote)
                .collect()),
        }
    }

    pub async fn make_dir(&self, path: &VolPath, parents: bool, mode: u32) -> Result<()> {
        match self {
            Store::Local(d) => d
                .make_dir(path.clone(), parents, mode)
                .await
                .map_err(|e| e.error),
            Store::Pod(s) => s.make_dir(&path.relative(), parents, mode).await.map(drop),
        }
    }

    pub async fn set_mode(&self, path: &VolPath, mode: u32) -> Result<()> {
        match self {
            Store::Local(d) => d.set_mode(path.clone(), mode).await.map_err(|e| e.error),
            Store::Pod(s) => s.set_mode(&path.relative(), mode).await.map(drop),
        }
    }

    /// Removes `path`, a directory with its contents (as E2B's remove does).
    pub async fn remove(&self, path: &VolPath) -> Result<()> {
        match self {
            Store::Local(d) => d.delete(path.clone(), true).await.map_err(|e| e.error),
            Store::Pod(s) => {
                // sandboxd's delete takes a final link itself, never its
                // target; a missing path is NOT_FOUND as on the local side.
                s.delete_file(&path.relative(), true).await
            }
        }
    }

    /// A file's bytes, streamed.
    pub async fn read(&self, path: &VolPath) -> Result<Response> {
        let (size, body) = match self {
            Store::Local(d) => match d.get(path.clone()).await.map_err(|e| e.error)? {
                Found::Directory(_) => return Err(is_a_directory(path)),
                Found::File { file, entry } => {
                    // Streamed from the fd already opened: nothing is
                    // looked up by name again while the bytes go out.
                    let stream = tokio_util::io::ReaderStream::with_capacity(
                        tokio::fs::File::from_std(file),
                        crate::volume_files::IO_CHUNK,
                    );
                    (entry.size, Body::from_stream(stream))
                }
            },
            Store::Pod(s) => {
                let rel = path.relative();
                let e = s.meta(&rel).await?;
                if e.kind == EntryType::Directory {
                    return Err(is_a_directory(path));
                }
                (e.size, Body::from_stream(s.read_file(&rel).await?))
            }
        };
        Ok(Response::builder()
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header(header::CONTENT_LENGTH, size)
            .body(body)
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
    }

    /// Replaces a file with `data`, made with `mode`.
    pub async fn write(&self, path: &VolPath, data: ByteStream, mode: u32) -> Result<()> {
        match self {
            Store::Local(d) => d.write(path.clone(), data, mode).await.map_err(|e| e.error),
            Store::Pod(s) => {
                let rel = path.relative();
                // sandboxd's write takes `0[0-7]{3}`; higher bits follow.
                let options = WriteOptions {
                    mode: Some(mode & 0o777),
                    ..Default::default()
                };
                s.write_file(&rel, data, options).await?;
                if mode > 0o777 {
                    s.set_mode(&rel, mode).await?;
                }
                Ok(())
            }
        }
    }
}

fn is_a_directory(path: &VolPath) -> Error {
    Error::invalid(format!("{}: is a directory", path.display()))
}
