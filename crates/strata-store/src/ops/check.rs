//! Repository check: structure, and with `read_data` every byte.
//!
//! Structure: every snapshot, recipe, index and metadata object opens
//! (checksum/AEAD) and decodes; every container listed in the index exists
//! with the recorded size; every chunk a snapshot references directly is
//! stored, in the right lifecycle domain (the pool for live-form versions,
//! the pool or its own stamped containers for an archival one); every
//! indirect reference
//! is held by the next version (and is damaged when that one's is).
//! Data (`--read-data`): every region of every container is read,
//! authenticated and decompressed, and every chunk's fingerprint is
//! recomputed. Problems name the object, and the snapshots they affect.

use crate::error::{Result, StoreError};
use crate::progress::Progress;
use crate::repo::container::embedded_meta;
use crate::repo::lock;
use crate::repo::region::open_region;
use crate::repo::{container_id_of, data_name, Repository};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use strata_core::crypto::Kind;
use strata_core::format::{ContainerId, ContainerMeta, Snapshot};
use strata_core::id::SnapshotId;
use strata_core::Fingerprint;

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    pub read_data: bool,
    pub progress: Arc<Progress>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    pub snapshots: u64,
    pub containers: u64,
    pub chunks: u64,
    pub regions_read: u64,
    pub bytes_read: u64,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    /// Snapshots that cannot be fully restored.
    pub damaged_snapshots: Vec<String>,
    /// Per damaged snapshot whose recipe reads, the paths whose data is
    /// (partly) unavailable.
    pub damaged_paths: BTreeMap<String, Vec<String>>,
    /// An index object is damaged or missing: `strata repair index` must
    /// run before gc, and before snapshots are salvaged (their data may
    /// only look lost).
    pub index_repair_needed: bool,
    /// The same paths as bytes (`strata repair snapshots` leaves them out).
    #[serde(skip)]
    pub(crate) damaged_raw: HashMap<String, HashSet<Vec<u8>>>,
    /// Snapshots whose data is in the cloud tier: only their local recipe
    /// copies are checked here.
    pub cloud_snapshots: u64,
    /// Containers found missing, truncated or holding damaged chunks: a
    /// salvage never deduplicates against them.
    #[serde(skip)]
    pub(crate) damaged_containers: HashSet<ContainerId>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
}

pub fn check(repo: &Repository, opts: &CheckOptions) -> Result<CheckReport> {
    let _lock = lock::acquire(repo, false, "check")?;
    let mut rep = CheckReport::default();
    let idx = check_index(repo, &mut rep)?;
    rep.containers = idx.metas.len() as u64;
    check_delta_bases(&idx, &mut rep);
    check_bookkeeping(repo, &mut rep)?;
    let (bad_containers, unlisted) = check_containers(repo, &idx, &mut rep)?;
    let bad_chunks = if opts.read_data {
        read_data(repo, &idx.metas, &bad_containers, opts, &mut rep)
    } else {
        HashSet::new()
    };
    for m in idx.metas.values() {
        rep.chunks += m.chunks.len() as u64;
    }
    rep.damaged_containers = bad_containers
        .iter()
        .chain(bad_chunks.iter().map(|(c, _)| c))
        .copied()
        .collect();
    let avail = Available {
        metas: &idx.metas,
        bad_containers: &bad_containers,
        bad_chunks: &bad_chunks,
        good_fps: std::cell::OnceCell::new(),
    };
    let referenced = check_snapshots(repo, &avail, &mut rep)?;
    report_unlisted(&unlisted, &referenced, idx.damaged, &mut rep);
    rep.index_repair_needed = idx.damaged || unlisted.iter().any(|id| referenced.contains(id));
    Ok(rep)
}

