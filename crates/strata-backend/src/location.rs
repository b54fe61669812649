//! Where a repository is: a local directory, or an S3 bucket
//! (`s3://BUCKET/PREFIX`, with `?endpoint=URL` and `?region=R` for
//! S3-compatible servers, `?addressing=path|virtual` and
//! `?payload=unsigned|signed`). Credentials are not part of a location; the
//! caller passes them ([`crate::s3::S3Credentials`]).

use crate::object::{BackendError, ErrorKind, Result};
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    S3(S3Location),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Folder inside the bucket (no leading or trailing `/`; may be empty).
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// `?addressing=`: `Some(true)` = virtual-hosted (`BUCKET.host/key`),
    /// `Some(false)` = path-style (`host/BUCKET/key`); `None` = the
    /// default, see [`S3Location::virtual_hosted`].
    pub addressing: Option<bool>,
    /// `?payload=signed` makes SigV4 sign a hash of every uploaded body;
    /// the default sends `UNSIGNED-PAYLOAD` (see
    /// [`S3Location::signed_payload`]).
    pub signed_payload: Option<bool>,
}

impl S3Location {
    /// A bucket on a named endpoint (a MinIO, a versitygw, a Ceph) is
    /// addressed path-style, as those servers expect unless configured
    /// for virtual hosts; AWS itself (no endpoint) virtual-hosted, the
    /// only style it offers new buckets.
    pub fn virtual_hosted(&self) -> bool {
        self.addressing.unwrap_or(self.endpoint.is_none())
    }

    /// Whether uploads carry a SHA-256 of their body in the signature.
    /// Off by default: every object Strata reads back is checked by its
    /// envelope (MAC or checksum), so the payload hash would only cost a pass
    /// over every byte on both sides (client and server) — about a third
    /// of an S3 server's CPU on a first backup over loopback.
    pub fn signed_payload(&self) -> bool {
        self.signed_payload.unwrap_or(false)
    }

    /// A location of `bucket` with the defaults (tests, the bench).
    pub fn new(bucket: &str, prefix: &str, endpoint: Option<String>) -> Self {
        S3Location {
            bucket: bucket.into(),
            prefix: prefix.into(),
            endpoint,
            region: None,
            addressing: None,
            signed_payload: None,
        }
    }
}

/// How a location reads in messages: its directory, or `s3://BUCKET/PREFIX`.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::S3(s) if s.prefix.is_empty() => write!(f, "s3://{}", s.bucket),
            Location::S3(s) => write!(f, "s3://{}/{}", s.bucket, s.prefix),
        }
    }
}

fn bad(s: &str, why: impl Into<String>) -> BackendError {
    BackendError::new(ErrorKind::Invalid, "open", s, why)
}

impl Location {
    /// Parses a `--repo` value: `s3://…` or a path.
    pub fn parse(s: &str) -> Result<Self> {
        if !s.starts_with("s3://") {
            if s.contains("://") {
                return Err(bad(
                    s,
                    "unknown scheme; use a directory or s3://BUCKET/PREFIX",
                ));
            }
            return Ok(Location::Local(PathBuf::from(s)));
        }
        let path_part = s["s3://".len()..].split('?').next().unwrap_or_default();
        if path_part.split('/').any(|c| c == ".." || c == ".") {
            return Err(bad(s, "`.` and `..` are not allowed in the prefix"));
        }
        let url = url::Url::parse(s).map_err(|e| bad(s, format!("not a valid URL: {e}")))?;
        let bucket = url
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| bad(s, "no bucket: use s3://BUCKET/PREFIX"))?
            .to_string();
        let valid_bucket = bucket.len() >= 3
            && bucket.len() <= 63
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid_bucket {
            return Err(bad(s, format!("{bucket:?} is not a valid bucket name")));
        }
        let prefix = url.path().trim_matches('/').to_string();
        if !prefix.is_empty() {
            crate::object::check_name("open", &prefix).map_err(|_| {
                bad(
                    s,
                    "the prefix may only hold letters, digits, `.`, `_`, `-` and `/`",
                )
            })?;
        }
        let mut loc = S3Location::new(&bucket, &prefix, None);
        for (k, v) in url.query_pairs() {
            match (&*k, &*v) {
                ("endpoint", _) => loc.endpoint = Some(v.into_owned()),
                ("region", _) => loc.region = Some(v.into_owned()),
                ("addressing", "path") => loc.addressing = Some(false),
                ("addressing", "virtual") => loc.addressing = Some(true),
                ("payload", "signed") => loc.signed_payload = Some(true),
                ("payload", "unsigned") => loc.signed_payload = Some(false),
                ("addressing", _) | ("payload", _) => {
                    return Err(bad(
                        s,
                        format!("{k}={v:?}: use addressing=path|virtual, payload=signed|unsigned"),
                    ))
                }
                (other, _) => {
                    return Err(bad(
                        s,
                        format!("unknown option {other:?} (endpoint, region, addressing, payload)"),
                    ))
                }
            }
        }
        Ok(Location::S3(loc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(
            Location::parse("/srv/repo").unwrap(),
            Location::Local("/srv/repo".into())
        );
        let Location::S3(l) =
            Location::parse("s3://my-bucket/a/b?endpoint=http://127.0.0.1:7070&region=eu-1")
                .unwrap()
        else {
            panic!()
        };
        assert_eq!(l.bucket, "my-bucket");
        assert_eq!(l.prefix, "a/b");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(l.region.as_deref(), Some("eu-1"));
        let Location::S3(l) = Location::parse("s3://bkt").unwrap() else {
            panic!()
        };
        assert_eq!(l.prefix, "");
        assert!(l.virtual_hosted(), "AWS itself: virtual-hosted");
        assert!(!l.signed_payload());
        let Location::S3(l) =
            Location::parse("s3://bkt/p?endpoint=http://h:1&payload=signed").unwrap()
        else {
            panic!()
        };
        assert!(!l.virtual_hosted(), "a named endpoint: path-style");
        assert!(l.signed_payload());
        let Location::S3(l) =
            Location::parse("s3://bkt/p?endpoint=http://h:1&addressing=virtual").unwrap()
        else {
            panic!()
        };
        assert!(l.virtual_hosted());
        for bad in [
            "s3://bkt/x?addressing=dns",
            "s3://bkt/x?payload=yes",
            "s3://",
            "s3://B/x",
            "s3://bkt/../x",
            "s3://bkt/x?foo=1",
            "gs://x/y",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
    }
}
