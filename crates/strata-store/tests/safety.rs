//! A malicious repository must not make restore touch anything outside the
//! restore target.

mod common;

use common::*;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use strata_core::crypto::Kind;
use strata_core::format::{Archival, Node, NodeKind, Recipe, Snapshot, INDIRECT_CHUNK};
use strata_core::id::{RecipeId, SnapshotId};
use strata_store::ops::restore::{restore, RestoreOptions};
use strata_store::{Repository, StoreError};

struct Fixture {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    repo: Repository,
    /// The recipe of a real backup (one file `src/data` with content).
    recipe: Recipe,
    snapshot: Snapshot,
    /// A directory outside every restore target; must stay empty.
    outside: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().to_path_buf();
    let repo = init_repo(&base.join("repo"), false);
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), random_bytes(7, 100_000)).unwrap();
    let r = backup_paths(&repo, &[&src]).unwrap();
    let recipe = repo.load_recipe(&r.snapshot.recipe).unwrap();
    let outside = base.join("outside");
    fs::create_dir_all(&outside).unwrap();
    Fixture {
        _tmp: tmp,
        base,
        repo,
        recipe,
        snapshot: r.snapshot,
        outside,
    }
}

impl Fixture {
    /// A file node with the content of the backed-up file.
    fn file_node(&self, path: &[u8]) -> Node {
        let f = self
            .recipe
            .nodes
            .iter()
            .find(|n| n.kind == NodeKind::File && n.size > 0)
            .expect("a file in the recipe");
        Node {
            path: path.to_vec(),
            ..f.clone()
        }
    }

    /// Stores `recipe` and a snapshot for it, then loads it back the way
    /// `strata restore` does (list → resolve → load recipe).
    fn store(&self, recipe: &Recipe) -> Recipe {
        let (rid, _) = self
            .repo
            .put_struct(Kind::Recipe, "recipes", recipe)
            .unwrap();
        let rid = RecipeId::parse(&rid).unwrap();
        let snap = Snapshot {
            recipe: rid.clone(),
            series: "evil".into(),
            version: 1,
            ..self.snapshot.clone()
        };
        let sid = self.repo.put_snapshot(&snap).unwrap();
        let (_, s) = self.repo.resolve_snapshot(&sid).unwrap();
        assert_eq!(s.recipe, rid);
        self.repo.load_recipe(&s.recipe).unwrap()
    }

    fn target(&self, name: &str) -> PathBuf {
        let t = self.base.join("targets").join(name);
        fs::create_dir_all(&t).unwrap();
        t
    }

    fn assert_outside_untouched(&self) {
        let left: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            left.is_empty(),
            "restore wrote outside its target: {left:?}"
        );
        let evil = find_named(&self.base, "evil");
        assert!(evil.is_empty(), "files named `evil` were created: {evil:?}");
    }
}

fn bare_node(path: &[u8], kind: NodeKind) -> Node {
    Node {
        mode: match kind {
            NodeKind::Dir => 0o040755,
            NodeKind::Symlink => 0o120777,
            NodeKind::Fifo => 0o010644,
            _ => 0o100644,
        },
        mtime_ns: 1_600_000_000_000_000_000,
        ctime_ns: 1_600_000_000_000_000_000,
        ..Node::new(path.to_vec(), kind)
    }
}

fn symlink_node(path: &[u8], target: &Path) -> Node {
    Node {
        target: Some(target.as_os_str().as_bytes().to_vec()),
        ..bare_node(path, NodeKind::Symlink)
    }
}

/// Every path below `root` whose file name is `name` (symlinks not
/// followed).
fn find_named(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == name) {
                out.push(p.clone());
            }
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

fn opts(target: &Path) -> RestoreOptions {
    let mut o = RestoreOptions::new(target);
    // Ownership from a crafted recipe is irrelevant here.
    o.owner = false;
    o
}

