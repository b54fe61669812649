//! What every index strategy answers ([`IndexStrategy`]) and what it
//! learns from the repository index when a backup begins ([`Learns`]).

use super::table::{ChunkLoc, ContainerTable};
use strata_core::format::{ContainerMeta, ContainerSummary, SegmentSummary};
use strata_core::Fingerprint;

/// A dedup index strategy. Backups look chunks up a segment at a time (the
/// coarse unit every strategy can work with) and *claim* each chunk they
/// are about to store, so two workers never store the same new chunk.
pub trait IndexStrategy<E = crate::key::IndexError>: Send + Sync {
    fn name(&self) -> &'static str;
    /// For each chunk of a segment, the location of a stored copy if known.
    fn lookup_segment(
        &self,
        segment: &Fingerprint,
        chunks: &[Fingerprint],
    ) -> Vec<Option<ChunkLoc>>;
    /// Claims a new chunk at `loc`. Returns `None` when the caller must store
    /// it, or the location another writer claimed first.
    fn claim(&self, fp: &Fingerprint, loc: ChunkLoc) -> Option<ChunkLoc>;
    /// Bytes held by the in-RAM structures.
    fn ram_bytes(&self) -> u64;
    /// Number of entries (chunks or segments) indexed.
    fn entries(&self) -> u64;
    /// Location of one chunk by fingerprint, where the strategy knows it
    /// (used to re-resolve reused references after gc moved chunks).
    fn lookup_chunk(&self, _fp: &Fingerprint) -> Option<ChunkLoc> {
        None
    }
    /// True when new segments must be packed whole into one container.
    fn whole_segments(&self) -> bool {
        false
    }
    /// Called after a new segment was stored whole: its non-zero chunks,
    /// their locations, and (container, first chunk entry) of its run in
    /// the container's metadata.
    fn record_segment(
        &self,
        _segment: &Fingerprint,
        _chunks: &[Fingerprint],
        _locs: &[ChunkLoc],
        _at: (u32, u32),
    ) {
    }
    /// Called after the new chunks of a partly new segment were packed
    /// as one run at (container, first chunk entry): lets the strategy
    /// find them by similarity later.
    fn record_run(&self, _chunks: &[Fingerprint], _at: (u32, u32)) {}
    /// For a segment neither it nor the file's previous version knows: the
    /// locations of its chunks in a *similar* stored segment, if the
    /// strategy keeps representatives (`segment`: the stored segment with
    /// the same minimum chunk fingerprint).
    fn lookup_similar(&self, _chunks: &[Fingerprint]) -> Option<Vec<Option<ChunkLoc>>> {
        None
    }
    /// Called when a segment `lookup_segment` handed to this caller to store
    /// was not stored whole after all.
    fn release_segment(&self, _segment: &Fingerprint) {}
    /// Learns the contents of a container listed in the repository index.
    fn add_container(&self, table: &ContainerTable, meta: &ContainerMeta);
    /// Learns a container's whole segments, for a strategy that learns
    /// only those ([`Learns::Segments`]).
    fn add_segments(
        &self,
        _table: &ContainerTable,
        _c: &ContainerSummary,
        _segments: &[SegmentSummary],
    ) {
    }
    /// What a backup reads of the repository index for this strategy.
    fn learns(&self) -> Learns {
        Learns::Chunks
    }
    /// Called once a segment (or a group of small files looked up as one)
    /// is stored: every non-zero chunk with its location, its plaintext
    /// bytes, and how many chunks it stored anew.
    fn segment_done(
        &self,
        _segment: &Fingerprint,
        _chunks: &[(Fingerprint, ChunkLoc)],
        _bytes: u64,
        _new_chunks: usize,
    ) -> Result<(), E> {
        Ok(())
    }
    /// True when small files of one directory should be looked up together
    /// as one segment (SiLo §3.2 principle P1).
    fn groups_small_files(&self) -> bool {
        false
    }
    /// End of a backup, after its containers are written: persist what the
    /// strategy keeps on the side.
    fn finish(&self) -> Result<(), E> {
        Ok(())
    }
}

/// What an index strategy learns from the repository index when a backup
/// begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learns {
    /// Every chunk entry ([`IndexStrategy::add_container`]): the index
    /// objects are read whole.
    Chunks,
    /// Each container's whole segments ([`IndexStrategy::add_segments`]):
    /// the index summaries, about 1/100 of the bytes.
    Segments,
    /// Only which containers exist: strategies that keep chunk locations
    /// on the side (SiLo's blocks, Extreme Binning's bins).
    Containers,
}
