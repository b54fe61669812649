//! Where a repository is: a local directory, or an S3 bucket
//! (`s3://BUCKET/PREFIX`, with `?endpoint=URL` and `?region=R` for
//! S3-compatible servers). Credentials are not part of a location; the
//! caller passes them ([`crate::s3::S3Credentials`]).

use crate::{BackendError, ErrorKind, Result};
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
            crate::check_name("open", &prefix).map_err(|_| {
                bad(
                    s,
                    "the prefix may only hold letters, digits, `.`, `_`, `-` and `/`",
                )
            })?;
        }
        let (mut endpoint, mut region) = (None, None);
        for (k, v) in url.query_pairs() {
            match &*k {
                "endpoint" => endpoint = Some(v.into_owned()),
                "region" => region = Some(v.into_owned()),
                other => {
                    return Err(bad(
                        s,
                        format!("unknown option {other:?} (endpoint, region)"),
                    ))
                }
            }
        }
        Ok(Location::S3(S3Location {
            bucket,
            prefix,
            endpoint,
            region,
        }))
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
        for bad in [
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