/// Every base a delta region names is a chunk stored whole where it says,
/// in an indexed container of the pool (a stamped one is deleted with its
/// owner, whatever else needs it). Metadata only: `--read-data` decodes
/// the deltas too.
fn check_delta_bases(idx: &IndexState, rep: &mut CheckReport) {
    for m in idx.metas.values() {
        for d in &m.deltas {
            for b in &d.bases {
                let why = match idx.metas.get(&b.container) {
                    None => "is in no index object",
                    Some(bm) if bm.stamp.is_some() => "is in a stamped container",
                    Some(bm) if bm.delta_of(b.region).is_some() => "is itself in a delta region",
                    Some(bm)
                        if !bm.chunks.iter().any(|c| {
                            c.region == b.region
                                && c.offset == b.offset
                                && c.len == b.len
                                && c.fp == b.fp
                        }) =>
                    {
                        "is not a chunk its container lists"
                    }
                    Some(_) => continue,
                };
                rep.errors.push(format!(
                    "{} region {}: the base {} in {} {why}",
                    data_name(&m.id),
                    d.region,
                    &b.fp.to_hex()[..16],
                    data_name(&b.container)
                ));
            }
        }
    }
}

/// Policies and the lifecycle's state: each must open and decode, and a
/// policy must sit under its own series' name.
fn check_bookkeeping(repo: &Repository, rep: &mut CheckReport) -> Result<()> {
    for o in repo.backend().list("policies/")? {
        match repo.get_struct::<crate::repo::lifecycle::Policy>(Kind::Policy, &o.name, "policy") {
            Ok(p) if crate::repo::lifecycle::policy_name(&p.series) == o.name => {}
            Ok(p) => rep.errors.push(format!(
                "{}: holds the policy of another series ({})",
                o.name, p.series
            )),
            Err(e) => rep
                .errors
                .push(format!("{e} (`strata policy SERIES …` writes it again)")),
        }
    }
    match repo.get_struct::<crate::repo::lifecycle::LifecycleState>(
        Kind::LifecycleState,
        crate::repo::lifecycle::STATE_NAME,
        "lifecycle state",
    ) {
        Ok(_) | Err(StoreError::NotFound(_)) => {}
        Err(e) => rep.errors.push(format!(
            "{e} (bookkeeping only: the next `strata maintain` rewrites it)"
        )),
    }
    Ok(())
}

/// What the index objects list.
struct IndexState {
    metas: HashMap<ContainerId, ContainerMeta>,
    /// An index object could not be read: unlisted containers may be live.
    damaged: bool,
}

/// Index objects, one by one so one bad object does not hide the rest,
/// and their summaries, which must say what the index objects say:
/// commands other than chunk lookups trust them instead.
fn check_index(repo: &Repository, rep: &mut CheckReport) -> Result<IndexState> {
    let b = repo.backend();
    let mut metas: HashMap<ContainerId, ContainerMeta> = HashMap::new();
    let mut damaged = false;
    let mut summaries: HashMap<String, strata_core::format::IndexSummary> = HashMap::new();
    for o in b.list("index/")? {
        // Straight from the repository: the local cache would hide damage.
        match repo.read_index_object(&o.name) {
            Ok(obj) => {
                summaries.insert(
                    crate::repo::index::summary_name(&o.name),
                    strata_core::format::IndexSummary::of(o.name.clone(), &obj.containers),
                );
                for m in obj.containers {
                    metas.entry(m.id).or_insert(m);
                }
            }
            Err(e) => {
                rep.errors.push(format!("{e} (run `strata repair index`)"));
                damaged = true;
            }
        }
    }
    let isums = b.list("isum/")?;
    let have: HashSet<&str> = isums.iter().map(|o| o.name.as_str()).collect();
    for name in summaries.keys() {
        if !have.contains(name.as_str()) {
            rep.warnings.push(format!(
                "{name}: summary missing (commands read the index object instead; `strata repair index` rewrites it)"
            ));
        }
    }
    for o in &isums {
        let Some(want) = summaries.get(&o.name) else {
            if !damaged {
                rep.warnings.push(format!(
                    "{}: summary of a missing index object (left by an interrupted command; `strata gc` removes it)",
                    o.name
                ));
            }
            continue;
        };
        // Straight from the repository, as the index objects. A version-1
        // summary has no segments: readers that need them read the index
        // object, so it is not wrong.
        match repo.read_index_summary(&o.name) {
            Ok(s)
                if s.index == want.index
                    && s.containers == want.containers
                    && (s.segments.is_none() || s.segments == want.segments) => {}
            Ok(_) => rep.errors.push(format!(
                "{}: differs from {} (run `strata repair index`)",
                o.name, want.index
            )),
            Err(e) => rep.errors.push(format!("{e} (run `strata repair index`)")),
        }
    }
    Ok(IndexState { metas, damaged })
}

