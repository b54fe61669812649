//! `strata ls`: the entries of a snapshot.

use crate::cli::{open, Cli};
use crate::output::{fmt_time, json_time, Out};
use crate::select::{json_path, show_path, FilterArgs};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use strata_core::format::{Node, NodeKind};

#[derive(Args)]
pub struct LsArgs {
    /// Snapshot: id (prefix), `latest`, SERIES@VERSION or SERIES@latest.
    snapshot: String,
    /// Only entries at or below these paths (as `ls` shows them, need not
    /// be UTF-8).
    paths: Vec<OsString>,
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(cli: &Cli, out: &Out, a: &LsArgs) -> Result<i32> {
    let repo = open(cli)?;
    let (_, s) = repo.resolve_snapshot_in(&a.snapshot, &a.filter.filter())?;
    let r = strata_store::repo::tiers::whole_skeleton(&repo, &s)?;
    let inc: Vec<Vec<u8>> = a.paths.iter().map(|p| p.as_bytes().to_vec()).collect();
    let unmatched = strata_store::ops::restore::unmatched(&r, &inc);
    if !unmatched.is_empty() {
        bail!(
            "nothing in snapshot {} matches {} (paths start at the snapshot's root: see `strata ls {}`)",
            a.snapshot,
            unmatched.iter().map(|p| show_path(p.strip_prefix(b"/").unwrap_or(p))).collect::<Vec<_>>().join(", "),
            a.snapshot
        );
    }
    let under = |n: &Node| {
        inc.is_empty()
            || inc
                .iter()
                .any(|p| strata_store::ops::restore::under(&n.path, p))
    };
    let nodes: Vec<&Node> = r.nodes.iter().filter(|n| under(n)).collect();
    // A hard link shows its file's size (the node itself records none).
    let sizes: HashMap<&[u8], u64> = r
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::File)
        .map(|n| (n.path.as_slice(), n.size))
        .collect();
    let size = |n: &Node| match (n.kind, &n.target) {
        (NodeKind::Hardlink, Some(t)) => sizes.get(t.as_slice()).copied().unwrap_or(n.size),
        _ => n.size,
    };
    if out.json {
        let v: Vec<_> = nodes
            .iter()
            .map(|n| {
                let mut e = json!({"path": show_path(&n.path), "type": n.kind.id(),
                       "size": size(n), "mode": n.mode & 0o7777, "uid": n.uid, "gid": n.gid,
                       "mtime": json_time(n.mtime_ns),
                       "target": n.target.as_ref().map(|t| String::from_utf8_lossy(t).into_owned())});
                json_path(&mut e, "path", &n.path);
                e
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    for n in nodes {
        let extra = match (n.kind, &n.target) {
            (NodeKind::Symlink, Some(t)) => format!(" -> {}", String::from_utf8_lossy(t)),
            (NodeKind::Hardlink, Some(t)) => format!(" => {}", show_path(t)),
            _ => String::new(),
        };
        println!(
            "{}{:04o} {:>5} {:>5} {:>12} {} {}{extra}",
            n.kind.letter(),
            n.mode & 0o7777,
            n.uid,
            n.gid,
            size(n),
            fmt_time(n.mtime_ns),
            show_path(&n.path)
        );
    }
    Ok(0)
}
