//! The mount's layout: inode numbers (a view — snapshot and the way it
//! was reached — and an entry of its tree), names as path components, and
//! a version's tree built from its recipes' skeletons.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata_core::format::{Node, NodeKind, Snapshot};
use strata_store::engine::fsread::SnapshotReader;
use strata_store::ops::restore::safe_rel;
use strata_store::repo::skeleton::Skeleton;

/// Attributes and entries never change while mounted: the kernel may keep
/// them as long as it likes.
pub(crate) const TTL: Duration = Duration::from_secs(3600);
/// Inode numbers: bits 40.. hold the view (snapshot × way in) + 1, bits
/// 0..40 the entry in its tree; view 0 is the fixed part of the layout.
pub(crate) const VIEW_SHIFT: u32 = 40;
pub(crate) const LOCAL_MASK: u64 = (1 << VIEW_SHIFT) - 1;
pub(crate) const INO_ROOT: u64 = 1;
pub(crate) const INO_SERIES: u64 = 2;
pub(crate) const INO_IDS: u64 = 3;
/// Series `k` is directory `SERIES_BASE + 2k`, its `latest` link the next.
pub(crate) const SERIES_BASE: u64 = 16;

/// How a snapshot's tree was reached: the two ways get distinct inode
/// numbers, since the kernel wants one parent per directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    Series,
    Ids,
}

/// What an inode number stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ino {
    Root,
    SeriesDir,
    IdsDir,
    Series(usize),
    Latest(usize),
    Tree { snap: usize, via: Via, local: u64 },
}

impl Ino {
    pub(crate) fn decode(ino: u64) -> Option<Ino> {
        let view = ino >> VIEW_SHIFT;
        if view > 0 {
            let v = (view - 1) as usize;
            let via = if v.is_multiple_of(2) {
                Via::Series
            } else {
                Via::Ids
            };
            let local = ino & LOCAL_MASK;
            return Some(Ino::Tree {
                snap: v / 2,
                via,
                local,
            });
        }
        match ino {
            INO_ROOT => Some(Ino::Root),
            INO_SERIES => Some(Ino::SeriesDir),
            INO_IDS => Some(Ino::IdsDir),
            n if n >= SERIES_BASE => {
                let k = ((n - SERIES_BASE) / 2) as usize;
                Some(match (n - SERIES_BASE) % 2 {
                    0 => Ino::Series(k),
                    _ => Ino::Latest(k),
                })
            }
            _ => None,
        }
    }

    pub(crate) fn encode(self) -> u64 {
        match self {
            Ino::Root => INO_ROOT,
            Ino::SeriesDir => INO_SERIES,
            Ino::IdsDir => INO_IDS,
            Ino::Series(k) => SERIES_BASE + 2 * k as u64,
            Ino::Latest(k) => SERIES_BASE + 2 * k as u64 + 1,
            Ino::Tree { snap, via, local } => {
                let view = 2 * snap as u64 + (via == Via::Ids) as u64 + 1;
                (view << VIEW_SHIFT) | (local & LOCAL_MASK)
            }
        }
    }
}

/// A series name as one file name: percent-encoding of `%`, `/` and NUL,
/// and of the dots of `.` and `..`; `%` alone for the empty name. Distinct
/// names stay distinct.
pub fn escape_component(name: &str) -> String {
    match name {
        "" => return "%".into(),
        "." => return "%2E".into(),
        ".." => return "%2E%2E".into(),
        _ => {}
    }
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        match ch {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '\0' => out.push_str("%00"),
            c => out.push(c),
        }
    }
    out
}

/// Nanoseconds since the epoch as a time (before it too).
pub(crate) fn time_of(ns: i64) -> SystemTime {
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        UNIX_EPOCH.checked_add(d).unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH.checked_sub(d).unwrap_or(UNIX_EPOCH)
    }
}

/// A device number as `stat` gives it (glibc's 64-bit encoding) in the
/// kernel's 32-bit one that FUSE carries.
pub(crate) fn kernel_dev(dev: u64) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// One entry of a version's tree.
pub(crate) struct TNode {
    /// Last path component.
    pub(crate) name: Vec<u8>,
    pub(crate) parent: u64,
    /// The recipe node (part, index); `None` for the root and for
    /// directories the recipe lacks but its paths imply.
    pub(crate) src: Option<(usize, usize)>,
    /// Children, sorted by name.
    pub(crate) children: Vec<u64>,
    /// For a hard link: the entry of the file it names.
    pub(crate) link: Option<u64>,
    /// Content length of a file, target length of a symlink.
    pub(crate) size: u64,
}

/// One recipe of a version: its own, or its cloud part's.
pub(crate) struct Part {
    pub(crate) snapshot: Snapshot,
    /// Its recipe without chunks: a file's are read when it is opened.
    pub(crate) tree: Arc<Skeleton>,
    /// Its data is in the cloud tier.
    pub(crate) cloud: bool,
    pub(crate) reader: Mutex<Option<Arc<SnapshotReader>>>,
}

