//! `strata stats`: sizes, ratios, and the lifecycle per series.

use crate::cli::{open, Cli};
use crate::output::{fmt_bytes, Out};
use anyhow::Result;
use clap::Args;
use serde_json::json;
use std::sync::Arc;

#[derive(Args)]
pub struct StatsArgs {
    /// Only the index strategy: its entries and the RAM it holds.
    #[arg(long)]
    index: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &StatsArgs) -> Result<i32> {
    let repo = open(cli)?;
    if a.index {
        return index_stats(out, &repo);
    }
    let st = strata_store::ops::stats::stats(&repo)?;
    let mut v = serde_json::to_value(&st)?;
    // The plaintext bytes the repository stores once: what dedup leaves
    // (the fleet compares this across hosts and with one host).
    v["unique_bytes"] = st.unique_raw_bytes.into();
    out.result(&v, || {
        format!(
            "snapshots:          {} in {} series\n\
             logical size:       {}\n\
             unique data:        {} in {} chunks, {} segments\n\
             stored (data):      {} in {} containers\n\
             repository total:   {}\n\
             dedup ratio:        {:.2}x\n\
             compression ratio:  {:.2}x\n\
             total ratio:        {:.2}x ({:.1}% space saved)\n\
             index:              {} ({} entries, {} RAM)\n\
             pool / archival:    {} shared pool, {} stamped archival containers\n\
             space saved:        {:.1}% by segment-level dedup, {:.1}% more by reverse dedup (before compression){}{}{}",
            st.snapshots,
            st.series,
            fmt_bytes(st.logical_bytes),
            fmt_bytes(st.unique_raw_bytes),
            st.chunks,
            st.segments,
            fmt_bytes(st.stored_bytes),
            st.containers,
            fmt_bytes(st.total_repo_bytes),
            st.dedup_ratio,
            st.compression_ratio,
            st.total_ratio,
            st.space_saving_pct,
            st.index_strategy,
            st.index_entries,
            fmt_bytes(st.index_ram_bytes),
            fmt_bytes(st.pool_bytes),
            fmt_bytes(st.stamped_bytes),
            st.saving_segment_pct,
            st.saving_reverse_pct,
            match st.linked_containers {
                0 => String::new(),
                n => format!(
                    "\nheld by volumes:    {} in {n} linked containers (snapshots of volumes \
                     read them from the volumes' own blocks; not in stored)",
                    fmt_bytes(st.linked_bytes)
                ),
            },
            match &st.delta {
                None => String::new(),
                Some(d) => format!(
                    "\ndeltas:             {} chunks ({}) stored as deltas in {}, against {} bases; saved about {}",
                    d.chunks,
                    fmt_bytes(d.raw_bytes),
                    fmt_bytes(d.stored_bytes),
                    d.bases,
                    fmt_bytes(d.saved_bytes)
                ),
            },
            series_table(&st.series_stats)
        )
    });
    Ok(0)
}

fn index_stats(out: &Out, repo: &strata_store::Repository) -> Result<i32> {
    let table = Arc::new(strata_store::engine::index::ContainerTable::default());
    let (strategy, idx) = strata_store::engine::index::build_strategy(repo, &table, None)?;
    let v = json!({"index_strategy": repo.config().index, "index_entries": strategy.entries(),
                   "index_ram_bytes": strategy.ram_bytes(), "containers": idx.containers.len()});
    out.result(&v, || {
        format!(
            "index: {} — {} entries, {} in RAM ({} containers known)",
            repo.config().index,
            strategy.entries(),
            fmt_bytes(strategy.ram_bytes()),
            idx.containers.len()
        )
    });
    Ok(0)
}

fn series_table(list: &[strata_store::ops::stats::SeriesStats]) -> String {
    if list.is_empty() {
        return String::new();
    }
    let mut t = format!(
        "\n\n{:<40} {:>5} {:>5} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>6}",
        "series",
        "live",
        "arch",
        "(pending)",
        "expired",
        "logical",
        "indirect",
        "rev-freed",
        "stamped",
        "chain"
    );
    for s in list {
        t += &format!(
            "\n{:<40} {:>5} {:>5} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>6.2}",
            s.series,
            s.live,
            s.archival,
            s.pending,
            s.expired,
            fmt_bytes(s.logical_bytes),
            fmt_bytes(s.indirect_bytes),
            fmt_bytes(s.reverse_freed_bytes),
            fmt_bytes(s.stamped_bytes),
            s.avg_chain_length
        );
    }
    t += "\n(rev-freed: pool space reverse dedup freed; indirect: bytes old versions reach through newer ones)";
    t
}