#[test]
fn traversal_and_absolute_paths_are_refused() {
    let fx = fixture();
    let abs_evil = fx.outside.join("evil");
    let cases: Vec<Vec<u8>> = vec![
        b"../evil".to_vec(),
        b"../../evil".to_vec(),
        b"/abs/evil".to_vec(),
        abs_evil.as_os_str().as_bytes().to_vec(),
        b"a/../../evil".to_vec(),
        b"a/../../../outside/evil".to_vec(),
        b"./../evil".to_vec(),
        b"a//../evil".to_vec(),
        b"a/\0/evil".to_vec(),
    ];
    for (i, bad) in cases.iter().enumerate() {
        let what = String::from_utf8_lossy(bad).into_owned();
        // The malicious node comes after legitimate ones, so restore has
        // already started when it meets it.
        let mut recipe = fx.recipe.clone();
        recipe.nodes.push(fx.file_node(bad));
        let stored = fx.store(&recipe);
        let target = fx.target(&format!("t{i}"));
        match restore(&fx.repo, &fx.snapshot, &stored, &opts(&target)) {
            Err(StoreError::UnsafePath(p)) => {
                assert!(!p.is_empty(), "{what}: UnsafePath names no path")
            }
            Err(e) => panic!("{what}: expected UnsafePath, got {e}"),
            Ok(_) => panic!("{what}: restore of a malicious path succeeded"),
        }
        // Also as a directory node.
        let mut recipe = fx.recipe.clone();
        recipe.nodes.push(bare_node(bad, NodeKind::Dir));
        assert!(
            restore(&fx.repo, &fx.snapshot, &recipe, &opts(&target)).is_err(),
            "{what}: directory node accepted"
        );
        assert!(!Path::new("/abs/evil").exists());
        fx.assert_outside_untouched();
    }
}

#[test]
fn file_below_a_symlink_in_the_same_recipe_is_refused() {
    let fx = fixture();
    let mut recipe = fx.recipe.clone();
    recipe.nodes.push(symlink_node(b"link", &fx.outside));
    recipe.nodes.push(fx.file_node(b"link/evil"));
    let stored = fx.store(&recipe);
    let target = fx.target("t");
    let r = restore(&fx.repo, &fx.snapshot, &stored, &opts(&target));
    assert!(r.is_err(), "restore through a symlink succeeded");
    fx.assert_outside_untouched();

    // Directory below the symlink, and the symlink sorted after its child.
    let mut recipe = fx.recipe.clone();
    recipe.nodes.push(bare_node(b"zlink/sub", NodeKind::Dir));
    recipe.nodes.push(fx.file_node(b"zlink/sub/evil"));
    recipe.nodes.push(symlink_node(b"zlink", &fx.outside));
    let stored = fx.store(&recipe);
    let target = fx.target("t2");
    assert!(restore(&fx.repo, &fx.snapshot, &stored, &opts(&target)).is_err());
    fx.assert_outside_untouched();
    assert!(!fx.outside.join("sub").exists());
}

#[test]
fn existing_symlink_in_the_target_is_not_followed() {
    let fx = fixture();
    let target = fx.target("t");
    // First restore: a recipe that only plants a symlink (legitimate on
    // its own: symlinks may point anywhere).
    let mut plant = fx.recipe.clone();
    plant.nodes.push(symlink_node(b"link", &fx.outside));
    restore(&fx.repo, &fx.snapshot, &fx.store(&plant), &opts(&target)).unwrap();
    assert!(fs::symlink_metadata(target.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());

    // Second restore into the same target writes through it.
    for (i, nodes) in [
        vec![fx.file_node(b"link/evil")],
        vec![
            bare_node(b"link", NodeKind::Dir),
            fx.file_node(b"link/evil"),
        ],
        vec![bare_node(b"link/evil", NodeKind::Dir)],
    ]
    .into_iter()
    .enumerate()
    {
        let mut recipe = fx.recipe.clone();
        recipe.nodes.extend(nodes);
        let r = restore(&fx.repo, &fx.snapshot, &fx.store(&recipe), &opts(&target));
        assert!(
            r.is_err(),
            "case {i}: restore through a planted symlink succeeded"
        );
        fx.assert_outside_untouched();
    }
    // A file of the symlink's name replaces the symlink (a name is
    // replaced, never written through).
    let mut recipe = fx.recipe.clone();
    recipe.nodes.push(fx.file_node(b"link"));
    restore(&fx.repo, &fx.snapshot, &fx.store(&recipe), &opts(&target)).unwrap();
    assert!(fs::symlink_metadata(target.join("link"))
        .unwrap()
        .file_type()
        .is_file());
    fx.assert_outside_untouched();
}

#[test]
fn hardlink_targets_are_checked() {
    let fx = fixture();
    let victim = fx.base.join("victim");
    fs::write(&victim, b"secret").unwrap();
    for (i, t) in [
        b"../victim".to_vec(),
        victim.as_os_str().as_bytes().to_vec(),
        b"a/../../victim".to_vec(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut recipe = fx.recipe.clone();
        recipe.nodes.push(Node {
            target: Some(t),
            ..bare_node(b"evil", NodeKind::Hardlink)
        });
        let target = fx.target(&format!("h{i}"));
        let r = restore(&fx.repo, &fx.snapshot, &fx.store(&recipe), &opts(&target));
        assert!(
            matches!(r, Err(StoreError::UnsafePath(_))),
            "case {i}: hard link to a path outside the target was not refused"
        );
        assert!(!target.join("evil").exists());
        assert_eq!(fs::read(&victim).unwrap(), b"secret");
    }
}

/// The metadata pass sets permissions with `chmod`, which follows
/// symlinks. A special-file node whose `mknod` fails (here: its mode has
/// the directory type bits, so mknod returns EPERM/EINVAL), followed by a
/// symlink node with the same path pointing outside, makes restore chmod
/// the symlink's target.
#[test]
fn metadata_pass_does_not_follow_symlinks() {
    let fx = fixture();
    let victim = fx.outside.join("victim");
    fs::write(&victim, b"secret").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();

    let mut recipe = fx.recipe.clone();
    recipe.nodes.push(Node {
        mode: 0o040777,
        ..bare_node(b"p", NodeKind::Fifo)
    });
    recipe.nodes.push(symlink_node(b"p", &victim));
    // A recipe naming one path twice no longer loads from a repository…
    let (rid, _) = fx
        .repo
        .put_struct(Kind::Recipe, "recipes", &recipe)
        .unwrap();
    let rid = RecipeId::parse(&rid).unwrap();
    let e = fx.repo.load_recipe(&rid).unwrap_err().to_string();
    assert!(e.contains("appears twice"), "{e}");
    // …and restore, handed one anyway, still does not follow the link.
    let target = fx.target("t");
    let r = restore(&fx.repo, &fx.snapshot, &recipe, &opts(&target));
    let mode = fs::metadata(&victim).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        mode,
        0o600,
        "restore (result: {:?}) changed the mode of a file outside the target to {mode:o}",
        r.map(|r| r.warnings)
    );
}

/// Same bug without a crafted mode: a fifo node restored into a target in
/// which a symlink of that name already exists.
#[test]
fn metadata_pass_does_not_follow_existing_symlink() {
    let fx = fixture();
    let victim = fx.outside.join("victim");
    fs::write(&victim, b"secret").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    let target = fx.target("t");
    std::os::unix::fs::symlink(&victim, target.join("p")).unwrap();

    let mut recipe = fx.recipe.clone();
    recipe.nodes.push(Node {
        mode: 0o010777,
        ..bare_node(b"p", NodeKind::Fifo)
    });
    let r = restore(&fx.repo, &fx.snapshot, &fx.store(&recipe), &opts(&target));
    let mode = fs::metadata(&victim).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        mode,
        0o600,
        "restore (result: {:?}) changed the mode of a file outside the target to {mode:o}",
        r.map(|r| r.warnings)
    );
}