/// Every listed container's data object exists with its recorded size,
/// and its metadata object says what the index says. Returns the
/// containers that cannot be read, and those no index object lists.
fn check_containers(
    repo: &Repository,
    idx: &IndexState,
    rep: &mut CheckReport,
) -> Result<(HashSet<ContainerId>, HashSet<ContainerId>)> {
    let b = repo.backend();
    let sizes: HashMap<String, u64> = b
        .list("data/")?
        .into_iter()
        .map(|o| (o.name, o.size))
        .collect();
    let meta_objs: HashSet<String> = b.list("meta/")?.into_iter().map(|o| o.name).collect();
    let mut bad: HashSet<ContainerId> = HashSet::new();
    for (id, m) in &idx.metas {
        let name = data_name(id);
        match sizes.get(&name) {
            None => {
                rep.errors
                    .push(format!("{name}: listed in the index but missing"));
                bad.insert(*id);
            }
            // (A linked container's data object is its link stub.)
            Some(&s) if s != m.data_len && !linked_ok(repo, id, &name, &mut bad, rep) => {
                rep.errors.push(format!(
                    "{name}: size {s}, index says {} (truncated?)",
                    m.data_len
                ));
                bad.insert(*id);
            }
            _ => {}
        }
        let mname = crate::repo::meta_name(id);
        if !meta_objs.contains(&mname) {
            rep.warnings.push(format!(
                "{mname}: metadata object missing (`strata repair index` rebuilds it from the data)"
            ));
        } else {
            match crate::repo::container::read_meta(repo, id) {
                Ok(mm) if mm == *m => {}
                Ok(_) => rep.errors.push(format!(
                    "{mname}: differs from the index (run `strata repair index`)"
                )),
                Err(e) => rep
                    .errors
                    .push(format!("{e} (run `strata repair index` to rewrite it)")),
            }
        }
    }
    let unlisted = sizes
        .keys()
        .filter_map(|name| container_id_of(name))
        .filter(|id| !idx.metas.contains_key(id))
        .collect();
    Ok((bad, unlisted))
}

/// Whether container `id` is linked (`crate::repo::links`); a linked one whose
/// stub does not open, or whose volume lacks its blocks, is an error.
fn linked_ok(
    repo: &Repository,
    id: &ContainerId,
    name: &str,
    bad: &mut HashSet<ContainerId>,
    rep: &mut CheckReport,
) -> bool {
    match repo.link_of(id).and_then(|l| match l {
        Some(l) => l.verify_reachable(name).map(|()| true),
        None => Ok(false),
    }) {
        Ok(linked) => linked,
        Err(e) => {
            rep.errors.push(format!("{e}"));
            bad.insert(*id);
            true
        }
    }
}

/// Containers stored but in no index object: garbage an interrupted
/// command left (gc removes it), unless a snapshot needs one (`referenced`:
/// it holds chunks a snapshot references and no listed container has) —
/// then an index object is missing or damaged, and gc must not run before
/// `repair index`.
fn report_unlisted(
    unlisted: &HashSet<ContainerId>,
    referenced: &HashSet<ContainerId>,
    index_damaged: bool,
    rep: &mut CheckReport,
) {
    let mut names: Vec<(String, bool)> = unlisted
        .iter()
        .map(|id| (data_name(id), referenced.contains(id)))
        .collect();
    names.sort();
    for (name, used) in names {
        if used {
            rep.errors.push(format!(
                "{name}: snapshots need its chunks but no index object lists it: an index object is missing or damaged (run `strata repair index`; do not run gc before)"
            ));
        } else if index_damaged {
            rep.warnings.push(format!("{name}: not in any readable index object (`strata repair index` re-lists it; do not run gc before)"));
        } else {
            rep.warnings.push(format!(
                "{name}: not in the index (left by an interrupted command; `strata gc` removes it)"
            ));
        }
    }
}

