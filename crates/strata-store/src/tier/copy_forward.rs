//! Copy-forward without downloading (Data Domain Cloud Tier §7): a new
//! object is assembled from byte ranges of existing objects and a few
//! literal bytes (a container's header and its metadata tail) *next to the
//! store*, so cleaning the cloud tier costs no egress. The cleaner only
//! says what goes where ([`Piece`]s); a [`CopyForward`] does it:
//!
//! - [`Service`]: `strata copy-forward-service`, a small HTTP service run
//!   beside the bucket (it holds the bucket's credentials, never the
//!   repository's key: it copies sealed bytes it cannot read);
//! - [`Download`]: reads the ranges here and uploads the result — the
//!   fallback, which does pay egress (what the others avoid).

use crate::backend::{create_object, Backend};
use crate::error::{Result, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One piece of an object being assembled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Piece {
    /// Bytes given here (hex).
    Literal(#[serde(with = "hex_bytes")] Vec<u8>),
    /// `len` bytes at `offset` of the object `source`.
    Range {
        source: String,
        offset: u64,
        len: u64,
    },
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(b))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        hex::decode(s).map_err(serde::de::Error::custom)
    }
}

/// A request to assemble `dest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assemble {
    pub dest: String,
    pub pieces: Vec<Piece>,
}

/// What assembling cost this side of the network.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    /// Bytes of stored objects read from the store to here.
    pub downloaded: u64,
    /// Bytes sent from here (literals, or everything when downloading).
    pub uploaded: u64,
    /// Bytes of a service's answers (status, not data).
    pub answers: u64,
    /// Requests made to the store on our behalf that no meter saw (S3's
    /// CreateMultipartUpload, UploadPart(Copy) and Complete).
    pub requests: u64,
}

pub trait CopyForward: Send + Sync {
    /// Writes `a.dest` from its pieces; the object appears whole or not at
    /// all.
    fn assemble(&self, a: &Assemble) -> Result<Cost>;
    /// What it is, for reports.
    fn describe(&self) -> String;
    /// Smallest range it can copy, but in the last piece (0: any).
    fn min_part(&self) -> u64 {
        0
    }
}

/// S3's own server-side copy (`UploadPartCopy` with source ranges): no
/// service to run, nothing downloaded; every range must hold 5 MiB, so
/// cleaning works on containers larger than that and copies some dead
/// bytes along.
pub struct S3Copy(pub Arc<crate::backend::s3::S3Backend>);

impl CopyForward for S3Copy {
    fn assemble(&self, a: &Assemble) -> Result<Cost> {
        use crate::backend::s3::CopyPart;
        let mut uploaded = 0;
        let parts: Vec<CopyPart> = a
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Literal(b) => {
                    uploaded += b.len() as u64;
                    CopyPart::Data(b.clone())
                }
                Piece::Range {
                    source,
                    offset,
                    len,
                } => CopyPart::Copy {
                    source: source.clone(),
                    offset: *offset,
                    len: *len,
                },
            })
            .collect();
        self.0.assemble_by_copy(&a.dest, &parts)?;
        Ok(Cost {
            downloaded: 0,
            uploaded,
            answers: 0,
            requests: parts.len() as u64 + 2,
        })
    }

    fn describe(&self) -> String {
        "S3 server-side copy (UploadPartCopy)".into()
    }

    fn min_part(&self) -> u64 {
        crate::backend::s3::MIN_PART
    }
}

/// Assembles `a` with `backend`: what the service does next to the store,
/// and what [`Download`] does here.
pub fn assemble_with(backend: &Arc<dyn Backend>, a: &Assemble) -> Result<u64> {
    let mut w = create_object(backend, &a.dest)?;
    for p in &a.pieces {
        match p {
            Piece::Literal(b) => w.write(b)?,
            Piece::Range {
                source,
                offset,
                len,
            } => {
                // In slices, so memory stays small whatever the range.
                let mut at = 0;
                while at < *len {
                    let n = (*len - at).min(8 << 20);
                    let bytes = backend.get_range(source, offset + at, n)?;
                    w.write(&bytes)?;
                    at += n;
                }
            }
        }
    }
    let n = w.written();
    w.finish()?;
    Ok(n)
}

