//! Recipes: chunk and segment references, tree nodes, and the recipe
//! index of a recipe in parts.

use super::codec::STRUCT_VERSION;
use crate::error::{CoreError, Result};
use crate::fingerprint::Fingerprint;
use crate::id::{ContainerId, PartId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Sentinel container index of a chunk that is all zeros (never stored).
pub const ZERO_CHUNK: u32 = u32::MAX;
/// Sentinel container index of an *indirect* reference (RevDedup §2.4.1):
/// the chunk with this fingerprint in the next version of the series (see
/// [`Archival::next`]), which may itself be indirect.
pub const INDIRECT_CHUNK: u32 = u32::MAX - 1;

/// Reference to one chunk from a recipe. `container` indexes the recipe's
/// container table (a *direct* reference, docs/design.md "recipe"), or is
/// [`ZERO_CHUNK`] or [`INDIRECT_CHUNK`]. Commands that move chunks (gc,
/// maintain) rewrite the recipes that point at them; should a container be
/// missing anyway, restore falls back to the index by fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub fp: Fingerprint,
    pub len: u32,
    pub container: u32,
    pub region: u32,
    pub offset: u32,
}

impl ChunkRef {
    pub fn is_zero(&self) -> bool {
        self.container == ZERO_CHUNK
    }

    pub fn is_indirect(&self) -> bool {
        self.container == INDIRECT_CHUNK
    }

    /// A reference to a stored chunk of this recipe's container table.
    pub fn is_direct(&self) -> bool {
        self.container < INDIRECT_CHUNK
    }

    /// An indirect reference to the chunk `fp` of the next version.
    pub fn indirect(fp: Fingerprint, len: u32) -> Self {
        ChunkRef {
            fp,
            len,
            container: INDIRECT_CHUNK,
            region: 0,
            offset: 0,
        }
    }

    /// A run of `chunks` consecutive all-zero chunks of a segment, `len`
    /// bytes in all, as one reference: nothing is stored for them, and a
    /// sparse disk image's recipe (4 KiB chunks) would otherwise hold 48
    /// bytes per 4 KiB of nothing — 1.2 GB for an empty 100 GiB volume.
    /// `offset`, unused by a zero reference, counts the chunks after the
    /// first (0: one chunk, what every build wrote before runs).
    pub fn zeros(len: u32, chunks: u32) -> Self {
        ChunkRef {
            fp: Fingerprint::ZERO,
            len,
            container: ZERO_CHUNK,
            region: 0,
            offset: chunks.saturating_sub(1),
        }
    }

    /// How many chunks this reference stands for: a zero run's count,
    /// else 1. A segment's fingerprint hashes that many fingerprints, and
    /// a recipe's pieces are counted in chunks so.
    pub fn chunk_count(&self) -> u64 {
        if self.is_zero() {
            self.offset as u64 + 1
        } else {
            1
        }
    }

    /// Whether a zero run counts no more chunks than it has bytes (every
    /// other reference is): one that does is damage, read as its bytes.
    pub fn is_sound_run(&self) -> bool {
        self.chunk_count() <= (self.len as u64).max(1)
    }
}

/// A segment of a file: whole chunks, the coarse dedup unit. Consecutive
/// zero chunks are one [`ChunkRef::zeros`] run, whether they were written
/// so or one by one (decoding merges them: every reader sees one form).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    pub fp: Fingerprint,
    #[serde(deserialize_with = "chunks_with_zero_runs")]
    pub chunks: Vec<ChunkRef>,
}

impl SegmentRef {
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The chunks the segment was cut into (a zero run counts its chunks).
    pub fn chunk_count(&self) -> u64 {
        self.chunks.iter().map(ChunkRef::chunk_count).sum()
    }

    /// Appends `c`, merged into the zero run before it if both are zeros.
    pub fn push(&mut self, c: ChunkRef) {
        push_chunk(&mut self.chunks, c)
    }

    /// The segment `fp` of `chunks`, its zero chunks merged into runs.
    pub fn with_runs(fp: Fingerprint, chunks: impl IntoIterator<Item = ChunkRef>) -> Self {
        let mut s = SegmentRef {
            fp,
            chunks: Vec::new(),
        };
        chunks.into_iter().for_each(|c| s.push(c));
        s
    }
}