/// Reads every region of every readable container, authenticates and
/// decompresses it and recomputes every chunk's fingerprint. Returns the
/// stored chunks (container, fingerprint) found damaged.
fn read_data(
    repo: &Repository,
    metas: &HashMap<ContainerId, ContainerMeta>,
    bad_containers: &HashSet<ContainerId>,
    opts: &CheckOptions,
    rep: &mut CheckReport,
) -> BadChunks {
    let progress = &opts.progress;
    progress
        .bytes_total
        .store(metas.values().map(|m| m.data_len).sum(), Ordering::Relaxed);
    progress.totals_known.store(true, Ordering::Relaxed);
    let regions_read = AtomicU64::new(0);
    let bytes_read = AtomicU64::new(0);
    let found: Mutex<(Vec<String>, BadChunks)> = Mutex::default();
    let list: Vec<&ContainerMeta> = metas
        .values()
        .filter(|m| !bad_containers.contains(&m.id))
        .collect();
    list.par_iter().for_each(|m| {
        let (errs, fps) = read_container(repo, m, &regions_read, &bytes_read);
        progress.bytes_done.fetch_add(m.data_len, Ordering::Relaxed);
        let mut g = found.lock().unwrap_or_else(|e| e.into_inner());
        g.0.extend(errs);
        g.1.extend(fps.into_iter().map(|f| (m.id, f)));
    });
    let (errs, fps) = found.into_inner().unwrap_or_else(|e| e.into_inner());
    rep.errors.extend(errs);
    rep.regions_read = regions_read.load(Ordering::Relaxed);
    rep.bytes_read = bytes_read.load(Ordering::Relaxed);
    fps
}

/// One container of [`read_data`]: its errors and damaged fingerprints.
fn read_container(
    repo: &Repository,
    m: &ContainerMeta,
    regions_read: &AtomicU64,
    bytes_read: &AtomicU64,
) -> (Vec<String>, HashSet<Fingerprint>) {
    let name = data_name(&m.id);
    let mut errs = Vec::new();
    let mut fps = HashSet::new();
    match repo.link_of(&m.id) {
        Ok(None) => {}
        Ok(Some(l)) => {
            // Its regions from the volume that holds them.
            let plains: Vec<Option<Vec<u8>>> = m
                .regions
                .iter()
                .map(|r| {
                    regions_read.fetch_add(1, Ordering::Relaxed);
                    bytes_read.fetch_add(r.raw_len as u64, Ordering::Relaxed);
                    l.region(repo, &name, r)
                        .map_err(|e| errs.push(format!("{e}")))
                        .ok()
                })
                .collect();
            verify_chunks(repo, m, &plains, &mut errs, &mut fps);
            return (errs, fps);
        }
        Err(e) => {
            errs.push(format!("{e}"));
            fps.extend(m.chunks.iter().map(|c| c.fp));
            return (errs, fps);
        }
    }
    let data = match repo.backend().get(&name) {
        Err(e) => {
            errs.push(format!("{e}"));
            fps.extend(m.chunks.iter().map(|c| c.fp));
            return (errs, fps);
        }
        Ok(data) => data,
    };
    bytes_read.fetch_add(data.len() as u64, Ordering::Relaxed);
    // The bytes outside the regions are checked too: the header, the
    // metadata section and footer (what `repair index` rebuilds from).
    // (Regions need not tile the rest: a container assembled by
    // server-side copy keeps dead ranges no region covers.)
    match embedded_meta(repo, &m.id, &data) {
        Ok(em) if em == *m => {}
        Ok(_) => errs.push(format!(
            "{name}: its embedded metadata differs from the index"
        )),
        Err(e) => errs.push(format!("{e}")),
    }
    let mut plains: Vec<Option<Vec<u8>>> = Vec::with_capacity(m.regions.len());
    for r in &m.regions {
        let end = (r.offset as usize).checked_add(r.stored_len as usize);
        let p = match end.and_then(|end| data.get(r.offset as usize..end)) {
            None => {
                errs.push(format!(
                    "{name}: region at offset {} lies past the end",
                    r.offset
                ));
                None
            }
            Some(env) => match open_region(repo, &name, env, r) {
                Ok(p) => Some(p),
                Err(e) => {
                    errs.push(format!("{e}"));
                    None
                }
            },
        };
        regions_read.fetch_add(1, Ordering::Relaxed);
        plains.push(p);
    }
    verify_chunks(repo, m, &plains, &mut errs, &mut fps);
    (errs, fps)
}

