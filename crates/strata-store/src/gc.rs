//! Forget and mark-and-sweep garbage collection (DESIGN.md "Lifecycle":
//! "mark-and-sweep GC remains for what stamps cannot cover").
//!
//! `forget` deletes snapshot objects (and recipes no other snapshot uses).
//! `gc` marks every chunk referenced by a remaining recipe, then per
//! container: drops it when nothing in it is live, copies the live chunks
//! forward into new containers when its dead fraction exceeds the
//! threshold, keeps it otherwise. Order for crash safety: new containers →
//! new consolidated index object → delete old index objects → delete old
//! containers. A kill at any point leaves every snapshot restorable: the
//! chunk references of recipes whose containers were rewritten resolve
//! through the index by fingerprint.

use crate::container::{open_region, read_meta, ContainerSink, ContainerWriter};
use crate::error::{Result, StoreError};
use crate::index::{ContainerTable, IndexStrategy, RepoIndex};
use crate::lock;
use crate::repo::{container_id_of, data_name, meta_name, Repository};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::crypto::Kind;
use strata_core::format::{ContainerMeta, IndexObject};
use strata_core::Fingerprint;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ForgetReport {
    pub removed_snapshots: Vec<String>,
    pub removed_recipes: u64,
}

/// Removes snapshots (by id); their data goes at the next `gc`.
pub fn forget(repo: &Repository, ids: &[String]) -> Result<ForgetReport> {
    let _lock = lock::acquire(repo, true, "forget")?;
    forget_locked(repo, ids)
}

fn forget_locked(repo: &Repository, ids: &[String]) -> Result<ForgetReport> {
    let all = repo.list_snapshots()?;
    let mut report = ForgetReport::default();
    let mut dropped_recipes = HashSet::new();
    for id in ids {
        let (_, s) = all
            .iter()
            .find(|(i, _)| i == id)
            .ok_or_else(|| StoreError::NoSnapshot(id.clone()))?;
        repo.backend().delete(&format!("snapshots/{id}"))?;
        dropped_recipes.insert(s.recipe.clone());
        report.removed_snapshots.push(id.clone());
    }
    let still: HashSet<&String> = all
        .iter()
        .filter(|(i, _)| !ids.contains(i))
        .map(|(_, s)| &s.recipe)
        .collect();
    for r in dropped_recipes {
        if !still.contains(&r) {
            repo.backend().delete(&format!("recipes/{r}"))?;
            report.removed_recipes += 1;
        }
    }
    Ok(report)
}

#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Containers with more than this fraction of dead bytes are rewritten.
    pub threshold: f64,
    pub dry_run: bool,
    pub progress: Arc<crate::backup::Progress>,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            threshold: 0.2,
            dry_run: false,
            progress: Arc::new(Default::default()),
        }
    }
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct GcReport {
    pub live_chunks: u64,
    pub containers_before: u64,
    pub containers_deleted: u64,
    pub containers_rewritten: u64,
    pub containers_written: u64,
    pub orphans_deleted: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub bytes_freed: u64,
    pub dry_run: bool,
}

/// Index strategy used only to keep copy-forward from storing a chunk
/// twice.
#[derive(Default)]
struct Once(std::sync::Mutex<HashSet<Fingerprint>>);

impl IndexStrategy for Once {
    fn name(&self) -> &'static str {
        "gc"
    }
    fn lookup_segment(
        &self,
        _: &Fingerprint,
        c: &[Fingerprint],
    ) -> Vec<Option<crate::index::ChunkLoc>> {
        vec![None; c.len()]
    }
    fn claim(
        &self,
        fp: &Fingerprint,
        loc: crate::index::ChunkLoc,
    ) -> Option<crate::index::ChunkLoc> {
        if self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(*fp) {
            None
        } else {
            Some(loc)
        }
    }
    fn ram_bytes(&self) -> u64 {
        0
    }
    fn entries(&self) -> u64 {
        0
    }
    fn add_container(&self, _: &ContainerTable, _: &ContainerMeta) {}
}

/// Marks live chunks of every snapshot.
pub fn mark_live(repo: &Repository) -> Result<HashSet<Fingerprint>> {
    let mut live = HashSet::new();
    let mut seen_recipes = HashSet::new();
    for (_, s) in repo.list_snapshots()? {
        if !seen_recipes.insert(s.recipe.clone()) {
            continue;
        }
        let r = repo.load_recipe(&s.recipe)?;
        for n in &r.nodes {
            for seg in &n.segments {
                for c in &seg.chunks {
                    if !c.is_zero() {
                        live.insert(c.fp);
                    }
                }
            }
        }
    }
    Ok(live)
}

/// Runs mark-and-sweep garbage collection.
pub fn gc(repo: &Repository, opts: &GcOptions) -> Result<GcReport> {
    let _lock = lock::acquire(repo, true, "gc")?;
    gc_locked(repo, opts)
}