/// Archival chains read from a crafted repository: one that loops back
/// (any bytes can sit under any snapshot name), one into a missing
/// version, and one through a version that lacks the chunks all end in an
/// error naming the problem — never a hang, a panic or wrong data.
#[test]
fn crafted_archival_chains_end_in_an_error() {
    let fx = fixture();
    let mut recipe = fx.recipe.clone();
    for c in recipe
        .nodes
        .iter_mut()
        .flat_map(|n| n.segments.iter_mut())
        .flat_map(|s| s.chunks.iter_mut())
    {
        c.container = INDIRECT_CHUNK;
    }
    let (rid, _) = fx
        .repo
        .put_struct(Kind::Recipe, "recipes", &recipe)
        .unwrap();
    let rid = RecipeId::parse(&rid).unwrap();
    let snap = |next: &SnapshotId, version| Snapshot {
        recipe: rid.clone(),
        series: "evil".into(),
        version,
        archival: Some(Archival {
            next: Some(next.clone()),
            ..Default::default()
        }),
        ..fx.snapshot.clone()
    };
    let put = |s: &Snapshot| fx.repo.put_snapshot(s).unwrap();
    // A → FAKE, and the object named FAKE is B → A.
    let fake = SnapshotId::parse(&"ab".repeat(32)).unwrap();
    let a = put(&snap(&fake, 1));
    let b = put(&snap(&a, 2));
    // B's object copied under FAKE's name is refused (bound to its
    // name), so FAKE is written as B's content under its own name.
    let bytes = fx.repo.backend().get(&format!("snapshots/{b}")).unwrap();
    fx.repo
        .backend()
        .put(&format!("snapshots/{fake}"), &bytes)
        .unwrap();
    assert!(matches!(
        fx.repo.load_snapshot(&fake),
        Err(StoreError::Corrupt { .. })
    ));
    fx.repo.replace_snapshot(&fake, &snap(&a, 2)).unwrap();
    // C → a missing version; D → the original backup, which holds the
    // chunks (the one chain that works); E → D's own indirect recipe.
    let c = put(&snap(&SnapshotId::parse(&"cd".repeat(32)).unwrap(), 3));
    let cases = [
        (&a, "loops"),
        (&b, "loops"),
        (&fake, "loops"),
        (&c, "is missing"),
    ];
    for (i, (id, want)) in cases.into_iter().enumerate() {
        let s = fx.repo.load_snapshot(id).unwrap();
        let target = fx.target(&format!("chain{i}"));
        let e = restore(&fx.repo, &s, &recipe, &opts(&target))
            .err()
            .unwrap_or_else(|| panic!("restore through chain {i} ({id}) succeeded"))
            .to_string();
        assert!(
            e.contains("broken chain") && e.contains(want),
            "chain {i}: {e}"
        );
    }
    let orig = put(&fx.snapshot);
    let d = snap(&orig, 4);
    let target = fx.target("chain-ok");
    restore(&fx.repo, &d, &recipe, &opts(&target)).unwrap();
    fx.assert_outside_untouched();
}

