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
use strata_store::backend::open::{self, Opening};
use strata_store::backend::s3::{S3Backend, S3Credentials};
use strata_store::backend::wrap::Meter;
use strata_store::backend::{Backend, Location};

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
    S3Credentials::from_profile(&text, &profile).ok_or_else(|| {
        anyhow!(
            "no profile [{profile}] in {}; set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            file.display()
        )
    })
}

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
/// A bucket's immutable objects are cached on this machine.
pub fn metered_backend(
    loc: &Location,
    create: bool,
    meter: Arc<Meter>,
) -> Result<Arc<dyn Backend>> {
    let credentials = match loc {
        Location::S3(_) => credentials()?,
        Location::Local(_) => Default::default(),
    };
    let bypass = NO_OBJECT_CACHE.load(std::sync::atomic::Ordering::Relaxed);
    let how = Opening {
        create,
        credentials,
        meter: Some(meter),
        cache: cache_base()
            .filter(|_| !bypass)
            .map(|d| (d, strata_store::repo::IMMUTABLE_PREFIXES)),
    };
    Ok(open::open(loc, &how)?)
}

/// Set by commands that must read the bucket itself (check, repair).
pub static NO_OBJECT_CACHE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The bare S3 backend of `loc` (for what only S3 does: server-side copy).
pub fn s3_backend(loc: &Location) -> Result<S3Backend> {
    match loc {
        Location::S3(_) => Ok(open::bucket(loc, &credentials()?)?),
        Location::Local(p) => Err(anyhow!("{} is not a bucket", p.display())),
    }
}