pub(crate) fn gc_locked(repo: &Repository, opts: &GcOptions) -> Result<GcReport> {
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let live = mark_live(repo)?;
    report.live_chunks = live.len() as u64;
    let mut metas: Vec<ContainerMeta> = Vec::new();
    let idx = RepoIndex::load(repo, |m| metas.push(m.clone()))?;
    report.containers_before = metas.len() as u64;
    report.bytes_before = idx.stored_bytes();

    // Decide per container. A chunk present in several containers (after a
    // crash) is live only in the first one that holds it.
    let mut claimed: HashSet<Fingerprint> = HashSet::new();
    let mut keep = Vec::new();
    let mut rewrite = Vec::new();
    let mut drop = Vec::new();
    for m in metas {
        let mut live_bytes = 0u64;
        let mut live_idx = Vec::new();
        for (i, c) in m.chunks.iter().enumerate() {
            if live.contains(&c.fp) && claimed.insert(c.fp) {
                live_bytes += c.len as u64;
                live_idx.push(i);
            }
        }
        let raw = m.raw_bytes().max(1);
        if live_idx.is_empty() {
            drop.push(m);
        } else if (raw - live_bytes) as f64 / raw as f64 > opts.threshold {
            rewrite.push((m, live_idx));
        } else {
            keep.push(m);
        }
    }
    report.containers_deleted = drop.len() as u64;
    report.containers_rewritten = rewrite.len() as u64;
    let indexed: HashSet<_> = idx.containers.keys().copied().collect();
    let mut orphans = Vec::new();
    for o in repo
        .backend()
        .list("data/")?
        .into_iter()
        .chain(repo.backend().list("meta/")?)
    {
        if let Some(id) = container_id_of(&o.name) {
            if !indexed.contains(&id) {
                orphans.push(o.name);
            }
        }
    }
    report.orphans_deleted = orphans.len() as u64;
    let progress = &opts.progress;
    progress.bytes_total.store(
        rewrite.iter().map(|(m, _)| m.data_len).sum(),
        Ordering::Relaxed,
    );
    progress.totals_known.store(true, Ordering::Relaxed);
    if opts.dry_run {
        report.bytes_freed = drop.iter().map(|m| m.data_len).sum();
        report.bytes_after = report.bytes_before - report.bytes_freed;
        return Ok(report);
    }

    // Copy forward.
    let table = Arc::new(ContainerTable::default());
    let sink = ContainerSink::start(repo);
    let once = Once::default();
    let copied = AtomicU64::new(0);
    let copy_result: Result<()> = (|| {
        let mut writer = ContainerWriter::new(repo, table.clone(), sink.sender());
        for (m, live_idx) in &rewrite {
            let name = data_name(&m.id);
            let mut by_region: HashMap<u32, Vec<usize>> = HashMap::new();
            for &i in live_idx {
                by_region.entry(m.chunks[i].region).or_default().push(i);
            }
            let mut regions: Vec<_> = by_region.into_iter().collect();
            regions.sort_by_key(|(r, _)| *r);
            for (r, idxs) in regions {
                let info = m.regions.get(r as usize).ok_or_else(|| {
                    StoreError::Invalid(format!("{name}: chunk in a region that does not exist"))
                })?;
                let env = repo
                    .backend()
                    .get_range(&name, info.offset, info.stored_len as u64)?;
                let plain = open_region(repo, &name, &env, info)?;
                for i in idxs {
                    let c = &m.chunks[i];
                    let data = plain
                        .get(c.offset as usize..(c.offset + c.len) as usize)
                        .ok_or_else(|| {
                            StoreError::Invalid(format!("{name}: chunk outside its region"))
                        })?;
                    let loc = writer.next_loc(data.len())?;
                    if once.claim(&c.fp, loc).is_none() {
                        writer.append(c.fp, data);
                    }
                }
            }
            copied.fetch_add(m.data_len, Ordering::Relaxed);
            progress.bytes_done.fetch_add(m.data_len, Ordering::Relaxed);
        }
        writer.flush()
    })();
    // The writer thread's error comes first: when it fails, the copy loop
    // only sees a closed channel.
    let written = sink.finish()?;
    copy_result?;
    report.containers_written = written.metas.len() as u64;

    // Consolidated index, then deletions.
    let mut new_index = IndexObject {
        containers: keep.clone(),
    };
    new_index.containers.extend(written.metas.iter().cloned());
    let new_name = if new_index.containers.is_empty() {
        None
    } else {
        let (id, _) = repo.put_struct(Kind::Index, "index", &new_index)?;
        Some(format!("index/{id}"))
    };
    for o in &idx.objects {
        if Some(o) != new_name.as_ref() {
            repo.backend().delete(o)?;
        }
    }
    for m in drop.iter().chain(rewrite.iter().map(|(m, _)| m)) {
        // Metadata first: a metadata object always implies its data exists,
        // so a kill between the two deletes leaves a plain orphan.
        repo.backend().delete(&meta_name(&m.id))?;
        repo.backend().delete(&data_name(&m.id))?;
    }
    for o in &orphans {
        repo.backend().delete(o)?;
    }
    let after: u64 = new_index.containers.iter().map(|m| m.data_len).sum();
    report.bytes_after = after;
    report.bytes_freed = report.bytes_before.saturating_sub(after);
    Ok(report)
}

/// Rebuilds the index objects from the containers' metadata (or, where a
/// metadata object is missing or damaged, from the data object itself).
pub fn repair_index(repo: &Repository) -> Result<(u64, Vec<String>)> {
    let _lock = lock::acquire(repo, true, "repair index")?;
    let mut metas = Vec::new();
    let mut problems = Vec::new();
    for o in repo.backend().list("data/")? {
        let Some(id) = container_id_of(&o.name) else {
            continue;
        };
        match read_meta(repo, &id).or_else(|_| crate::container::read_meta_from_data(repo, &id)) {
            Ok(m) => metas.push(m),
            Err(e) => problems.push(format!("{}: {e} (skipped)", o.name)),
        }
    }
    let old = repo.backend().list("index/")?;
    let n = metas.len() as u64;
    let new_name = if metas.is_empty() {
        None
    } else {
        let (id, _) = repo.put_struct(Kind::Index, "index", &IndexObject { containers: metas })?;
        Some(format!("index/{id}"))
    };
    for o in old {
        if Some(&o.name) != new_name.as_ref() {
            repo.backend().delete(&o.name)?;
        }
    }
    Ok((n, problems))
}
