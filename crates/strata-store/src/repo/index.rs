//! The repository's index objects (`index/…`, and their summaries
//! `isum/…`), and their loaded view [`RepoIndex`].
//!
//! The index objects list the metadata of every container; they are the
//! persisted, rebuildable truth (`strata repair index` rewrites them from
//! the containers' own metadata). From them each backup builds the in-RAM
//! structure of its index strategy (`engine::index`).

use crate::error::{Result, StoreError};
use crate::repo::Repository;
use std::collections::{BTreeMap, HashMap, HashSet};
use strata_core::crypto::Kind;
use strata_core::format::{
    decode_index_object, encode_index_object, encode_index_summary, ContainerId, ContainerMeta,
    ContainerSummary, IndexObject, IndexSummary, SegmentSummary,
};

/// The name of the summary object of index object `index/HASH`.
pub fn summary_name(index_name: &str) -> String {
    format!("isum/{}", index_name.trim_start_matches("index/"))
}

/// Stores an index object and then its summary (so a summary never names
/// a missing index object; an index object without one — older
/// repositories, or a crash in between — is simply read whole). Returns
/// the index object's name and the bytes written.
pub fn put_index_object(
    repo: &Repository,
    containers: Vec<ContainerMeta>,
) -> Result<(String, u64)> {
    put_index_object_then(repo, containers, || {})
}

/// [`put_index_object`], calling `listed` as soon as the index object is
/// written (before its summary): from then on another command may know
/// of its containers, whether or not the rest succeeds.
pub fn put_index_object_then(
    repo: &Repository,
    containers: Vec<ContainerMeta>,
    listed: impl FnOnce(),
) -> Result<(String, u64)> {
    let mut summary = IndexSummary::of(String::new(), &containers);
    let bytes = encode_index_object(&IndexObject { containers })?;
    let (id, n) = repo.put_encoded(Kind::Index, "index", &bytes)?;
    listed();
    summary.index = format!("index/{id}");
    let m = put_index_summary(repo, &summary)?;
    Ok((summary.index, n + m))
}

/// Stores the summary of an index object (`isum/HASH`); returns its
/// bytes.
fn put_index_summary(repo: &Repository, summary: &IndexSummary) -> Result<u64> {
    let env = repo
        .sealer()
        .seal(Kind::IndexSummary, &encode_index_summary(summary)?, true)?;
    let name = summary_name(&summary.index);
    repo.backend().put(&name, &env)?;
    repo.uncache(&name);
    Ok(env.len() as u64)
}

/// Stores the summaries a load with segments made from whole index
/// objects ([`RepoIndex::stale_summaries`]), so that the next load reads
/// summaries: a repository of an earlier build gets segments in its
/// summaries at its first backup. Called under a lock that keeps index
/// objects from being deleted meanwhile (a backup's); a summary is
/// bookkeeping, so a failure is only logged.
pub fn upgrade_summaries(repo: &Repository, idx: &mut RepoIndex) {
    for s in std::mem::take(&mut idx.stale_summaries) {
        if let Err(e) = put_index_summary(repo, &s) {
            tracing::warn!("rewriting the summary of {}: {e}", s.index);
        }
    }
}

/// Deletes an index object, then its summary.
pub fn delete_index_object(repo: &Repository, name: &str) -> Result<()> {
    repo.backend().delete(name)?;
    Ok(repo.backend().delete(&summary_name(name))?)
}

