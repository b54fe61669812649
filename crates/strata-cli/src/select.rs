//! Choosing snapshots on the command line: the filter flags several
//! commands share (`--series`, `--host`, `--path`, `--tag`, as restic's),
//! which also scope `latest`.

use clap::Args;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use strata_store::repo::snapshots::SnapshotFilter;

#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Only snapshots of this series (also what `latest` means).
    #[arg(long, id = "filter_series")]
    pub series: Option<String>,
    /// Only snapshots taken on this host.
    #[arg(long, id = "filter_host")]
    pub host: Option<String>,
    /// Only snapshots that backed up this path (repeatable: all of them).
    #[arg(long = "path", id = "filter_paths", value_name = "PATH")]
    pub paths: Vec<String>,
    /// Only snapshots with this tag (repeatable: any of them).
    #[arg(long = "tag", id = "filter_tags", value_name = "TAG")]
    pub tags: Vec<String>,
}

impl FilterArgs {
    pub fn filter(&self) -> SnapshotFilter {
        SnapshotFilter {
            series: self.series.clone(),
            host: self.host.clone(),
            paths: self.paths.clone(),
            tags: self.tags.clone(),
        }
    }
}

/// Paths given on the command line as the bytes the recipe holds (names
/// need not be UTF-8).
pub fn path_bytes(p: &[OsString]) -> Vec<Vec<u8>> {
    p.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// A recipe path as a user reads it: `/` first, bytes that are not UTF-8
/// or not printable escaped (`\xff`), as `ls` prints it.
pub fn show_path(p: &[u8]) -> String {
    let mut s = String::from("/");
    for chunk in p.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                s.extend(c.escape_default());
            } else {
                s.push(c);
            }
        }
        for b in chunk.invalid() {
            s += &format!("\\x{b:02x}");
        }
    }
    s
}

/// A recipe path for `--json`: the name itself (with a leading `/`) when
/// it is UTF-8, else the escaped form plus `path_bytes`, the exact bytes.
pub fn json_path(v: &mut serde_json::Value, key: &str, p: &[u8]) {
    match std::str::from_utf8(p) {
        Ok(s) => v[key] = serde_json::json!(format!("/{s}")),
        Err(_) => {
            v[key] = serde_json::json!(show_path(p));
            let mut b = vec![b'/'];
            b.extend_from_slice(p);
            v[format!("{key}_bytes")] = serde_json::json!(b);
        }
    }
}
