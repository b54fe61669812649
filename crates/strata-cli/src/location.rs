//! Where the repository is (`--repo`, `$STRATA_REPO`, or the default
//! directory) and the backend that reaches it. For `s3://` repositories
//! the CLI — not the library — reads the usual AWS settings: the endpoint
//! from `?endpoint=` or `$AWS_ENDPOINT_URL`, the region from `?region=` or
//! `$AWS_REGION`/`$AWS_DEFAULT_REGION`, credentials from
//! `$AWS_ACCESS_KEY_ID`/`$AWS_SECRET_ACCESS_KEY`/`$AWS_SESSION_TOKEN` or
//! else the profile `$AWS_PROFILE` (default `default`) of
//! `$AWS_SHARED_CREDENTIALS_FILE` (default `~/.aws/credentials`).

use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_store::backend::location::S3Location;
use strata_store::backend::s3::{S3Backend, S3Credentials, S3Options};
use strata_store::backend::wrap::{Limit, Meter, Metering, Retry};
use strata_store::backend::{Backend, Cache, LocalBackend, Location};

/// The default repository directory: `strata/repo` in the user's data
/// directory (`$XDG_DATA_HOME`, else `~/.local/share`).
pub fn default_repo() -> Result<PathBuf> {
    let dirs = directories::BaseDirs::new()
        .ok_or_else(|| anyhow!("neither --repo, $STRATA_REPO nor a home directory is set"))?;
    Ok(dirs.data_dir().join("strata/repo"))
}

/// Where local caches live: `$STRATA_CACHE_DIR`, else `strata` in the
/// user's cache directory (`$XDG_CACHE_HOME`, `~/.cache`); `None` when
/// `$STRATA_NO_CACHE` is set (not empty, not 0). Passed to the library
/// (`Repository::with_cache`), which reads no environment.
pub fn cache_base() -> Option<PathBuf> {
    if std::env::var_os("STRATA_NO_CACHE").is_some_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    match std::env::var_os("STRATA_CACHE_DIR").filter(|v| !v.is_empty()) {
        Some(d) => Some(PathBuf::from(d)),
        None => Some(directories::BaseDirs::new()?.cache_dir().join("strata")),
    }
}

/// Where the volumes of the repository at `loc` live, for reading the
/// containers they hold for it (linked snapshots): a local repository's
/// `volumes/`; a bucket's volumes never hold its containers.
pub fn volumes_of(loc: &Location) -> Option<PathBuf> {
    match loc {
        Location::Local(p) => Some(p.join("volumes")),
        _ => None,
    }
}

/// The repository's location from `--repo` (or the default directory).
pub fn location(repo: Option<&str>) -> Result<Location> {
    let loc = match repo {
        Some(r) => Location::parse(r)?,
        None => Location::Local(default_repo()?),
    };
    Ok(match loc {
        Location::S3(mut s) => {
            if s.endpoint.is_none() {
                s.endpoint = env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"));
            }
            if s.region.is_none() {
                s.region = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION"));
            }
            Location::S3(s)
        }
        l => l,
    })
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// Credentials from the environment, else from the shared credentials
/// file's profile; none at all is anonymous access.
fn credentials() -> Result<S3Credentials> {
    if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok(S3Credentials {
            access_key_id: Some(id),
            secret_access_key: Some(secret),
            session_token: env("AWS_SESSION_TOKEN"),
        });
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let file = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".aws/credentials")));
    let Some(file) = file.filter(|f| f.exists()) else {
        return Ok(S3Credentials::default());
    };
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading AWS credentials from {}", file.display()))?;
    let section = profile_section(&text, &profile).ok_or_else(|| {
        anyhow!(
            "no profile [{profile}] in {}; set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            file.display()
        )
    })?;
    let get = |k: &str| section.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    Ok(S3Credentials {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
    })
}

/// The `key = value` lines of `[profile]` in an INI-style AWS file.
fn profile_section(text: &str, profile: &str) -> Option<Vec<(String, String)>> {
    let mut found = None;
    let mut current: Option<&str> = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(name.trim());
            if current == Some(profile) {
                found.get_or_insert_with(Vec::new);
            }
            continue;
        }
        if current == Some(profile) {
            if let (Some(v), Some((k, val))) = (found.as_mut(), line.split_once('=')) {
                v.push((k.trim().to_string(), val.trim().to_string()));
            }
        }
    }
    found
}