/// Names that are not UTF-8 inside a snapshot, and the same container
/// listed twice by the index, read from a crafted repository: the first is
/// refused naming the object (and reported by check), the second is
/// harmless (check is clean, restore works).
#[test]
fn bad_utf8_and_duplicate_ids() {
    let fx = fixture();
    // A snapshot whose series is not UTF-8.
    let snap = Snapshot {
        series: "QQQQQQQQ".into(),
        ..fx.snapshot.clone()
    };
    let mut plain = strata_core::format::encode_snapshot(&snap).unwrap();
    let at = plain
        .windows(8)
        .position(|w| w == b"QQQQQQQQ")
        .expect("series in the encoding");
    plain[at..at + 8].copy_from_slice(&[0xff, 0xfe, 0xc0, 0x80, 0xed, 0xa0, 0x80, 0xff]);
    let id = SnapshotId::parse(&"5e".repeat(32)).unwrap();
    let env = fx
        .repo
        .sealer()
        .seal_named(Kind::Snapshot, &id.object_name(), &plain, true)
        .unwrap();
    fx.repo
        .backend()
        .put(&format!("snapshots/{id}"), &env)
        .unwrap();
    let e = fx.repo.load_snapshot(&id).unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt { name, .. } if name.contains(id.as_str())),
        "{e:?}"
    );
    let rep = strata_store::ops::check::check(&fx.repo, &Default::default()).unwrap();
    assert!(
        rep.errors.iter().any(|e| e.contains(id.as_str())),
        "{:?}",
        rep.errors
    );
    assert_eq!(rep.damaged_snapshots, vec![id.to_string()]);
    fx.repo
        .backend()
        .delete(&format!("snapshots/{id}"))
        .unwrap();

    // The index lists a container twice (in one object and in a second).
    let cid = fx.recipe.containers[0];
    let meta = strata_store::repo::container::read_meta(&fx.repo, &cid).unwrap();
    let twice = strata_core::format::IndexObject {
        containers: vec![meta.clone(), meta],
    };
    let bytes = strata_core::format::encode_index_object(&twice).unwrap();
    fx.repo.put_encoded(Kind::Index, "index", &bytes).unwrap();
    let rep = strata_store::ops::check::check(
        &fx.repo,
        &strata_store::ops::check::CheckOptions {
            read_data: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    let target = fx.target("dup");
    restore(&fx.repo, &fx.snapshot, &fx.recipe, &opts(&target)).unwrap();
    fx.assert_outside_untouched();
}

/// `check --read-data` reports what restore would refuse: a recipe entry
/// whose path (or hard link target) is absolute, climbs out with `..`, or
/// holds a NUL (issue 40 item 5).
#[test]
fn check_reports_paths_restore_refuses() {
    let cases: [(&[u8], Option<&[u8]>); 4] = [
        (b"../evil", None),
        (b"/abs/evil", None),
        (b"a/\0/evil", None),
        (b"fine-link", Some(b"../../victim")),
    ];
    for (path, link_to) in cases {
        let fx = fixture();
        let what = String::from_utf8_lossy(path).into_owned();
        let clean = strata_store::ops::check::check_ok(&fx.repo, true).unwrap();
        assert!(clean.errors.is_empty(), "{what}: {:?}", clean.errors);
        let mut recipe = fx.recipe.clone();
        recipe.nodes.push(match link_to {
            None => fx.file_node(path),
            Some(t) => Node {
                target: Some(t.to_vec()),
                ..bare_node(path, NodeKind::Hardlink)
            },
        });
        fx.store(&recipe);
        let opts = strata_store::ops::check::CheckOptions {
            read_data: true,
            ..Default::default()
        };
        let rep = strata_store::ops::check::check(&fx.repo, &opts).unwrap();
        assert!(
            rep.errors.iter().any(|e| e.contains("could reach outside")),
            "{what}: check passed a path restore refuses: {:?}",
            rep.errors
        );
    }
}
