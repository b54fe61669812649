//! `strata features`: what this build supports.

use crate::output::Out;
use anyhow::Result;
use serde_json::json;

pub fn run(out: &Out) -> Result<i32> {
    let strategies = strata_store::repo::INDEX_STRATEGIES;
    out.result(
        &json!({"version": env!("CARGO_PKG_VERSION"),
                "repository_format": strata_core::format::REPO_FORMAT_VERSION,
                "index_strategies": strategies, "chunkers": ["cdc", "fixed"],
                "maintain": true, "lifecycle": ["revdedup"], "lifecycle_after_backup": true,
                "encryption": ["none", "xchacha20poly1305"], "backends": ["local", "s3"]}),
        || {
            format!(
                "strata {}\nrepository format {}\nindex strategies: {}\nlifecycle: revdedup (after every backup, and strata maintain)\nchunkers: cdc, fixed\nbackends: local, s3",
                env!("CARGO_PKG_VERSION"),
                strata_core::format::REPO_FORMAT_VERSION,
                strategies.join(", ")
            )
        },
    );
    Ok(0)
}