/// Concurrent requests to a bucket, at most.
const S3_CONNECTIONS: usize = 32;

/// What this run asked of the repository's storage (reported by `--json`
/// as `requests`), and of its cloud tier (`cloud_requests`).
pub static METER: std::sync::OnceLock<Arc<Meter>> = std::sync::OnceLock::new();
pub static CLOUD_METER: std::sync::OnceLock<Arc<Meter>> = std::sync::OnceLock::new();

/// The backend of `loc`, metered. With `create`, a missing directory or
/// bucket is created (for `init`).
pub fn backend(loc: &Location, create: bool) -> Result<Arc<dyn Backend>> {
    let meter = METER.get_or_init(Default::default).clone();
    metered_backend(loc, create, meter)
}

/// [`backend`] counting its requests in `meter` (a cloud tier's own).
pub fn metered_backend(
    loc: &Location,
    create: bool,
    meter: Arc<Meter>,
) -> Result<Arc<dyn Backend>> {
    let inner: Arc<dyn Backend> = match loc {
        Location::Local(path) => {
            if create && !path.exists() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::create_dir_all(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                // A new repository directory is its owner's alone, like
                // the objects in it (an existing one keeps its mode).
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
                    .with_context(|| format!("setting the mode of {}", path.display()))?;
            }
            Arc::new(LocalBackend::new(path))
        }
        Location::S3(s) => s3(s, create)?,
    };
    let metered: Arc<dyn Backend> = Arc::new(Metering::new(inner, meter));
    // A bucket's immutable metadata is kept on this machine too (the
    // meter counts only what reaches the bucket).
    let bypass = NO_OBJECT_CACHE.load(std::sync::atomic::Ordering::Relaxed);
    match (loc, object_cache_dir(loc).filter(|_| !bypass)) {
        (Location::S3(_), Some(dir)) => Ok(Arc::new(Cache::new(metered, dir, CACHED))),
        _ => Ok(metered),
    }
}

/// Set by commands that must read the bucket itself (check, repair).
pub static NO_OBJECT_CACHE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// What [`Cache`] keeps of a remote repository: objects written once under
/// names that never change contents — recipe parts and indexes, container
/// metadata. (Index objects have their own cache, by repository id.)
const CACHED: &[&str] = &["parts/", "recipes/", "meta/"];

/// Where the objects of remote location `loc` are cached: one directory
/// per location (bucket, prefix and endpoint).
fn object_cache_dir(loc: &Location) -> Option<PathBuf> {
    let key = blake3::hash(format!("{loc:?}").as_bytes()).to_hex();
    Some(cache_base()?.join("objects").join(&key[..16]))
}

/// The bare S3 backend of `loc` (for what only S3 does: server-side copy).
pub fn s3_backend(loc: &Location) -> Result<S3Backend> {
    match loc {
        Location::S3(s) => Ok(S3Backend::open(s, &credentials()?, S3Options::default())?),
        Location::Local(p) => Err(anyhow!("{} is not a bucket", p.display())),
    }
}

fn s3(loc: &S3Location, create: bool) -> Result<Arc<dyn Backend>> {
    let b = S3Backend::open(loc, &credentials()?, S3Options::default())?;
    if create {
        b.ensure_bucket()?;
    }
    let mut r = Retry::new(Arc::new(b));
    r.retries = 3;
    Ok(Arc::new(Limit::new(Arc::new(r), S3_CONNECTIONS)))
}

/// How a location reads in messages.
pub fn describe(loc: &Location) -> String {
    match loc {
        Location::Local(p) => p.display().to_string(),
        Location::S3(s) if s.prefix.is_empty() => format!("s3://{}", s.bucket),
        Location::S3(s) => format!("s3://{}/{}", s.bucket, s.prefix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_found() {
        let text = "[default]\naws_access_key_id = A\naws_secret_access_key=B\n\n[other]\n# c\naws_access_key_id = C\n";
        let d = profile_section(text, "default").unwrap();
        assert_eq!(
            d,
            vec![
                ("aws_access_key_id".into(), "A".into()),
                ("aws_secret_access_key".into(), "B".into())
            ]
        );
        assert_eq!(profile_section(text, "other").unwrap().len(), 1);
        assert!(profile_section(text, "none").is_none());
    }
}