/// Appends `c` to `chunks`, a zero chunk merged into a zero run before it
/// (while the run's length and count fit their fields).
pub fn push_chunk(chunks: &mut Vec<ChunkRef>, c: ChunkRef) {
    if let (true, Some(last)) = (c.is_zero(), chunks.last_mut()) {
        if last.is_zero() {
            let len = last.len.checked_add(c.len);
            let count = last
                .offset
                .checked_add(c.offset)
                .and_then(|n| n.checked_add(1));
            if let (Some(len), Some(count)) = (len, count) {
                last.len = len;
                last.offset = count;
                return;
            }
        }
    }
    chunks.push(c)
}

/// Decodes a segment's chunk list merging its zero chunks into runs as
/// they come (a sparse image's recipe written by an older build is never
/// held expanded).
fn chunks_with_zero_runs<'de, D>(d: D) -> std::result::Result<Vec<ChunkRef>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Runs;
    impl<'de> serde::de::Visitor<'de> for Runs {
        type Value = Vec<ChunkRef>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of chunk references")
        }

        fn visit_seq<A>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error>
        where
            A: serde::de::SeqAccess<'de>,
        {
            // (The encoded count is not trusted for more than a start.)
            let mut chunks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(c) = seq.next_element::<ChunkRef>()? {
                push_chunk(&mut chunks, c);
            }
            Ok(chunks)
        }
    }
    d.deserialize_seq(Runs)
}

/// What a tree entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeKind {
    File,
    Dir,
    Symlink,
    /// A further name of a file recorded earlier (`target` holds its path).
    Hardlink,
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl NodeKind {
    /// The name scripts see (`ls --json` "type").
    pub fn id(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Dir => "dir",
            NodeKind::Symlink => "symlink",
            NodeKind::Hardlink => "hardlink",
            NodeKind::Fifo => "fifo",
            NodeKind::CharDevice => "chardevice",
            NodeKind::BlockDevice => "blockdevice",
            NodeKind::Socket => "socket",
        }
    }

    /// The name a person reads ("a directory").
    pub fn noun(self) -> &'static str {
        match self {
            NodeKind::File => "a file",
            NodeKind::Dir => "a directory",
            NodeKind::Symlink => "a symbolic link",
            NodeKind::Hardlink => "a hard link",
            NodeKind::Fifo => "a named pipe",
            NodeKind::CharDevice => "a character device",
            NodeKind::BlockDevice => "a block device",
            NodeKind::Socket => "a socket",
        }
    }

    /// The type letter `ls -l` shows.
    pub fn letter(self) -> char {
        match self {
            NodeKind::Dir => 'd',
            NodeKind::Symlink => 'l',
            NodeKind::Hardlink => 'h',
            NodeKind::Fifo => 'p',
            NodeKind::CharDevice => 'c',
            NodeKind::BlockDevice => 'b',
            NodeKind::Socket => 's',
            NodeKind::File => '-',
        }
    }
}

/// One entry of a version's tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Path relative to the snapshot root, `/`-separated raw bytes.
    pub path: Vec<u8>,
    pub kind: NodeKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub dev: u64,
    pub rdev: u64,
    pub nlink: u64,
    pub size: u64,
    /// Symlink target, or the first path of a hardlinked file.
    pub target: Option<Vec<u8>>,
    pub segments: Vec<SegmentRef>,
    /// Extended attributes (name, value), ACLs included.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Node {
    /// A node of `kind` at `path` with every other field zero or empty
    /// (one link): a base for `Node { mode, size, ..Node::new(p, k) }`.
    pub fn new(path: Vec<u8>, kind: NodeKind) -> Node {
        Node {
            path,
            kind,
            mode: 0,
            uid: 0,
            gid: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            ino: 0,
            dev: 0,
            rdev: 0,
            nlink: 1,
            size: 0,
            target: None,
            segments: vec![],
            xattrs: vec![],
        }
    }

    pub fn path_str(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// Nodes and the container table their direct references index: one
/// *part* of a version's recipe (`parts/NAME`), or — in memory, and in
/// `recipes/` objects of structure version 1 — a whole version's tree.
/// Nodes are in [`path_cmp`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    pub containers: Vec<ContainerId>,
    pub nodes: Vec<Node>,
}

/// Version byte of a `recipes/` object holding a [`RecipeIndex`]. Objects
/// of version 1 hold a whole [`Recipe`] and are still read.
pub const RECIPE_INDEX_VERSION: u8 = 2;

/// Version byte of a [`RecipeIndex`] whose parts may hold *continued*
/// files: a file node followed by further file nodes of the same path
/// (within its part or at the start of the next), whose segments follow
/// its own — a file too large for one part, stored in pieces so that
/// neither writer nor reader holds its whole chunk list. Same encoding as
/// version 2; the byte tells readers that predate pieces to refuse the
/// recipe instead of reporting a path twice.
pub const RECIPE_INDEX_CONTINUED: u8 = 3;