/// Checks every chunk of container `m` against its fingerprint in the
/// regions opened (`plains`, None where a region would not open): the
/// damaged ones go to `fps`.
fn verify_chunks(
    repo: &Repository,
    m: &ContainerMeta,
    plains: &[Option<Vec<u8>>],
    errs: &mut Vec<String>,
    fps: &mut HashSet<Fingerprint>,
) {
    let name = data_name(&m.id);
    let hasher = repo.hasher();
    for c in &m.chunks {
        let ok = plains
            .get(c.region as usize)
            .and_then(|p| p.as_ref())
            .and_then(|p| {
                p.get(c.offset as usize..(c.offset as usize).checked_add(c.len as usize)?)
            })
            .map(|d| hasher.hash(d) == c.fp);
        match ok {
            Some(true) => {}
            Some(false) => {
                errs.push(format!(
                    "{name}: chunk {} does not match its fingerprint",
                    c.fp.to_hex()
                ));
                fps.insert(c.fp);
            }
            None => {
                fps.insert(c.fp);
            }
        }
    }
}

/// Stored chunks found damaged: (container, fingerprint).
type BadChunks = HashSet<(ContainerId, Fingerprint)>;

/// What the containers can provide, as found above.
struct Available<'a> {
    metas: &'a HashMap<ContainerId, ContainerMeta>,
    bad_containers: &'a HashSet<ContainerId>,
    /// Stored chunks found damaged: (container, fingerprint).
    bad_chunks: &'a HashSet<(ContainerId, Fingerprint)>,
    /// Fingerprints with at least one intact stored copy (for references
    /// moved by gc, and chunks stored twice): damage to one copy is not
    /// the loss of the chunk. Made the first time a reference names a
    /// container the index does not list (rare: a set of every chunk of
    /// the repository is not held otherwise).
    good_fps: std::cell::OnceCell<HashSet<Fingerprint>>,
}

impl Available<'_> {
    /// Whether an intact listed copy of `fp` exists.
    fn has_good_copy(&self, fp: &Fingerprint) -> bool {
        self.good_fps
            .get_or_init(|| {
                let mut good = HashSet::new();
                for m in self.metas.values() {
                    if !self.bad_containers.contains(&m.id) {
                        good.extend(
                            m.chunks
                                .iter()
                                .map(|c| c.fp)
                                .filter(|f| !self.bad_chunks.contains(&(m.id, *f))),
                        );
                    }
                }
                good
            })
            .contains(fp)
    }
}

/// Per snapshot id: its chunk fingerprints, and those it cannot provide —
/// kept only while a version not yet checked points at it
/// (`archival.next`), and only for versions some version points at: a
/// series of large images holds two versions' fingerprints at a time,
/// whatever its length.
#[derive(Default)]
struct Held {
    sets: HashMap<SnapshotId, (HashSet<Fingerprint>, HashSet<Fingerprint>)>,
    /// Per snapshot id: how many versions not yet checked point at it.
    wanted: HashMap<SnapshotId, usize>,
}

