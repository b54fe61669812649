//! Unit tests of diff and find.

use super::diff::*;
use super::find::*;
use strata_core::format::{path_cmp, Node, NodeKind, Recipe, Snapshot};
use strata_core::format::{ChunkRef, SegmentRef, ZERO_CHUNK};
use strata_core::{Fingerprint, Hasher};

/// A node with everyday metadata and no content.
fn node(path: &[u8], kind: NodeKind) -> Node {
    Node {
        mode: if kind == NodeKind::Dir {
            0o40755
        } else {
            0o100644
        },
        uid: 1000,
        gid: 1000,
        mtime_ns: 1_000,
        ctime_ns: 1_000,
        ino: 7,
        dev: 1,
        ..Node::new(path.to_vec(), kind)
    }
}

fn dir(path: &[u8]) -> Node {
    node(path, NodeKind::Dir)
}

/// A chunk reference to `data` in container `container`.
fn chunk(data: &[u8], container: u32) -> ChunkRef {
    ChunkRef {
        fp: Hasher::plain().hash(data),
        len: data.len() as u32,
        container,
        region: 0,
        offset: 0,
    }
}

/// A regular file whose content is the chunks `parts`, one segment.
fn file(path: &[u8], parts: &[&[u8]]) -> Node {
    let chunks: Vec<ChunkRef> = parts.iter().map(|p| chunk(p, 0)).collect();
    let mut n = node(path, NodeKind::File);
    n.size = chunks.iter().map(|c| c.len as u64).sum();
    n.segments = vec![SegmentRef {
        fp: Hasher::plain().hash_fingerprints(chunks.iter().map(|c| &c.fp)),
        chunks,
    }];
    n
}

fn link(path: &[u8], kind: NodeKind, target: &[u8]) -> Node {
    let mut n = node(path, kind);
    n.target = Some(target.to_vec());
    n.size = if kind == NodeKind::Symlink {
        target.len() as u64
    } else {
        0
    };
    n
}

fn recipe(mut nodes: Vec<Node>) -> Recipe {
    nodes.sort_by(|a, b| path_cmp(&a.path, &b.path));
    Recipe {
        containers: vec![],
        nodes,
    }
}

/// (path, change, what) of each entry, for compact assertions.
fn brief(e: &[DiffEntry]) -> Vec<(String, Change, Vec<&'static str>)> {
    e.iter()
        .map(|e| {
            (
                String::from_utf8_lossy(&e.path).into_owned(),
                e.change,
                e.what.clone(),
            )
        })
        .collect()
}

#[test]
fn added_removed_and_unchanged_paths_with_counts() {
    let a = recipe(vec![
        dir(b"d"),
        file(b"d/keep", &[b"same"]),
        file(b"d/old", &[b"0123456789"]),
        link(b"d/ln", NodeKind::Symlink, b"keep"),
    ]);
    let b = recipe(vec![
        dir(b"d"),
        file(b"d/keep", &[b"same"]),
        file(b"d/new", &[b"abc", b"defg"]),
        dir(b"e"),
        link(b"d/ln", NodeKind::Symlink, b"keep"),
    ]);
    let (e, s) = diff(&a, &b);
    assert_eq!(
        brief(&e),
        [
            ("d/new".into(), Change::Added, vec![]),
            ("d/old".into(), Change::Removed, vec![]),
            ("e".into(), Change::Added, vec![]),
        ]
    );
    assert_eq!((e[0].old_size, e[0].new_size), (None, Some(7)));
    assert_eq!((e[1].old_size, e[1].new_size), (Some(10), None));
    assert_eq!((e[2].kind, e[2].new_size), (NodeKind::Dir, None));
    assert_eq!(
        s,
        DiffSummary {
            added: 2,
            removed: 1,
            modified: 0,
            metadata: 0,
            added_bytes: 7,
            removed_bytes: 10,
        }
    );
    // Identical trees, and empty ones, have no differences.
    assert_eq!(diff(&a, &a), (vec![], DiffSummary::default()));
    assert_eq!(diff(&Recipe::default(), &Recipe::default()).0, vec![]);
    // Everything added / removed against an empty tree.
    let (_, s) = diff(&Recipe::default(), &b);
    assert_eq!((s.added, s.added_bytes), (5, 11));
    let (_, s) = diff(&b, &Recipe::default());
    assert_eq!((s.removed, s.removed_bytes), (5, 11));
}

