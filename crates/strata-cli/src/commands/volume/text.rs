//! What the volume commands print.

use crate::output::{fmt_bytes, Out};
use strata_link::dir::Listed;
use strata_link::snapshot::Snapshotted;
use strata_link::UnlinkReport;
use strata_volume::check::CheckReport;
use strata_volume::defrag::Defragged;

/// `volume list`'s lines.
pub(super) fn list_text(names: &[Listed]) -> String {
    names
        .iter()
        .map(|l| {
            let mut t = format!("{}\t{}", l.name, fmt_bytes(l.size));
            if !l.dedup {
                t += "\tdedup off";
            }
            if l.encrypted {
                t += "\tencrypted";
            }
            t
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `volume delete`'s result.
pub(super) fn deleted(out: &Out, name: &str, r: &UnlinkReport) {
    let unlinked = r.stored_bytes;
    out.result(
        &serde_json::json!({
            "deleted": name,
            "stored_again_bytes": unlinked,
            "stored_again_containers": r.containers,
            "recompressed_containers": r.recompressed,
            "damaged_containers": r.damaged.len(),
        }),
        || {
            let mut t = format!("volume {name} deleted");
            if unlinked > 0 {
                t += &format!(
                    " (first {} its snapshots linked to stored in the repository again)",
                    fmt_bytes(unlinked)
                );
            }
            t
        },
    );
}

/// `volume check`'s text.
pub(super) fn check_text(name: &str, r: &CheckReport, read_data: bool) -> String {
    let mut t = format!(
        "volume {name}: {} logical blocks mapped to {} disk blocks ({} in the data file){}",
        r.logical_blocks_mapped,
        r.disk_blocks_in_use,
        r.data_file_blocks,
        if r.clean { "" } else { ", not closed cleanly" }
    );
    t += &format!(
        "\nlayout: {:.1} % of the blocks follow the block before them on disk",
        r.in_order() * 100.0
    );
    if r.in_order() < 0.5 && r.blocks_after_mapped > 0 {
        t += &format!(" (`strata volume defrag {name}` lays them out in order)");
    }
    if r.holds > 0 {
        t += &format!(
            "\n{} disk blocks kept for the repository ({} holds)",
            r.held_blocks, r.holds
        );
    }
    if read_data {
        t += &format!(
            "\n{} blocks read, {} compared with their fingerprints",
            r.blocks_read, r.blocks_verified
        );
    }
    for n in &r.notes {
        t += &format!("\nnote: {n}");
    }
    for p in &r.problems {
        t += &format!("\nerror: {p}");
    }
    t += match r.ok() {
        true => "\nno problems found",
        false => "\nproblems found",
    };
    t
}

/// `volume defrag`'s JSON.
pub(super) fn defrag_json(name: &str, d: &Defragged) -> serde_json::Value {
    serde_json::json!({
        "volume": name,
        "blocks_in_use_before": d.blocks.0,
        "blocks_in_use": d.blocks.1,
        "allocated_bytes_before": d.allocated.0,
        "allocated_bytes": d.allocated.1,
        "in_order_before": d.in_order.0,
        "in_order": d.in_order.1,
        "seconds": d.seconds,
    })
}

/// `volume defrag`'s text.
pub(super) fn defrag_text(name: &str, d: &Defragged) -> String {
    format!(
        "volume {name} defragmented in {:.1} s: {:.1} % of the blocks follow the block before them on disk (were {:.1} %), {} disk blocks in use (were {}), {} on the host's disk (was {})",
        d.seconds,
        d.in_order.1 * 100.0,
        d.in_order.0 * 100.0,
        d.blocks.1,
        d.blocks.0,
        fmt_bytes(d.allocated.1),
        fmt_bytes(d.allocated.0)
    )
}

pub(super) fn stats_text(r: &strata_volume::report::VolumeReport) -> String {
    let us = |v: Option<f64>| {
        v.map(|x| format!("{x:.0} µs"))
            .unwrap_or_else(|| "–".into())
    };
    let mut t = format!(
        "volume {} ({}), threshold {} (in use: {}), cache {}{}\n",
        r.name,
        fmt_bytes(r.size),
        r.threshold,
        r.threshold_used,
        fmt_bytes(r.cache_bytes),
        match (r.dedup, r.encrypted) {
            (true, false) => "",
            (true, true) => ", encrypted",
            (false, false) => ", dedup off",
            (false, true) => ", dedup off, encrypted",
        }
    );
    t += &format!(
        "dedup ratio {:.3}: {} blocks written, {} stored new, {} deduplicated ({} duplicates in runs below the threshold)\n",
        r.dedup_ratio,
        r.logical_blocks_written,
        r.physical_blocks_written,
        r.deduplicated_blocks,
        r.duplicates_below_threshold
    );
    t += &format!(
        "disk blocks in use {} of {} in the data file ({} on the host's disk)\n",
        r.physical_blocks_in_use,
        r.data_file_blocks,
        fmt_bytes(r.data_file_allocated_bytes)
    );
    if let Some(h) = r.cache_hit_rate {
        t += &format!(
            "cache: {:.1} % hits, {} of {} blocks, {} in memory\n",
            h * 100.0,
            r.live.cache_blocks,
            r.live.cache_capacity_blocks,
            fmt_bytes(r.live.cache_memory_bytes)
        );
    }
    if r.live.waiting_for_space_bytes > 0 {
        t += &format!(
            "writes paused: the disk holding the volume lacks room for its buffered writes \
             ({} needed); they resume once space is freed\n",
            fmt_bytes(r.live.waiting_for_space_bytes)
        );
    }
    if r.live.readahead_miss_probe == "off" && r.live.reads > 0 {
        t += "readahead around misses: off (this kernel can tell no page-cache miss)\n";
    }
    if r.live.readahead_blocks_asked > 0 {
        t += &format!(
            "readahead around misses (told by {}): {} blocks asked for, {:.1} % of them read; \
             cluster now {}\n",
            r.live.readahead_miss_probe,
            r.live.readahead_blocks_asked,
            100.0 * r.live.readahead_blocks_used as f64 / r.live.readahead_blocks_asked as f64,
            fmt_bytes(
                r.live
                    .readahead_cluster_blocks
                    .saturating_mul(strata_volume::volume::BLOCK as u64)
            )
        );
    }
    t += &format!(
        "latency: read p50 {} p99 {} ({} reads), write p50 {} p99 {} ({} writes)",
        us(r.live.read_p50_us),
        us(r.live.read_p99_us),
        r.live.reads,
        us(r.live.write_p50_us),
        us(r.live.write_p99_us),
        r.live.writes
    );
    t
}

/// `volume snapshot`'s result: the version, what was read and added,
/// what was linked.
pub(super) fn snapshot_result(out: &Out, name: &str, done: &Snapshotted) {
    let (rep, l, leftovers) = (&done.report, &done.linked, done.released_leftovers);
    let s = &rep.snapshot;
    let secs = s.stats.duration_ms as f64 / 1000.0;
    out.result(
        &serde_json::json!({"id": rep.id, "series": s.series, "version": s.version,
            "logical_bytes": s.stats.logical_bytes, "read_bytes": s.stats.read_bytes,
            "unchanged_bytes": rep.parent_bytes, "parts_taken_over_bytes": rep.carried_bytes,
            "new_raw_bytes": s.stats.new_raw_bytes,
            "new_stored_bytes": s.stats.new_stored_bytes,
            "linked_containers": l.containers, "linked_stored_bytes": l.bytes,
            "linked_blocks": l.blocks, "stored_instead_containers": l.stored_instead,
            "hold_failed_containers": l.hold_failed,
            "released_leftover_containers": leftovers, "seconds": secs}),
        || {
            let mut t = format!(
                "snapshot {} saved: {}@{}\n  {} of volume {name} ({} read: what changed), {} new data, {} added to the repository, {secs:.1}s",
                crate::output::short(&rep.id),
                s.series,
                s.version,
                fmt_bytes(s.stats.logical_bytes),
                fmt_bytes(s.stats.read_bytes),
                fmt_bytes(s.stats.new_raw_bytes),
                fmt_bytes(s.stats.new_stored_bytes),
            );
            if l.containers > 0 {
                t += &format!(
                    "\n  {} of it handed over to the volume's own blocks ({} containers): the \
                     volume keeps them for the repository",
                    fmt_bytes(l.bytes),
                    l.containers
                );
            }
            t
        },
    );
}