impl Held {
    /// For the versions of one series, newest first.
    fn for_series<'a>(snaps: impl Iterator<Item = &'a Snapshot>) -> Self {
        let mut wanted: HashMap<SnapshotId, usize> = HashMap::new();
        for s in snaps {
            if let Some(n) = s.archival.as_ref().and_then(|a| a.next.clone()) {
                *wanted.entry(n).or_default() += 1;
            }
        }
        Held {
            sets: HashMap::new(),
            wanted,
        }
    }

    /// Whether a version's fingerprints are to be kept once it is checked.
    fn wanted(&self, id: &str) -> bool {
        self.wanted.get(id).is_some_and(|n| *n > 0)
    }

    /// Version `id`, checked, pointed at `next`: its own sets are kept if
    /// wanted, `next`'s let go if nothing else wants them.
    fn checked(
        &mut self,
        id: &SnapshotId,
        next: Option<&SnapshotId>,
        sets: Option<(HashSet<Fingerprint>, HashSet<Fingerprint>)>,
    ) {
        if let Some(n) = next {
            if let Some(w) = self.wanted.get_mut(n) {
                *w = w.saturating_sub(1);
                if *w == 0 {
                    self.sets.remove(n);
                }
            }
        }
        if let Some(sets) = sets.filter(|_| self.wanted(id)) {
            self.sets.insert(id.clone(), sets);
        }
    }
}

/// Snapshots and recipes, per series newest first, so that the indirect
/// references of a version are checked against the next version's chunks
/// (and its unavailable ones) held from the step before.
/// Returns the containers in no index object that snapshots need (chunks
/// they reference there are nowhere else).
fn check_snapshots(
    repo: &Repository,
    avail: &Available,
    rep: &mut CheckReport,
) -> Result<HashSet<ContainerId>> {
    let mut snaps: Vec<(SnapshotId, Snapshot)> = Vec::new();
    for o in repo.backend().list("snapshots/")? {
        rep.snapshots += 1;
        let Some(id) = SnapshotId::from_object_name(&o.name) else {
            rep.errors.push(format!(
                "{}: not a snapshot (the name is not a snapshot id)",
                o.name
            ));
            rep.damaged_snapshots
                .push(o.name.trim_start_matches("snapshots/").to_string());
            continue;
        };
        match repo.get_snapshot(&o.name) {
            Ok(s) => snaps.push((id, s)),
            Err(e) => {
                rep.errors.push(format!("{e}"));
                rep.damaged_snapshots.push(id.to_string());
            }
        }
    }
    snaps.sort_by_key(|(_, s)| std::cmp::Reverse((s.version, s.time_ns)));
    let mut series_order: Vec<&str> = snaps.iter().map(|(_, s)| s.series.as_str()).collect();
    series_order.sort();
    series_order.dedup();
    let mut referenced = HashSet::new();
    for series in series_order {
        let in_series = || snaps.iter().filter(|(_, s)| s.series == series);
        let mut held = Held::for_series(in_series().map(|(_, s)| s));
        for (id, s) in in_series() {
            check_snapshot(repo, avail, (&mut held, &mut referenced), (id, s), rep);
        }
    }
    Ok(referenced)
}

/// What one recipe's references come to.
#[derive(Default)]
struct RecipeFindings {
    missing: u64,
    broken: u64,
    misplaced: u64,
    /// Paths with unavailable data, in recipe order.
    paths: Vec<Vec<u8>>,
    /// Whether the fingerprints are kept (an older version points here).
    keep_fps: bool,
    fps: HashSet<Fingerprint>,
    bad: HashSet<Fingerprint>,
    /// Containers in no index object that hold chunks found nowhere else.
    unlisted_needed: HashSet<ContainerId>,
    /// Zero runs counting more chunks than they have bytes (read as their
    /// bytes; only the segment's fingerprint would be derived wrongly).
    odd_zero_runs: u64,
    /// Entries whose path (or hard link's target) restore refuses.
    unsafe_paths: u64,
    first_unsafe: Option<String>,
}

