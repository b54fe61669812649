//! Where a repository is: a local directory or `s3://BUCKET/PREFIX`, with
//! the S3 settings the caller passes (the Python layer fills them from the
//! usual AWS environment variables, as the CLI does).

use crate::errors::StrataError;
use pyo3::prelude::*;
use std::sync::Arc;
use strata_store::backend::location::Location;
use strata_store::backend::s3::{S3Backend, S3Credentials, S3Options};
use strata_store::backend::wrap::{Limit, Retry};
use strata_store::backend::{Backend, LocalBackend};

/// S3 settings: endpoint, region and credentials (all optional).
#[derive(Clone, Debug, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
}

/// Concurrent requests to a bucket, at most (as the CLI).
const S3_CONNECTIONS: usize = 32;

/// The backend at `url`; with `create`, a missing directory (mode 0700)
/// or bucket is created.
/// Where a local repository's volumes are (they may hold some of its
/// containers: linked snapshots); none for a bucket.
pub fn volumes_of(url: &str) -> Option<std::path::PathBuf> {
    match Location::parse(url) {
        Ok(Location::Local(path)) => Some(path.join("volumes")),
        _ => None,
    }
}

pub fn open(url: &str, s3: &S3Settings, create: bool) -> PyResult<Arc<dyn Backend>> {
    match Location::parse(url).map_err(|e| StrataError::new_err(e.to_string()))? {
        Location::Local(path) => {
            if create && !path.exists() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::create_dir_all(&path)
                    .and_then(|_| {
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                    })
                    .map_err(|e| {
                        StrataError::new_err(format!("creating {}: {e}", path.display()))
                    })?;
            }
            Ok(Arc::new(LocalBackend::new(&path)))
        }
        Location::S3(mut loc) => {
            if loc.endpoint.is_none() {
                loc.endpoint = s3.endpoint.clone();
            }
            if loc.region.is_none() {
                loc.region = s3.region.clone();
            }
            let creds = S3Credentials {
                access_key_id: s3.access_key_id.clone(),
                secret_access_key: s3.secret_access_key.clone(),
                session_token: s3.session_token.clone(),
            };
            let b = S3Backend::open(&loc, &creds, S3Options::default())
                .map_err(|e| StrataError::new_err(format!("opening {url}: {e}")))?;
            if create {
                b.ensure_bucket().map_err(|e| {
                    StrataError::new_err(format!("creating the bucket of {url}: {e}"))
                })?;
            }
            let mut r = Retry::new(Arc::new(b));
            r.retries = 3;
            Ok(Arc::new(Limit::new(Arc::new(r), S3_CONNECTIONS)))
        }
    }
}