/// Version byte of a [`RecipeIndex`] of continued files (as
/// [`RECIPE_INDEX_CONTINUED`]) whose part references may say which piece
/// of a file their part holds alone ([`PartRef::piece`]): a new version of
/// an image takes such a part over unread when none of its segments
/// changed. Versions 2 and 3 are still read (no piece known).
pub const RECIPE_INDEX_PIECES: u8 = 4;

/// Version byte of a [`RecipeIndex`] whose parts may be stored as deltas
/// against a part of an earlier version ([`PartRef::base`]); otherwise as
/// [`RECIPE_INDEX_PIECES`]. Written only when some part has a base, so
/// repositories without deltas keep versions 2–4.
pub const RECIPE_INDEX_DELTAS: u8 = 5;

/// A recipe part stored as a delta (`parts/ID`, envelope kind
/// `RecipePartDelta`): zstd of its encoded bytes with those of part
/// `base` (stored whole) as the reference prefix. Its id is still the
/// keyed hash of its own encoded bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartDelta {
    pub base: PartId,
    pub frame: Vec<u8>,
}

/// A version's recipe as stored since recipe version 2: the list of its
/// parts (each a [`Recipe`] of consecutive nodes, stored as its own
/// content-addressed object, so versions share the parts of unchanged
/// subtrees) and the union of their container tables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecipeIndex {
    /// Every container a part references directly.
    pub containers: Vec<ContainerId>,
    pub parts: Vec<PartRef>,
    /// Whether its parts may hold continued files (stored as structure
    /// version [`RECIPE_INDEX_CONTINUED`], not a field of the encoding).
    #[serde(skip)]
    pub continued: bool,
}

/// One part of a [`RecipeIndex`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    /// Object name of the part: keyed BLAKE3 of its encoded bytes (hex).
    pub id: PartId,
    /// Path of its first node; a part holds the nodes from here up to the
    /// next part's first path.
    pub first: Vec<u8>,
    pub nodes: u32,
    /// The part's container table as indexes into
    /// [`RecipeIndex::containers`].
    pub containers: Vec<u32>,
    /// The piece of a file the part holds alone, when known (structure
    /// version [`RECIPE_INDEX_PIECES`]).
    pub piece: Option<PieceRef>,
    /// The part its object is a delta against, if it is one (structure
    /// version [`RECIPE_INDEX_DELTAS`]): kept as long as this part is.
    pub base: Option<PartId>,
}

/// A part reference as version 4 encodes it (no base).
#[derive(Serialize, Deserialize)]
struct PartRefV4 {
    id: PartId,
    first: Vec<u8>,
    nodes: u32,
    containers: Vec<u32>,
    piece: Option<PieceRef>,
}

/// A recipe index as version 4 encodes it.
#[derive(Serialize, Deserialize)]
struct RecipeIndexV4 {
    containers: Vec<ContainerId>,
    parts: Vec<PartRefV4>,
}

/// What a part holding a single piece of a file holds, told without
/// reading it: enough for a new version of the file to know that the
/// part is what it would write for the same piece.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceRef {
    /// The byte of the file at which the piece begins, and its bytes.
    pub offset: u64,
    pub len: u64,
    /// Keyed hash of the node's metadata (every field but its segments,
    /// in the structure encoding).
    pub meta: Fingerprint,
    /// The bytes every segment of the piece holds but the last, which
    /// holds at most that many (0: the segments differ in length).
    pub segment: u32,
    /// Its direct chunk references and their bytes.
    pub direct_chunks: u64,
    pub direct_bytes: u64,
}

impl From<PartRefV4> for PartRef {
    fn from(p: PartRefV4) -> Self {
        PartRef {
            id: p.id,
            first: p.first,
            nodes: p.nodes,
            containers: p.containers,
            piece: p.piece,
            base: None,
        }
    }
}

impl From<PartRefV2> for PartRef {
    fn from(p: PartRefV2) -> Self {
        PartRef::from(PartRefV4 {
            id: p.id,
            first: p.first,
            nodes: p.nodes,
            containers: p.containers,
            piece: None,
        })
    }
}

/// A part reference as versions 2 and 3 encode it (no piece).
#[derive(Deserialize)]
struct PartRefV2 {
    id: PartId,
    first: Vec<u8>,
    nodes: u32,
    containers: Vec<u32>,
}

/// A recipe index as versions 2 and 3 encode it.
#[derive(Deserialize)]
struct RecipeIndexV2 {
    containers: Vec<ContainerId>,
    parts: Vec<PartRefV2>,
}

