//! Where a repository is: a local directory or `s3://BUCKET/PREFIX`, with
//! the S3 settings the caller passes (the Python layer fills them from the
//! usual AWS environment variables, as the CLI does).

use crate::errors::StrataError;
use pyo3::prelude::*;
use std::sync::Arc;
use strata_store::backend::location::Location;
use strata_store::backend::open::{self, Opening};
use strata_store::backend::s3::S3Credentials;
use strata_store::backend::Backend;

/// S3 settings: endpoint, region and credentials (all optional).
#[derive(Clone, Debug, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
}

/// The location `url` names.
pub fn location(url: &str) -> PyResult<Location> {
    Location::parse(url).map_err(|e| StrataError::new_err(e.to_string()))
}

/// The backend at `url`; with `create`, a missing directory (mode 0700)
/// or bucket is created.
pub fn open(url: &str, s3: &S3Settings, create: bool) -> PyResult<Arc<dyn Backend>> {
    let mut loc = location(url)?;
    if let Location::S3(l) = &mut loc {
        l.endpoint = l.endpoint.take().or_else(|| s3.endpoint.clone());
        l.region = l.region.take().or_else(|| s3.region.clone());
    }
    let how = Opening {
        create,
        credentials: S3Credentials {
            access_key_id: s3.access_key_id.clone(),
            secret_access_key: s3.secret_access_key.clone(),
            session_token: s3.session_token.clone(),
        },
        ..Default::default()
    };
    open::open(&loc, &how).map_err(|e| StrataError::new_err(format!("opening {url}: {e}")))
}