fn check_snapshot(
    repo: &Repository,
    avail: &Available,
    (held, referenced): (&mut Held, &mut HashSet<ContainerId>),
    (id, s): (&SnapshotId, &Snapshot),
    rep: &mut CheckReport,
) {
    let label = format!("snapshot {} ({}@{})", id.short(), s.series, s.version);
    // The recipe is read a part at a time, each node checked as it comes.
    // Its data is in the cloud tier (`strata tier check`): its local
    // recipe copy is read, nothing checked against it.
    let cloud = s.tier == strata_core::format::Tier::Cloud;
    let next = s.archival.as_ref().and_then(|a| a.next.clone());
    let next_held = next.as_ref().and_then(|n| held.sets.get(n));
    let mut f = RecipeFindings {
        keep_fps: held.wanted(id),
        ..Default::default()
    };
    let walked = crate::repo::recipe::for_each_piece_in_part(repo, &s.recipe, |n, _, _, table| {
        f.check_path(&n);
        if !cloud {
            f.visit(avail, &n, table, (id, s), next_held);
        }
        Ok(())
    });
    if let Err(e) = walked {
        held.checked(id, next.as_ref(), None);
        rep.errors.push(format!("{label}: {e}"));
        rep.damaged_snapshots.push(id.to_string());
        return;
    }
    if cloud {
        held.checked(id, next.as_ref(), None);
        rep.cloud_snapshots += 1;
        return;
    }
    referenced.extend(f.unlisted_needed.iter().copied());
    let first = f
        .paths
        .first()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    if f.missing > 0 {
        rep.errors.push(format!(
            "{label}: {} chunks unavailable, in {} files (first {first})",
            f.missing,
            f.paths.len()
        ));
    }
    if f.broken > 0 {
        rep.errors.push(format!(
            "{label}: {} indirect references that the next version {} does not hold (first in {first})",
            f.broken,
            next.as_deref().map(|n| n.get(..8).unwrap_or(n)).unwrap_or("(none)"),
        ));
    }
    if f.misplaced > 0 {
        rep.errors.push(format!(
            "{label}: {} direct references into containers of the wrong lifecycle domain ({})",
            f.misplaced,
            if s.archival.is_some() {
                "an archival version may reference only the pool and its own stamped containers"
            } else {
                "a live-form version must reference only the shared pool"
            }
        ));
    }
    if let Some(first) = &f.first_unsafe {
        rep.errors.push(format!(
            "{label}: {} entries whose path or link target could reach outside a restore \
             target (empty, absolute, `.`/`..` or NUL; first {first:?}): restore refuses them",
            f.unsafe_paths
        ));
    }
    if f.odd_zero_runs > 0 {
        rep.warnings.push(format!(
            "{label}: {} runs of zero chunks count more chunks than they have bytes \
             (they read as zeros of their length; a snapshot of a volume reads those segments again)",
            f.odd_zero_runs
        ));
    }
    if f.missing > 0 || f.broken > 0 {
        rep.damaged_snapshots.push(id.to_string());
        let lossy = f
            .paths
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        rep.damaged_paths.insert(id.to_string(), lossy.collect());
        rep.damaged_raw
            .insert(id.to_string(), f.paths.iter().cloned().collect());
    }
    held.checked(id, next.as_ref(), Some((f.fps, f.bad)));
}

impl RecipeFindings {
    /// Counts `n` if its path, or a hard link's target, could reach outside
    /// a restore target (the recipe writer never makes such a path).
    fn check_path(&mut self, n: &strata_core::format::Node) {
        let target = (n.kind == strata_core::format::NodeKind::Hardlink)
            .then_some(n.target.as_deref())
            .flatten();
        let bad = std::iter::once(n.path.as_slice())
            .chain(target)
            .any(|p| crate::ops::restore::safe_rel(p).is_err());
        if bad {
            self.unsafe_paths += 1;
            self.first_unsafe
                .get_or_insert_with(|| String::from_utf8_lossy(&n.path).into_owned());
        }
    }