#[test]
fn content_changes_are_modified() {
    let a = recipe(vec![
        file(b"same-size", &[b"aaaa"]),
        file(b"grown", &[b"aaaa"]),
        file(b"edited", &[b"aaaa", b"bbbb"]),
    ]);
    let mut touched = file(b"same-size", &[b"zzzz"]);
    // Touched too: both reported.
    touched.mtime_ns = 5;
    let b = recipe(vec![
        touched,
        file(b"grown", &[b"aaaa", b"b"]),
        file(b"edited", &[b"aaaa", b"cccc"]),
    ]);
    let (e, s) = diff(&a, &b);
    assert_eq!(
        brief(&e),
        [
            ("edited".into(), Change::Modified, vec!["content"]),
            ("grown".into(), Change::Modified, vec!["content"]),
            (
                "same-size".into(),
                Change::Modified,
                vec!["content", "mtime"]
            ),
        ]
    );
    assert_eq!((e[1].old_size, e[1].new_size), (Some(4), Some(5)));
    assert_eq!(
        (s.modified, s.metadata, s.added_bytes, s.removed_bytes),
        (3, 0, 0, 0)
    );
}

#[test]
fn metadata_only_changes() {
    let base = || {
        let mut x = file(b"f", &[b"data"]);
        x.xattrs = vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"user.b".to_vec(), b"2".to_vec()),
        ];
        x
    };
    let case = |edit: &dyn Fn(&mut Node)| {
        let mut y = base();
        edit(&mut y);
        let (e, s) = diff(&recipe(vec![base()]), &recipe(vec![y]));
        assert_eq!(s.metadata, e.len() as u64);
        e.into_iter()
            .map(|e| {
                assert_eq!(e.change, Change::Metadata);
                e.what
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(case(&|n| n.mode = 0o100600), [vec!["mode"]]);
    assert_eq!(case(&|n| n.mtime_ns += 1), [vec!["mtime"]]);
    assert_eq!(case(&|n| n.uid = 0), [vec!["owner"]]);
    assert_eq!(case(&|n| n.gid = 0), [vec!["owner"]]);
    assert_eq!(case(&|n| n.xattrs[1].1 = b"3".to_vec()), [vec!["xattrs"]]);
    assert_eq!(case(&|n| n.xattrs.truncate(1)), [vec!["xattrs"]]);
    assert_eq!(
        case(&|n| {
            n.mode = 0o104755;
            n.uid = 1;
            n.mtime_ns = 0;
            n.xattrs.clear();
        }),
        [vec!["mode", "owner", "mtime", "xattrs"]]
    );
    // Not differences: the same xattrs in another order, ctime, inode,
    // device, link count.
    let none: Vec<Vec<&str>> = vec![];
    assert_eq!(case(&|n| n.xattrs.reverse()), none);
    assert_eq!(
        case(&|n| {
            n.ctime_ns = 9;
            n.ino = 9;
            n.dev = 9;
            n.nlink = 2;
        }),
        none
    );
}

#[test]
fn moved_indirect_and_regrouped_chunks_are_the_same_content() {
    let a = recipe(vec![file(b"f", &[b"one", b"two", b"three"])]);
    // A later version took the file over unread: the same chunks at
    // other locations, or indirect after reverse dedup, or split into
    // other segments.
    let mut moved = a.clone();
    for c in &mut moved.nodes[0].segments[0].chunks {
        (c.container, c.region, c.offset) = (3, 4, 5);
    }
    let mut indirect = a.clone();
    for c in &mut indirect.nodes[0].segments[0].chunks {
        *c = ChunkRef::indirect(c.fp, c.len);
    }
    let mut regrouped = a.clone();
    let seg = regrouped.nodes[0].segments.remove(0);
    for c in seg.chunks {
        regrouped.nodes[0].segments.push(SegmentRef {
            fp: c.fp,
            chunks: vec![c],
        });
    }
    for b in [&moved, &indirect, &regrouped] {
        assert_eq!(diff(&a, b), (vec![], DiffSummary::default()));
    }
}

#[test]
fn zero_runs_of_other_lengths_are_other_content() {
    let zero = |len| ChunkRef {
        fp: Fingerprint::ZERO,
        len,
        container: ZERO_CHUNK,
        region: 0,
        offset: 0,
    };
    let with = |first, last| {
        let chunks = vec![zero(first), chunk(b"x", 0), zero(last)];
        let mut n = node(b"sparse", NodeKind::File);
        n.size = 11;
        n.segments = vec![SegmentRef {
            fp: Hasher::plain().hash_fingerprints(chunks.iter().map(|c| &c.fp)),
            chunks,
        }];
        recipe(vec![n])
    };
    // Same size and segment fingerprints; other bytes.
    let (e, _) = diff(&with(4, 6), &with(6, 4));
    assert_eq!(
        brief(&e),
        [("sparse".into(), Change::Modified, vec!["content"])]
    );
    assert!(diff(&with(4, 6), &with(4, 6)).0.is_empty());
    // The same zeros cut otherwise (chunks, a run, other segments):
    // the same content.
    let cut = |parts: &[&[u32]]| {
        let mut n = node(b"sparse", NodeKind::File);
        n.size = 12;
        n.segments = parts
            .iter()
            .map(|p| SegmentRef {
                fp: Fingerprint::ZERO,
                chunks: p.iter().map(|&l| zero(l)).collect(),
            })
            .collect();
        recipe(vec![n])
    };
    let one = cut(&[&[4, 4, 4]]);
    assert!(diff(&one, &cut(&[&[8], &[4]])).0.is_empty());
    assert!(diff(&one, &cut(&[&[4], &[4, 4]])).0.is_empty());
    assert_eq!(diff(&one, &cut(&[&[4], &[4]])).0.len(), 1);
}

#[test]
fn a_file_that_became_a_directory_is_one_modified_entry() {
    let a = recipe(vec![file(b"x", &[b"data"]), file(b"y", &[b"1"])]);
    let b = recipe(vec![
        dir(b"x"),
        file(b"x/inner", &[b"in"]),
        file(b"y", &[b"1"]),
    ]);
    let (e, s) = diff(&a, &b);
    // Its permission bits changed too (0644 to 0755).
    assert_eq!(
        brief(&e),
        [
            ("x".into(), Change::Modified, vec!["kind", "mode"]),
            ("x/inner".into(), Change::Added, vec![]),
        ]
    );
    assert_eq!(e[0].kind, NodeKind::Dir);
    assert_eq!(e[0].old_kind, Some(NodeKind::File));
    let json = serde_json::to_value(&e[0]).unwrap();
    assert_eq!(
        (&json["kind"], &json["old_kind"]),
        (&"dir".into(), &"file".into())
    );
    assert_eq!((e[0].old_size, e[0].new_size), (Some(4), None));
    assert_eq!((s.added, s.modified, s.added_bytes), (1, 1, 2));
    // And back: the directory's contents are removed.
    let (e, s) = diff(&b, &a);
    assert_eq!(
        brief(&e),
        [
            ("x".into(), Change::Modified, vec!["kind", "mode"]),
            ("x/inner".into(), Change::Removed, vec![]),
        ]
    );
    assert_eq!(
        (e[0].kind, e[0].old_kind),
        (NodeKind::File, Some(NodeKind::Dir))
    );
    assert_eq!((s.removed, s.removed_bytes), (1, 2));
}

#[test]
fn symlink_target_change_is_metadata() {
    let a = recipe(vec![link(b"l", NodeKind::Symlink, b"one")]);
    let b = recipe(vec![link(b"l", NodeKind::Symlink, b"two")]);
    let (e, s) = diff(&a, &b);
    assert_eq!(brief(&e), [("l".into(), Change::Metadata, vec!["target"])]);
    assert_eq!((e[0].old_size, e[0].new_size), (None, None));
    assert_eq!(s.metadata, 1);
    // A symlink replaced by a file is a kind change, not a target one.
    let c = recipe(vec![file(b"l", &[b"two"])]);
    assert_eq!(
        brief(&diff(&a, &c).0),
        [("l".into(), Change::Modified, vec!["kind"])]
    );
}

#[test]
fn devices_compare_their_numbers() {
    let dev = |rdev| {
        let mut n = node(b"dev/sda", NodeKind::BlockDevice);
        n.rdev = rdev;
        recipe(vec![n])
    };
    assert!(diff(&dev(8), &dev(8)).0.is_empty());
    assert_eq!(
        brief(&diff(&dev(8), &dev(9)).0),
        [("dev/sda".into(), Change::Modified, vec!["content"])]
    );
}

#[test]
fn hard_links_compare_by_their_file() {
    let a = recipe(vec![
        file(b"f", &[b"data"]),
        file(b"g", &[b"data"]),
        link(b"l1", NodeKind::Hardlink, b"f"),
        link(b"l2", NodeKind::Hardlink, b"f"),
        file(b"l3", &[b"data"]),
    ]);
    let b = recipe(vec![
        file(b"f", &[b"DATA"]),
        file(b"g", &[b"data"]),
        // Its file changed.
        link(b"l1", NodeKind::Hardlink, b"f"),
        // Another file with the old content.
        link(b"l2", NodeKind::Hardlink, b"g"),
        // A file that became a link to the same content.
        link(b"l3", NodeKind::Hardlink, b"g"),
    ]);
    let (e, s) = diff(&a, &b);
    assert_eq!(
        brief(&e),
        [
            ("f".into(), Change::Modified, vec!["content"]),
            ("l1".into(), Change::Modified, vec!["content"]),
            ("l2".into(), Change::Metadata, vec!["target"]),
            ("l3".into(), Change::Modified, vec!["kind"]),
        ]
    );
    // A link's size is its file's.
    assert_eq!((e[1].old_size, e[1].new_size), (Some(4), Some(4)));
    assert_eq!((s.modified, s.metadata), (3, 1));
    // Added and removed links do not count their file's bytes twice.
    let (e, s) = diff(&recipe(vec![file(b"f", &[b"data"])]), &a);
    assert_eq!(e.len(), 4);
    assert_eq!((s.added, s.added_bytes), (4, 8));
    assert_eq!(e[1].new_size, Some(4));
    // A link whose file is missing (damage) compares by target alone.
    let dangling = |t: &[u8]| recipe(vec![link(b"l", NodeKind::Hardlink, t)]);
    assert!(diff(&dangling(b"x"), &dangling(b"x")).0.is_empty());
    assert_eq!(
        brief(&diff(&dangling(b"x"), &dangling(b"y")).0),
        [("l".into(), Change::Modified, vec!["content", "target"])]
    );
}

#[test]
fn removing_a_directory_lists_everything_below_it() {
    let a = recipe(vec![
        dir(b"a"),
        dir(b"a/b"),
        file(b"a/b/c", &[b"123"]),
        dir(b"a/b/d"),
        file(b"a/b/d/e", &[b"45"]),
        file(b"a/b.txt", &[b"6"]),
        file(b"a/z", &[b"7"]),
    ]);
    let b = recipe(vec![
        dir(b"a"),
        file(b"a/b.txt", &[b"6"]),
        file(b"a/z", &[b"7"]),
    ]);
    let (e, s) = diff(&a, &b);
    assert_eq!(
        brief(&e),
        [
            ("a/b".into(), Change::Removed, vec![]),
            ("a/b/c".into(), Change::Removed, vec![]),
            ("a/b/d".into(), Change::Removed, vec![]),
            ("a/b/d/e".into(), Change::Removed, vec![]),
        ]
    );
    assert_eq!((s.removed, s.removed_bytes), (4, 5));
    // Reversed, the same paths are added, in the same order.
    let (e, s) = diff(&b, &a);
    assert!(e.iter().all(|e| e.change == Change::Added));
    assert_eq!(e.len(), 4);
    assert_eq!((s.added, s.added_bytes), (4, 5));
}

#[test]
fn paths_that_are_not_utf8() {
    let bad: &[u8] = b"dir/caf\xe9";
    let a = recipe(vec![
        dir(b"dir"),
        file(bad, &[b"v1"]),
        file(b"dir/\xff\xfe", &[b"x"]),
    ]);
    let b = recipe(vec![
        dir(b"dir"),
        file(bad, &[b"v2"]),
        file(b"dir/\xff\xff", &[b"x"]),
    ]);
    let (e, _) = diff(&a, &b);
    let got: Vec<(&[u8], Change)> = e.iter().map(|e| (e.path.as_slice(), e.change)).collect();
    assert_eq!(
        got,
        [
            (bad, Change::Modified),
            (&b"dir/\xff\xfe"[..], Change::Removed),
            (&b"dir/\xff\xff"[..], Change::Added),
        ]
    );
    // Serialised as a string.
    let json = serde_json::to_value(&e[0]).unwrap();
    assert_eq!(json["path"], "dir/caf\u{fffd}");
    assert_eq!(json["change"], "modified");
    assert_eq!(json["kind"], "file");
    assert_eq!(json["what"], serde_json::json!(["content"]));
    assert!(json.get("old_kind").is_none());
}

#[test]
fn trees_out_of_order_or_with_repeated_paths_still_diff() {
    let sorted = recipe(vec![
        dir(b"a"),
        file(b"a/x", &[b"1"]),
        file(b"a.txt", &[b"2"]),
    ]);
    let mut shuffled = sorted.clone();
    shuffled.nodes.reverse();
    assert!(diff(&sorted, &shuffled).0.is_empty());
    // A repeated path counts once (its first node).
    let mut twice = sorted.clone();
    twice.nodes.push(file(b"a/x", &[b"other"]));
    assert!(diff(&sorted, &twice).0.is_empty());
}

fn snap(series: &str, version: u32) -> Snapshot {
    crate::testutil::snapshot(series, version, 42)
}

fn matches(patterns: &[&str], ignore_case: bool, paths: &[&[u8]]) -> Vec<String> {
    let m = Matcher::new(patterns, ignore_case).unwrap();
    paths
        .iter()
        .filter(|p| m.is_match(p))
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

const TREE: &[&[u8]] = &[
    b"docs",
    b"docs/a.md",
    b"docs/sub/b.md",
    b"src",
    b"src/docs",
    b"src/docs/c.md",
    b"src/main.rs",
    b"README.md",
];

#[test]
fn patterns_without_a_slash_match_names() {
    assert_eq!(
        matches(&["*.md"], false, TREE),
        ["docs/a.md", "docs/sub/b.md", "src/docs/c.md", "README.md"]
    );
    assert_eq!(matches(&["docs"], false, TREE), ["docs", "src/docs"]);
    // Not a substring or prefix of the name, nor a directory above it.
    assert!(matches(&["doc"], false, TREE).is_empty());
    assert!(matches(&["main"], false, TREE).is_empty());
    // Several patterns: any of them.
    assert_eq!(
        matches(&["main.rs", "b.*"], false, TREE),
        ["docs/sub/b.md", "src/main.rs"]
    );
    // A trailing slash is ignored.
    assert_eq!(matches(&["docs/"], false, TREE), ["docs", "src/docs"]);
}

#[test]
fn patterns_with_a_slash_match_paths() {
    // A leading slash is the snapshot root.
    assert_eq!(matches(&["/docs"], false, TREE), ["docs"]);
    assert_eq!(matches(&["/docs/*.md"], false, TREE), ["docs/a.md"]);
    assert_eq!(
        matches(&["/docs/**/*.md"], false, TREE),
        ["docs/a.md", "docs/sub/b.md"]
    );
    assert_eq!(matches(&["/*"], false, TREE), ["docs", "src", "README.md"]);
    // Otherwise the trailing components, at any depth.
    assert_eq!(
        matches(&["docs/*.md"], false, TREE),
        ["docs/a.md", "src/docs/c.md"]
    );
    assert_eq!(matches(&["**/sub/*"], false, TREE), ["docs/sub/b.md"]);
    assert_eq!(matches(&["src/docs"], false, TREE), ["src/docs"]);
    // `*` stays within a component.
    assert!(matches(&["/*.md"], false, &[b"docs/a.md"]).is_empty());
}

#[test]
fn case_is_significant_unless_ignored() {
    let tree: &[&[u8]] = &[
        b"Docs/Notes.TXT",
        "Été/ÉCOLE.txt".as_bytes(),
        b"x/n\xc9.TXT",
    ];
    assert!(matches(&["*.txt"], false, tree).contains(&"Été/ÉCOLE.txt".to_string()));
    assert_eq!(matches(&["*.txt"], false, tree).len(), 1);
    assert_eq!(matches(&["*.txt"], true, tree).len(), 3);
    assert_eq!(
        matches(&["/docs/notes.txt"], true, tree),
        ["Docs/Notes.TXT"]
    );
    assert_eq!(matches(&["NOTES.txt"], true, tree), ["Docs/Notes.TXT"]);
    // Beyond ASCII too.
    assert_eq!(matches(&["/été/école.TXT"], true, tree), ["Été/ÉCOLE.txt"]);
    assert!(matches(&["/été/école.TXT"], false, tree).is_empty());
}

#[test]
fn names_that_are_not_utf8_match_by_bytes() {
    let tree: &[&[u8]] = &[b"d", b"d/caf\xe9.txt", b"d/\xff"];
    assert_eq!(matches(&["*"], false, tree).len(), 3);
    assert_eq!(matches(&["*.txt"], false, tree), ["d/caf\u{fffd}.txt"]);
    assert_eq!(matches(&["caf?.txt"], false, tree), ["d/caf\u{fffd}.txt"]);
    assert_eq!(matches(&["/d/*"], false, tree).len(), 2);
    assert_eq!(matches(&["/D/CAF*"], true, tree), ["d/caf\u{fffd}.txt"]);
}

#[test]
fn bad_patterns_are_errors() {
    assert!(Matcher::new::<&str>(&[], false).is_err());
    assert!(Matcher::new(&[""], false).is_err());
    assert!(Matcher::new(&["/"], false).is_err());
    let e = Matcher::new(&["a[b"], false).unwrap_err();
    assert!(e.to_string().contains("a[b"), "{e}");
}

#[test]
fn find_in_reports_matching_nodes_with_their_version() {
    let r = recipe(vec![
        dir(b"d"),
        file(b"d/x.log", &[b"12345"]),
        link(b"d/y.log", NodeKind::Hardlink, b"d/x.log"),
        file(b"d/z.txt", &[b"1"]),
    ]);
    let m = Matcher::new(&["*.log"], false).unwrap();
    let hits = find_in("abc", &snap("home", 3), &r, &m);
    assert_eq!(hits.len(), 2);
    assert_eq!(
        hits[0],
        FindHit {
            snapshot_id: "abc".into(),
            series: "home".into(),
            version: 3,
            time_ns: 42,
            path: b"d/x.log".to_vec(),
            kind: NodeKind::File,
            size: 5,
            mtime_ns: 1_000,
        }
    );
    // A hard link reports its file's size.
    assert_eq!((hits[1].kind, hits[1].size), (NodeKind::Hardlink, 5));
    let json = serde_json::to_value(&hits[1]).unwrap();
    assert_eq!(json["path"], "d/y.log");
    assert_eq!(json["kind"], "hardlink");
    assert!(find_in(
        "abc",
        &snap("home", 3),
        &r,
        &Matcher::new(&["nope"], false).unwrap()
    )
    .is_empty());
}
