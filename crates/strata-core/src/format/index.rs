//! Index objects and their summaries.

use super::codec::STRUCT_VERSION;
use super::container::{
    ContainerMeta, ContainerSummary, MetaV1, MetaV1Ref, SegmentSummary, DELTA_META_VERSION,
};
use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// Version byte of an [`IndexSummary`]: 2 added the containers' segments;
/// version 1 is still read (no segments: a reader that needs them reads
/// the index object).
pub const INDEX_SUMMARY_VERSION: u8 = 2;

/// The summaries of one index object's containers, stored as
/// `isum/HASH` beside `index/HASH`. The name it summarises is inside too,
/// so a summary cannot be passed off for another index object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexSummary {
    /// The full name of the index object (`index/HASH`).
    pub index: String,
    pub containers: Vec<ContainerSummary>,
    /// The whole segments of each container, in the order of
    /// `containers` (none in a version-1 summary).
    pub segments: Option<Vec<Vec<SegmentSummary>>>,
}

impl IndexSummary {
    /// The summary of index object `index` holding `metas`.
    pub fn of(index: String, metas: &[ContainerMeta]) -> IndexSummary {
        IndexSummary {
            index,
            containers: metas.iter().map(|m| m.summary()).collect(),
            segments: Some(metas.iter().map(|m| m.segment_summaries()).collect()),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct IndexSummaryV1 {
    pub(super) index: String,
    pub(super) containers: Vec<ContainerSummary>,
}

#[derive(Serialize, Deserialize)]
struct IndexSummaryV2 {
    index: String,
    containers: Vec<ContainerSummary>,
    segments: Vec<Vec<SegmentSummary>>,
}

/// Encodes an index summary: version 2 with its segments, version 1
/// without.
pub fn encode_index_summary(s: &IndexSummary) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    match &s.segments {
        Some(segments) => postcard::to_extend(
            &IndexSummaryV2 {
                index: s.index.clone(),
                containers: s.containers.clone(),
                segments: segments.clone(),
            },
            vec![INDEX_SUMMARY_VERSION],
        )
        .map_err(enc),
        None => postcard::to_extend(
            &IndexSummaryV1 {
                index: s.index.clone(),
                containers: s.containers.clone(),
            },
            vec![STRUCT_VERSION],
        )
        .map_err(enc),
    }
}

/// Decodes an index summary of version 1 or 2 (one whose segments do not
/// match its containers one to one is refused).
pub fn decode_index_summary(bytes: &[u8]) -> Result<IndexSummary> {
    const WHAT: &str = "index summary";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let dec = |e: postcard::Error| super::codec::decode_error(WHAT, e);
    match v {
        1 => {
            let s: IndexSummaryV1 = postcard::from_bytes(body).map_err(dec)?;
            Ok(IndexSummary {
                index: s.index,
                containers: s.containers,
                segments: None,
            })
        }
        INDEX_SUMMARY_VERSION => {
            let s: IndexSummaryV2 = postcard::from_bytes(body).map_err(dec)?;
            if s.segments.len() != s.containers.len() {
                return Err(CoreError::Decode {
                    what: WHAT,
                    msg: format!(
                        "{} containers but segments of {}",
                        s.containers.len(),
                        s.segments.len()
                    ),
                });
            }
            Ok(IndexSummary {
                index: s.index,
                containers: s.containers,
                segments: Some(s.segments),
            })
        }
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: INDEX_SUMMARY_VERSION,
        }),
    }
}

/// An index object: the metadata of a set of containers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexObject {
    pub containers: Vec<ContainerMeta>,
}

#[derive(Serialize)]
struct IndexV1Ref<'a> {
    containers: Vec<MetaV1Ref<'a>>,
}

#[derive(Deserialize)]
struct IndexV1 {
    containers: Vec<MetaV1>,
}

/// Encodes an index object: version 1 when none of its containers has
/// delta regions (what builds before deltas wrote), else
/// [`DELTA_META_VERSION`].
pub fn encode_index_object(o: &IndexObject) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    if o.containers.iter().all(|m| m.deltas.is_empty()) {
        let v1 = IndexV1Ref {
            containers: o.containers.iter().map(MetaV1Ref::from).collect(),
        };
        postcard::to_extend(&v1, vec![STRUCT_VERSION]).map_err(enc)
    } else {
        postcard::to_extend(o, vec![DELTA_META_VERSION]).map_err(enc)
    }
}

/// Decodes an index object of either version.
pub fn decode_index_object(bytes: &[u8]) -> Result<IndexObject> {
    const WHAT: &str = "index";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let dec = |e: postcard::Error| super::codec::decode_error(WHAT, e);
    let o = match v {
        STRUCT_VERSION => IndexObject {
            containers: postcard::from_bytes::<IndexV1>(body)
                .map_err(dec)?
                .containers
                .into_iter()
                .map(ContainerMeta::from)
                .collect(),
        },
        DELTA_META_VERSION => postcard::from_bytes::<IndexObject>(body).map_err(dec)?,
        found => {
            return Err(CoreError::UnknownVersion {
                what: WHAT,
                found,
                supported: DELTA_META_VERSION,
            })
        }
    };
    for m in &o.containers {
        m.check_deltas()?;
    }
    Ok(o)
}