    /// Walks node `n`'s references (numbered in `containers`) against
    /// what is available (and, for an archival version, what the next
    /// version holds). A file in pieces is visited a piece at a time; its
    /// path is listed once.
    fn visit(
        &mut self,
        avail: &Available,
        n: &strata_core::format::Node,
        containers: &[ContainerId],
        (id, s): (&SnapshotId, &Snapshot),
        next_held: Option<&(HashSet<Fingerprint>, HashSet<Fingerprint>)>,
    ) {
        let f = self;
        let mut damaged = false;
        for c in n.segments.iter().flat_map(|seg| &seg.chunks) {
            if c.is_zero() {
                if !c.is_sound_run() {
                    f.odd_zero_runs += 1;
                }
                continue;
            }
            if f.keep_fps {
                f.fps.insert(c.fp);
            }
            if c.is_indirect() {
                match next_held {
                    Some((nf, nb)) if nf.contains(&c.fp) => {
                        if nb.contains(&c.fp) {
                            f.bad.insert(c.fp);
                            f.missing += 1;
                            damaged = true;
                        }
                    }
                    _ => {
                        f.broken += 1;
                        f.bad.insert(c.fp);
                        damaged = true;
                    }
                }
                continue;
            }
            let cid = containers.get(c.container as usize);
            let meta = cid.and_then(|cid| avail.metas.get(cid).map(|m| (cid, m)));
            // Live-form versions reference only the pool; an archival one
            // the pool or its own stamped containers.
            if let Some((_, m)) = meta {
                let owner = m.stamp.as_ref().map(|st| st.owner.as_str());
                let own = s.archival.is_some() && owner == Some(id.as_str());
                if owner.is_some() && !own {
                    f.misplaced += 1;
                }
            }
            let direct_ok = meta
                .map(|(cid, m)| {
                    !avail.bad_containers.contains(cid)
                        && !avail.bad_chunks.contains(&(*cid, c.fp))
                        && m.regions
                            .get(c.region as usize)
                            .is_some_and(|r| c.offset as u64 + c.len as u64 <= r.raw_len as u64)
                })
                .unwrap_or(false);
            // Restore reads a chunk whose container is no longer listed
            // (gc moved it), or whose stored copy is damaged, from any
            // other intact copy (`engine::copies`).
            let found_elsewhere = avail.has_good_copy(&c.fp);
            if !direct_ok && !found_elsewhere {
                f.missing += 1;
                f.bad.insert(c.fp);
                damaged = true;
                if let Some(cid) = cid.filter(|cid| !avail.metas.contains_key(*cid)) {
                    f.unlisted_needed.insert(*cid);
                }
            }
        }
        if damaged && f.paths.last() != Some(&n.path) {
            f.paths.push(n.path.clone());
        }
    }
}

/// Convenience for callers that want an error when the check fails.
pub fn check_ok(repo: &Repository, read_data: bool) -> Result<CheckReport> {
    let r = check(
        repo,
        &CheckOptions {
            read_data,
            ..Default::default()
        },
    )?;
    if r.ok() {
        Ok(r)
    } else {
        Err(StoreError::Invalid(r.errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::format::ChunkEntry;

    fn meta(id: u8, fps: &[u8]) -> ContainerMeta {
        ContainerMeta {
            id: ContainerId([id; 16]),
            data_len: 0,
            created: 0,
            stamp: None,
            regions: Vec::new(),
            chunks: fps
                .iter()
                .map(|&f| ChunkEntry {
                    fp: Fingerprint([f; 32]),
                    region: 0,
                    offset: 0,
                    len: 1,
                })
                .collect(),
            segments: Vec::new(),
            deltas: Vec::new(),
        }
    }

    /// The set of fingerprints with an intact copy, made on first use:
    /// a damaged container's chunks and damaged chunks do not count,
    /// another intact copy does.
    #[test]
    fn good_copies_leave_out_damaged_containers_and_chunks() {
        let metas: HashMap<ContainerId, ContainerMeta> =
            [meta(1, &[1, 2, 3]), meta(2, &[3, 4]), meta(3, &[5])]
                .into_iter()
                .map(|m| (m.id, m))
                .collect();
        let bad_containers = HashSet::from([ContainerId([2; 16])]);
        let bad_chunks = HashSet::from([(ContainerId([1; 16]), Fingerprint([2; 32]))]);
        let avail = Available {
            metas: &metas,
            bad_containers: &bad_containers,
            bad_chunks: &bad_chunks,
            good_fps: std::cell::OnceCell::new(),
        };
        assert!(
            avail.good_fps.get().is_none(),
            "not made before it is needed"
        );
        let good: Vec<u8> = (1..=6)
            .filter(|&f| avail.has_good_copy(&Fingerprint([f; 32])))
            .collect();
        assert_eq!(good, [1, 3, 5]);
    }
}
