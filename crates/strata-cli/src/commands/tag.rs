//! `strata tag SNAPSHOT… --add/--remove/--set`: change snapshots' tags
//! (ids stay the same).

use crate::cli::{open, Cli};
use crate::output::Out;
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use strata_core::format::Tier;

#[derive(Args)]
pub struct TagArgs {
    /// Snapshots: ids (prefixes), SERIES@VERSION, SERIES@latest.
    #[arg(required = true)]
    snapshots: Vec<String>,
    /// Add this tag (repeatable).
    #[arg(long)]
    add: Vec<String>,
    /// Remove this tag (repeatable).
    #[arg(long)]
    remove: Vec<String>,
    /// Replace all tags with these (repeatable; `--set ''` clears them).
    #[arg(long)]
    set: Vec<String>,
}

pub fn run(cli: &Cli, out: &Out, a: &TagArgs) -> Result<i32> {
    if a.add.is_empty() && a.remove.is_empty() && a.set.is_empty() {
        bail!("nothing to do: give --add, --remove or --set");
    }
    let repo = open(cli)?;
    let (all, _) = repo.list_snapshots_tolerant()?;
    let mut ids = Vec::new();
    for s in &a.snapshots {
        ids.push(strata_store::repo::snapshots::resolve_in(&all, s)?.0);
    }
    ids.sort();
    ids.dedup();
    let set: Vec<String> = a.set.iter().filter(|t| !t.is_empty()).cloned().collect();
    let set = (!a.set.is_empty()).then_some(set.as_slice());
    let done = strata_store::repo::snapshots::retag(&repo, &ids, set, &a.add, &a.remove)?;
    // A version (or part of one) in the cloud tier: the bucket's copy of
    // its snapshot is what disaster recovery reads; it gets the tags too.
    let in_cloud: Vec<_> = all
        .iter()
        .filter(|(i, s)| ids.contains(i) && (s.tier == Tier::Cloud || s.cloud_part.is_some()))
        .map(|(i, _)| i.clone())
        .collect();
    if !in_cloud.is_empty() {
        let res = crate::cli::tiers(&repo).cloud().and_then(|c| {
            strata_store::repo::snapshots::retag(&c, &in_cloud, set, &a.add, &a.remove)
        });
        if let Err(e) = res {
            out.warn(&format!(
                "the cloud tier's copies keep their old tags: {e:#}; run the command again to retry"
            ));
        }
    }
    let v: Vec<_> = done
        .iter()
        .map(|(id, tags)| json!({"id": id, "tags": tags}))
        .collect();
    out.result(&json!(v), || {
        done.iter()
            .map(|(id, tags)| format!("{}: {}", crate::output::short(id), tags.join(",")))
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(0)
}