/// Reads the ranges here and uploads the object (pays egress).
pub struct Download(pub Arc<dyn Backend>);

impl CopyForward for Download {
    fn assemble(&self, a: &Assemble) -> Result<Cost> {
        let n = assemble_with(&self.0, a)?;
        let literal: u64 = a
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Literal(b) => b.len() as u64,
                Piece::Range { .. } => 0,
            })
            .sum();
        Ok(Cost {
            downloaded: n - literal,
            uploaded: n,
            answers: 0,
            requests: 0,
        })
    }

    fn describe(&self) -> String {
        "download and upload".into()
    }
}

/// `strata copy-forward-service` at `url` (`http://HOST:PORT`).
pub struct Service {
    pub url: String,
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Service {
    pub fn new(url: &str) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Invalid(format!("cannot start an HTTP client: {e}")))?;
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| StoreError::Invalid(format!("cannot start an HTTP client: {e}")))?;
        Ok(Service {
            url: url.trim_end_matches('/').to_string(),
            rt,
            client,
        })
    }
}

impl CopyForward for Service {
    fn assemble(&self, a: &Assemble) -> Result<Cost> {
        let body = serde_json::to_vec(a).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let sent = body.len() as u64;
        let url = format!("{}/assemble", self.url);
        let fail = |m: String| {
            StoreError::Invalid(format!(
                "copy-forward service {}: {m} (is `strata copy-forward-service` running there?)",
                self.url
            ))
        };
        let (status, text) = self.rt.block_on(async {
            let r = self
                .client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| fail(e.to_string()))?;
            let status = r.status().as_u16();
            let text = r.text().await.map_err(|e| fail(e.to_string()))?;
            Ok::<_, StoreError>((status, text))
        })?;
        if status != 200 {
            return Err(fail(format!("answered {status}: {}", text.trim())));
        }
        Ok(Cost {
            downloaded: 0,
            uploaded: sent,
            answers: text.len() as u64,
            requests: 0,
        })
    }

    fn describe(&self) -> String {
        format!("copy-forward service at {}", self.url)
    }
}

/// Handles one service request: `body` is an [`Assemble`] in JSON; the
/// answer is `{"bytes": N}`. Only names of the repository's grammar are
/// accepted (the backend checks), and only below the backend's root.
pub fn serve(backend: &Arc<dyn Backend>, body: &[u8]) -> Result<String> {
    let a: Assemble = serde_json::from_slice(body)
        .map_err(|e| StoreError::Invalid(format!("not an assemble request: {e}")))?;
    let n = assemble_with(backend, &a)?;
    Ok(format!("{{\"bytes\":{n}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;

    #[test]
    fn objects_are_assembled_from_ranges_and_literals() {
        let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        b.put("data/aa/one", b"0123456789").unwrap();
        b.put("data/bb/two", b"abcdefghij").unwrap();
        let a = Assemble {
            dest: "data/cc/new".into(),
            pieces: vec![
                Piece::Literal(b"<".to_vec()),
                Piece::Range {
                    source: "data/aa/one".into(),
                    offset: 2,
                    len: 3,
                },
                Piece::Range {
                    source: "data/bb/two".into(),
                    offset: 7,
                    len: 3,
                },
                Piece::Literal(b">".to_vec()),
            ],
        };
        let json = serde_json::to_vec(&a).unwrap();
        assert_eq!(serve(&b, &json).unwrap(), "{\"bytes\":8}");
        assert_eq!(b.get("data/cc/new").unwrap(), b"<234hij>");
        let c = Download(b.clone()).assemble(&a).unwrap();
        assert_eq!((c.downloaded, c.uploaded), (6, 8));
        // Bad names never touch the store; a short source fails whole.
        let bad = Assemble {
            dest: "../escape".into(),
            pieces: vec![],
        };
        assert!(serve(&b, &serde_json::to_vec(&bad).unwrap()).is_err());
        let short = Assemble {
            dest: "data/dd/x".into(),
            pieces: vec![Piece::Range {
                source: "data/aa/one".into(),
                offset: 8,
                len: 5,
            }],
        };
        assert!(serve(&b, &serde_json::to_vec(&short).unwrap()).is_err());
        assert!(b.size("data/dd/x").unwrap().is_none());
        assert!(serve(&b, b"{").is_err());
    }
}