/// A version's tree, built on first use.
pub(crate) struct Loaded {
    pub(crate) parts: Vec<Part>,
    pub(crate) nodes: Vec<TNode>,
}

impl Loaded {
    pub(crate) fn node(&self, local: u64) -> Option<&TNode> {
        self.nodes.get(usize::try_from(local).ok()?)
    }

    /// The recipe node behind a tree entry.
    pub(crate) fn recipe_node(&self, t: &TNode) -> Option<&Node> {
        let (p, i) = t.src?;
        self.parts.get(p)?.tree.recipe.nodes.get(i)
    }

    pub(crate) fn is_dir(&self, local: u64) -> bool {
        match self.node(local) {
            Some(t) => self.recipe_node(t).is_none_or(|n| n.kind == NodeKind::Dir),
            None => false,
        }
    }

    /// The child of directory `dir` called `name`, hard links followed.
    pub(crate) fn child(&self, dir: u64, name: &[u8]) -> Option<u64> {
        let d = self.node(dir)?;
        let at = d
            .children
            .binary_search_by(|c| {
                let n = self.node(*c).map(|t| t.name.as_slice()).unwrap_or(b"");
                n.cmp(name)
            })
            .ok()?;
        let c = d.children[at];
        Some(self.node(c)?.link.unwrap_or(c))
    }
}

/// Builds the tree of a version from its recipes (the first holds every
/// directory; later ones add only paths it lacks). Returns the nodes and
/// how many recipe entries were left out (unusable paths, entries below a
/// non-directory).
pub(crate) fn build_tree(parts: &[Part]) -> (Vec<TNode>, usize) {
    let mut nodes = vec![TNode {
        name: Vec::new(),
        parent: 0,
        src: None,
        children: Vec::new(),
        link: None,
        size: 0,
    }];
    let mut at: HashMap<&[u8], u64> = HashMap::from([(&b""[..], 0)]);
    let kind_of = |nodes: &[TNode], l: u64| {
        nodes[l as usize]
            .src
            .map(|(p, i)| parts[p].tree.recipe.nodes[i].kind)
            .unwrap_or(NodeKind::Dir)
    };
    let mut skipped = 0;
    for (p, part) in parts.iter().enumerate() {
        for (i, n) in part.tree.recipe.nodes.iter().enumerate() {
            if safe_rel(&n.path).is_err() {
                skipped += 1;
                continue;
            }
            if let Some(&l) = at.get(n.path.as_slice()) {
                // A directory first made up for its children becomes the
                // recorded one.
                if nodes[l as usize].src.is_none() && l != 0 && n.kind == NodeKind::Dir {
                    nodes[l as usize].src = Some((p, i));
                }
                continue;
            }
            // The parent, and any ancestors the recipe lacks, made up.
            let mut missing = Vec::new();
            let mut path = n.path.as_slice();
            let parent = loop {
                let up = path
                    .iter()
                    .rposition(|&b| b == b'/')
                    .map_or(&path[..0], |k| &path[..k]);
                if let Some(&l) = at.get(up) {
                    break l;
                }
                missing.push(up);
                path = up;
            };
            if kind_of(&nodes, parent) != NodeKind::Dir {
                skipped += 1;
                continue;
            }
            let mut parent = parent;
            for dir in missing.into_iter().rev() {
                parent = push_node(&mut nodes, &mut at, dir, parent, None, 0);
            }
            let size = match n.kind {
                NodeKind::File => part.tree.lens.get(i).copied().unwrap_or(0),
                NodeKind::Symlink => n.target.as_ref().map_or(0, |t| t.len() as u64),
                _ => 0,
            };
            push_node(&mut nodes, &mut at, &n.path, parent, Some((p, i)), size);
        }
    }
    for l in 0..nodes.len() {
        let mut c = std::mem::take(&mut nodes[l].children);
        c.sort_by(|a, b| nodes[*a as usize].name.cmp(&nodes[*b as usize].name));
        nodes[l].children = c;
        let Some((p, i)) = nodes[l].src else { continue };
        let n = &parts[p].tree.recipe.nodes[i];
        if n.kind == NodeKind::Hardlink {
            let target = n.target.as_deref().and_then(|t| at.get(t)).copied();
            nodes[l].link = target.filter(|&t| kind_of(&nodes, t) == NodeKind::File);
        }
    }
    (nodes, skipped)
}

/// Appends an entry for `path` under `parent`.
pub(crate) fn push_node<'a>(
    nodes: &mut Vec<TNode>,
    at: &mut HashMap<&'a [u8], u64>,
    path: &'a [u8],
    parent: u64,
    src: Option<(usize, usize)>,
    size: u64,
) -> u64 {
    let l = nodes.len() as u64;
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path).to_vec();
    nodes.push(TNode {
        name,
        parent,
        src,
        children: Vec::new(),
        link: None,
        size,
    });
    nodes[parent as usize].children.push(l);
    at.insert(path, l);
    l
}