/// The encoding of versions 2 and 3 (a version-4 index without pieces
/// is written as one of them, which older readers still read).
#[derive(Serialize)]
struct RecipeIndexV2Out<'a> {
    containers: &'a [ContainerId],
    parts: Vec<PartRefV2Out<'a>>,
}

#[derive(Serialize)]
struct PartRefV2Out<'a> {
    id: &'a str,
    first: &'a [u8],
    nodes: u32,
    containers: &'a [u32],
}

/// What a `recipes/` object holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecipeObject {
    /// Structure version 1: the whole tree in one object.
    Whole(Recipe),
    Index(RecipeIndex),
}

/// Encodes a recipe index: structure version [`RECIPE_INDEX_PIECES`]
/// when a part says which piece it holds (its files are continued), else
/// [`RECIPE_INDEX_CONTINUED`] when it holds continued files, else
/// [`RECIPE_INDEX_VERSION`].
pub fn encode_recipe_index(r: &RecipeIndex) -> Result<Vec<u8>> {
    let enc = |e: postcard::Error| CoreError::Encode(e.to_string());
    if r.parts.iter().any(|p| p.base.is_some()) {
        return postcard::to_extend(r, vec![RECIPE_INDEX_DELTAS]).map_err(enc);
    }
    if r.continued && r.parts.iter().any(|p| p.piece.is_some()) {
        let v4 = RecipeIndexV4 {
            containers: r.containers.clone(),
            parts: r
                .parts
                .iter()
                .map(|p| PartRefV4 {
                    id: p.id.clone(),
                    first: p.first.clone(),
                    nodes: p.nodes,
                    containers: p.containers.clone(),
                    piece: p.piece.clone(),
                })
                .collect(),
        };
        return postcard::to_extend(&v4, vec![RECIPE_INDEX_PIECES]).map_err(enc);
    }
    let v = match r.continued {
        true => RECIPE_INDEX_CONTINUED,
        false => RECIPE_INDEX_VERSION,
    };
    let old = RecipeIndexV2Out {
        containers: &r.containers,
        parts: r
            .parts
            .iter()
            .map(|p| PartRefV2Out {
                id: &p.id,
                first: &p.first,
                nodes: p.nodes,
                containers: &p.containers,
            })
            .collect(),
    };
    postcard::to_extend(&old, vec![v]).map_err(enc)
}

/// Decodes a `recipes/` object of any version this build reads.
pub fn decode_recipe_object(bytes: &[u8]) -> Result<RecipeObject> {
    const WHAT: &str = "recipe";
    let (&v, body) = bytes.split_first().ok_or(CoreError::Truncated(WHAT))?;
    let err = |e: postcard::Error| super::codec::decode_error(WHAT, e);
    match v {
        RECIPE_INDEX_DELTAS => postcard::from_bytes(body)
            .map(|i| {
                RecipeObject::Index(RecipeIndex {
                    continued: true,
                    ..i
                })
            })
            .map_err(err),
        RECIPE_INDEX_PIECES => postcard::from_bytes(body)
            .map(|i: RecipeIndexV4| {
                RecipeObject::Index(RecipeIndex {
                    containers: i.containers,
                    parts: i.parts.into_iter().map(PartRef::from).collect(),
                    continued: true,
                })
            })
            .map_err(err),
        RECIPE_INDEX_VERSION | RECIPE_INDEX_CONTINUED => postcard::from_bytes(body)
            .map(|i: RecipeIndexV2| {
                RecipeObject::Index(RecipeIndex {
                    containers: i.containers,
                    parts: i.parts.into_iter().map(PartRef::from).collect(),
                    continued: v == RECIPE_INDEX_CONTINUED,
                })
            })
            .map_err(err),
        STRUCT_VERSION => postcard::from_bytes(body)
            .map(RecipeObject::Whole)
            .map_err(err),
        found => Err(CoreError::UnknownVersion {
            what: WHAT,
            found,
            supported: RECIPE_INDEX_DELTAS,
        }),
    }
}

/// The order of nodes in a recipe: component by component, each compared
/// as bytes, a directory before its contents — the order of a depth-first
/// walk that visits each directory's entries by name. Equivalent to
/// comparing the paths as bytes with `/` below every other byte.
pub fn path_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let key = |c: u8| if c == b'/' { 0u8 } else { c };
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return key(*x).cmp(&key(*y)).then(x.cmp(y));
        }
    }
    a.len().cmp(&b.len())
}