/// Deletes summaries whose index object is gone (left by a crash between
/// the two deletes of [`delete_index_object`]). They are harmless — loading
/// is driven by the index objects — but take space.
pub fn sweep_summaries(repo: &Repository) -> Result<u64> {
    let live: HashSet<String> = repo
        .backend()
        .list("index/")?
        .into_iter()
        .map(|o| summary_name(&o.name))
        .collect();
    let mut n = 0;
    for o in repo.backend().list("isum/")? {
        if !live.contains(&o.name) {
            repo.backend().delete(&o.name)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The repository's index objects, loaded.
#[derive(Default)]
pub struct RepoIndex {
    /// Names of the index objects read.
    pub objects: Vec<String>,
    /// The containers each index object lists.
    pub contents: HashMap<String, Vec<ContainerId>>,
    pub containers: HashMap<ContainerId, ContainerSummary>,
    /// Summaries made from index objects read whole because their own
    /// summary had no segments (version 1, or missing) when segments
    /// were asked for: [`upgrade_summaries`] stores them.
    pub stale_summaries: Vec<IndexSummary>,
}

/// Index objects and their summaries, read through the local cache.
impl Repository {
    /// Loads an index object through the local cache.
    pub fn load_index_object(&self, name: &str) -> Result<IndexObject> {
        let raw = self.get_cached(name)?;
        let bytes = self
            .sealer
            .open(Kind::Index, &raw)
            .map_err(|e| StoreError::corrupt(name, e))?;
        decode_index_object(&bytes).map_err(|e| StoreError::corrupt(name, e))
    }

    /// Reads the index object `name` from storage, past any local cache.
    pub fn read_index_object(&self, name: &str) -> Result<IndexObject> {
        self.read_verified(name, |raw| {
            let bytes = self
                .sealer
                .open(Kind::Index, raw)
                .map_err(|e| StoreError::corrupt(name, e))?;
            decode_index_object(&bytes).map_err(|e| StoreError::corrupt(name, e))
        })
    }

    /// Loads the summary `isum/HASH` of the index object `index/HASH`
    /// through the local cache. The name is not the summary's own hash, so
    /// a cached copy counts when it opens (checksum or AEAD tag) and names
    /// the right index object.
    pub fn load_index_summary(&self, index_name: &str) -> Result<IndexSummary> {
        let name = summary_name(index_name);
        let decode_summary = |raw: &[u8]| -> Result<IndexSummary> {
            let s = self.open_index_summary(&name, raw)?;
            if s.index != index_name {
                return Err(StoreError::corrupt(
                    &name,
                    strata_core::CoreError::Decode {
                        what: "index summary",
                        msg: format!("summarises {}, not {index_name}", s.index),
                    },
                ));
            }
            Ok(s)
        };
        let raw = self.get_cached_if(&name, |b| decode_summary(b).is_ok())?;
        decode_summary(&raw)
    }

    /// Reads the summary object `name` (`isum/HASH`) from storage, past
    /// any local cache.
    pub fn read_index_summary(&self, name: &str) -> Result<IndexSummary> {
        self.read_verified(name, |raw| self.open_index_summary(name, raw))
    }

    fn open_index_summary(&self, name: &str, raw: &[u8]) -> Result<IndexSummary> {
        let bytes = self
            .sealer
            .open(Kind::IndexSummary, raw)
            .map_err(|e| StoreError::corrupt(name, e))?;
        strata_core::format::decode_index_summary(&bytes).map_err(|e| StoreError::corrupt(name, e))
    }
}

impl RepoIndex {
    /// Reads every index object whole, handing each container's full
    /// metadata (chunk entries included) to `each` — for the strategies
    /// that learn chunk or segment locations from it.
    pub fn load(repo: &Repository, mut each: impl FnMut(&ContainerMeta)) -> Result<Self> {
        let mut idx = RepoIndex::default();
        let objects = repo.backend().list("index/")?;
        let names: Vec<String> = objects.iter().map(|o| o.name.clone()).collect();
        repo.prune_cache("index/", &names);
        for o in objects {
            let obj = repo.load_index_object(&o.name)?;
            let mut sums = Vec::with_capacity(obj.containers.len());
            let mut seen = HashSet::new();
            for m in &obj.containers {
                if !idx.containers.contains_key(&m.id) && seen.insert(m.id) {
                    each(m);
                }
                sums.push(m.summary());
            }
            idx.add_object(o.name, sums);
        }
        Ok(idx)
    }

    /// Reads the summaries of the index objects (falling back to the whole
    /// object where a summary is missing or damaged): everything but chunk
    /// entries, at about 1/200 of the bytes.
    pub fn load_summaries(repo: &Repository) -> Result<Self> {
        Self::load_segments(repo, false, |_, _| {})
    }

    /// [`Self::load_summaries`], handing each container (once per id, as
    /// [`Self::load`]) with its whole segments to `each`. With `segments`,
    /// an object whose summary is of version 1 (no segments) is read
    /// whole; without, `each` gets what the summary has.
    pub fn load_segments(
        repo: &Repository,
        segments: bool,
        mut each: impl FnMut(&ContainerSummary, &[SegmentSummary]),
    ) -> Result<Self> {
        let mut idx = RepoIndex::default();
        let objects = repo.backend().list("index/")?;
        let have: HashSet<String> = repo
            .backend()
            .list("isum/")?
            .into_iter()
            .map(|o| o.name)
            .collect();
        let names: Vec<String> = objects.iter().map(|o| o.name.clone()).collect();
        repo.prune_cache("index/", &names);
        let sum_names: Vec<String> = names.iter().map(|n| summary_name(n)).collect();
        repo.prune_cache("isum/", &sum_names);
        for o in objects {
            let summary = if have.contains(&summary_name(&o.name)) {
                match repo.load_index_summary(&o.name) {
                    Ok(s) if !segments || s.segments.is_some() => Some(s),
                    // The cache's copy may be older than the stored one
                    // (upgraded since by another client).
                    Ok(_) => {
                        repo.uncache(&summary_name(&o.name));
                        repo.load_index_summary(&o.name)
                            .ok()
                            .filter(|s| s.segments.is_some())
                    }
                    Err(e) => {
                        tracing::warn!("{e}; reading {} whole", o.name);
                        None
                    }
                }
            } else {
                None
            };
            let s = match summary {
                Some(s) => s,
                None => {
                    let s = IndexSummary::of(
                        o.name.clone(),
                        &repo.load_index_object(&o.name)?.containers,
                    );
                    if segments {
                        idx.stale_summaries.push(s.clone());
                    }
                    s
                }
            };
            let segs = s.segments.unwrap_or_default();
            let mut seen = HashSet::new();
            for (i, c) in s.containers.iter().enumerate() {
                if !idx.containers.contains_key(&c.id) && seen.insert(c.id) {
                    each(c, segs.get(i).map(Vec::as_slice).unwrap_or_default());
                }
            }
            idx.add_object(o.name, s.containers);
        }
        Ok(idx)
    }

    fn add_object(&mut self, name: String, sums: Vec<ContainerSummary>) {
        self.contents
            .insert(name.clone(), sums.iter().map(|m| m.id).collect());
        for m in sums {
            self.containers.entry(m.id).or_insert(m);
        }
        self.objects.push(name);
    }

    /// Bytes of chunk data (compressed, sealed regions) in the containers:
    /// what dedup and compression leave of the data, without container
    /// headers and metadata. What `gc` frees and `tier estimate` predicts.
    pub fn stored_bytes(&self) -> u64 {
        self.containers.values().map(|c| c.data_bytes()).sum()
    }

    /// Bytes of the data container objects (data, headers and metadata).
    pub fn container_bytes(&self) -> u64 {
        self.containers.values().map(|c| c.data_len).sum()
    }

    /// Containers stamped with `owner`.
    pub fn stamped_by(&self, owner: &str) -> Vec<ContainerId> {
        self.containers
            .iter()
            .filter(|(_, c)| c.stamp.as_ref().is_some_and(|s| s.owner == owner))
            .map(|(id, _)| *id)
            .collect()
    }
}

/// Removes containers from the index objects and adds new ones. The
/// replacement objects are written first, then the objects they replace
/// are deleted, so a crash in between leaves duplicate entries (which
/// loading skips), never missing ones. Stamped containers go into one
/// object per owner, so expiring a version rewrites only its own objects.
/// Returns the names of the objects written.
pub fn edit_index(
    repo: &Repository,
    idx: &RepoIndex,
    remove: &HashSet<ContainerId>,
    add: Vec<ContainerMeta>,
) -> Result<Vec<String>> {
    let affected: Vec<&String> = idx
        .objects
        .iter()
        .filter(|o| {
            idx.contents
                .get(*o)
                .is_some_and(|c| c.iter().any(|id| remove.contains(id)))
        })
        .collect();
    let mut metas = add;
    let mut seen: HashSet<ContainerId> = metas.iter().map(|m| m.id).collect();
    for o in &affected {
        for m in repo.load_index_object(o)?.containers {
            if !remove.contains(&m.id) && seen.insert(m.id) {
                metas.push(m);
            }
        }
    }
    let written = write_by_owner(repo, metas)?;
    for o in affected {
        if !written.contains(o) {
            delete_index_object(repo, o)?;
        }
    }
    Ok(written)
}

/// Writes `metas` as index objects, one for the pool and one per stamp
/// owner (so expiring a version rewrites only its own), and returns their
/// names. Deleting what they replace is the caller's job, afterwards.
pub(crate) fn write_by_owner(repo: &Repository, metas: Vec<ContainerMeta>) -> Result<Vec<String>> {
    let mut w = ByOwner::new(repo);
    for m in metas {
        w.push(m)?;
    }
    w.finish()
}

/// [`write_by_owner`] as the containers come: each owner's object is
/// written once it holds [`MAX_INDEX_OBJECT_CHUNKS`] entries, so what is
/// held is at most one object in the making per owner — not the whole
/// index (a repository of disk images has millions of chunk entries).
pub(crate) struct ByOwner<'r> {
    repo: &'r Repository,
    /// Per owner (`None`: the pool): the object in the making and its
    /// chunk entries.
    parts: BTreeMap<Option<String>, (Vec<ContainerMeta>, usize)>,
    written: Vec<String>,
}

impl<'r> ByOwner<'r> {
    pub(crate) fn new(repo: &'r Repository) -> Self {
        ByOwner {
            repo,
            parts: BTreeMap::new(),
            written: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, m: ContainerMeta) -> Result<()> {
        let owner = m.stamp.as_ref().map(|s| s.owner.clone());
        let (part, entries) = self.parts.entry(owner).or_default();
        *entries += m.chunks.len().max(1);
        part.push(m);
        // Bounded objects: a backup loads one whole object at a time.
        if *entries >= MAX_INDEX_OBJECT_CHUNKS {
            let part = std::mem::take(part);
            *entries = 0;
            self.written.push(put_index_object(self.repo, part)?.0);
        }
        Ok(())
    }

    /// Writes the objects in the making; returns the names of all written.
    pub(crate) fn finish(mut self) -> Result<Vec<String>> {
        for (_, (part, _)) in std::mem::take(&mut self.parts) {
            if !part.is_empty() {
                self.written.push(put_index_object(self.repo, part)?.0);
            }
        }
        Ok(self.written)
    }
}

/// Chunk entries per index object written by [`write_by_owner`] (~60 MB
/// of metadata, ~8 GB of 8 KiB chunks).
pub(crate) const MAX_INDEX_OBJECT_CHUNKS: usize = 1 << 20;
