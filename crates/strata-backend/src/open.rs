//! The backend of a [`Location`], as every front end opens it: a local
//! directory (created, mode 0700, on request), or a bucket behind
//! retries and a bound on concurrent requests; counted by a [`Meter`] and
//! with an on-disk cache of immutable objects when asked. The settings
//! come from the caller (the library reads no environment).

use crate::cache::Cache;
use crate::local::LocalBackend;
use crate::location::{Location, S3Location};
use crate::object::{Backend, BackendError, Result};
use crate::s3::{S3Backend, S3Credentials, S3Options};
use crate::wrap::{Limit, Meter, Metering, Retry};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Concurrent requests to a bucket, at most.
pub const S3_CONNECTIONS: usize = 32;

/// Retries of a failed request to a bucket.
pub const S3_RETRIES: u32 = 3;

/// How to open a location.
#[derive(Default)]
pub struct Opening<'a> {
    /// Create a missing directory or bucket (for `init`).
    pub create: bool,
    /// A bucket's credentials (none: anonymous).
    pub credentials: S3Credentials,
    /// Counts the requests that reach the storage.
    pub meter: Option<Arc<Meter>>,
    /// For a bucket: a directory under which its objects whose names start
    /// with one of these prefixes are kept (one subdirectory per location;
    /// see [`cache_dir`]).
    pub cache: Option<(PathBuf, &'a [&'a str])>,
}

/// The backend of `loc`.
pub fn open(loc: &Location, how: &Opening<'_>) -> Result<Arc<dyn Backend>> {
    let inner: Arc<dyn Backend> = match loc {
        Location::Local(path) => {
            if how.create && !path.exists() {
                create_private_dir(path)?;
            }
            Arc::new(LocalBackend::new(path))
        }
        Location::S3(s) => bucket_backend(s, how)?,
    };
    let metered: Arc<dyn Backend> = match &how.meter {
        Some(m) => Arc::new(Metering::new(inner, m.clone())),
        None => inner,
    };
    // A bucket's immutable objects are kept on this machine too (the
    // meter counts only what reaches the bucket).
    match (loc, &how.cache) {
        (Location::S3(_), Some((base, prefixes))) => Ok(Arc::new(Cache::new(
            metered,
            cache_dir(base, loc),
            prefixes,
        ))),
        _ => Ok(metered),
    }
}

/// The bare S3 backend of `loc` (for what only S3 does: server-side copy).
pub fn bucket(loc: &Location, credentials: &S3Credentials) -> Result<S3Backend> {
    match loc {
        Location::S3(s) => S3Backend::open(s, credentials, S3Options::default()),
        Location::Local(p) => Err(BackendError::new(
            crate::object::ErrorKind::Invalid,
            "open",
            p.display().to_string(),
            "not a bucket",
        )),
    }
}

/// Where the cached objects of location `loc` live under `base`: one
/// directory per location (bucket, prefix and endpoint).
pub fn cache_dir(base: &Path, loc: &Location) -> PathBuf {
    let key = blake3::hash(format!("{loc:?}").as_bytes()).to_hex();
    base.join("objects").join(&key[..16])
}

fn bucket_backend(loc: &S3Location, how: &Opening<'_>) -> Result<Arc<dyn Backend>> {
    let b = S3Backend::open(loc, &how.credentials, S3Options::default())?;
    if how.create {
        b.ensure_bucket()?;
    }
    let mut r = Retry::new(Arc::new(b));
    r.retries = S3_RETRIES;
    Ok(Arc::new(Limit::new(Arc::new(r), S3_CONNECTIONS)))
}

/// A new repository directory is its owner's alone, like the objects in
/// it (an existing one keeps its mode).
fn create_private_dir(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let name = path.display().to_string();
    std::fs::create_dir_all(path).map_err(|e| BackendError::io("creating", name.clone(), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| BackendError::io("setting the mode of", name, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_is_private_and_an_old_one_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let new = tmp.path().join("a/repo");
        let how = Opening {
            create: true,
            ..Default::default()
        };
        let b = open(&Location::Local(new.clone()), &how).unwrap();
        b.put("config", b"x").unwrap();
        let mode = std::fs::metadata(&new).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o750)).unwrap();
        open(&Location::Local(new.clone()), &how).unwrap();
        let mode = std::fs::metadata(&new).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
    }

    #[test]
    fn a_meter_counts_requests_and_a_directory_is_not_a_bucket() {
        let tmp = tempfile::tempdir().unwrap();
        let meter = Arc::new(Meter::default());
        let how = Opening {
            create: true,
            meter: Some(meter.clone()),
            ..Default::default()
        };
        let loc = Location::Local(tmp.path().join("r"));
        let b = open(&loc, &how).unwrap();
        b.put("config", b"x").unwrap();
        b.get("config").unwrap();
        assert!(meter.puts.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        assert!(meter.gets.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        let e = bucket(&loc, &S3Credentials::default()).err().unwrap();
        assert!(e.to_string().contains("not a bucket"), "{e}");
    }

    #[test]
    fn each_location_caches_apart() {
        let base = Path::new("/c");
        let a = Location::parse("s3://bkt/x").unwrap();
        let b = Location::parse("s3://bkt/y").unwrap();
        assert_ne!(cache_dir(base, &a), cache_dir(base, &b));
        assert!(cache_dir(base, &a).starts_with("/c/objects"));
    }
}
