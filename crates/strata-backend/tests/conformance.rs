//! Every backend passes the same conformance checks: local, in-memory, the
//! wrappers, and a real S3 server (versitygw, started by `scripts/test`,
//! which sets `STRATA_TEST_S3` to its endpoint).

use std::sync::Arc;
use strata_backend::location::S3Location;
use strata_backend::s3::{S3Backend, S3Credentials, S3Options};
use strata_backend::wrap::{Limit, Retry};
use strata_backend::{conformance, Backend, ErrorKind, LocalBackend, MemoryBackend};

fn pass(b: Arc<dyn Backend>) {
    if let Err(e) = conformance::run(b.clone()) {
        panic!("{}: {e}", b.describe());
    }
}

#[test]
fn local_directory() {
    let d = tempfile::tempdir().unwrap();
    pass(Arc::new(LocalBackend::new(d.path())));
    // Nothing outside the root was touched, and no temporary file is left.
    let left: Vec<_> = walk(d.path());
    assert!(left.iter().all(|p| !p.contains(".tmp-")), "{left:?}");
}

fn walk(p: &std::path::Path) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(p).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path().display().to_string());
        }
    }
    out
}

#[test]
fn memory() {
    pass(Arc::new(MemoryBackend::new()));
}

#[test]
fn wrapped() {
    let inner: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    pass(Arc::new(Limit::new(Arc::new(Retry::new(inner)), 4)));
}

/// The S3 server of the test run, if there is one.
pub fn s3_endpoint() -> Option<String> {
    match std::env::var("STRATA_TEST_S3") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            eprintln!(
                "STRATA_TEST_S3 is not set: skipping the S3 checks (scripts/test starts a server)"
            );
            None
        }
    }
}

fn creds() -> S3Credentials {
    S3Credentials {
        access_key_id: Some(std::env::var("STRATA_TEST_S3_KEY").unwrap_or("strata".into())),
        secret_access_key: Some(
            std::env::var("STRATA_TEST_S3_SECRET").unwrap_or("strata-secret".into()),
        ),
        session_token: None,
    }
}

fn s3(endpoint: &str, bucket: &str, prefix: &str, creds: &S3Credentials) -> S3Backend {
    let loc = S3Location::new(bucket, prefix, Some(endpoint.into()));
    let opts = S3Options {
        max_retries: 1,
        ..Default::default()
    };
    S3Backend::open(&loc, creds, opts).unwrap()
}

#[test]
fn s3_bucket() {
    let Some(ep) = s3_endpoint() else { return };
    let b = s3(&ep, "strata-conformance", "some/prefix", &creds());
    b.ensure_bucket().unwrap();
    b.ensure_bucket().unwrap();
    assert!(b.bucket_exists().unwrap());
    pass(Arc::new(b));
    // At the bucket's root too.
    let b = s3(&ep, "strata-conformance", "", &creds());
    pass(Arc::new(b));
    // With SigV4 signing the bodies' hashes (`?payload=signed`; the
    // default above sends them unsigned) and with the smallest parts, so
    // the suite's 12 MiB stream is a multipart upload (the default 32 MiB
    // part sends it as one PUT).
    let mut loc = S3Location::new("strata-conformance", "signed", Some(ep.clone()));
    loc.signed_payload = Some(true);
    let opts = S3Options {
        max_retries: 1,
        part_size: strata_backend::s3::MIN_PART as usize,
        ..Default::default()
    };
    pass(Arc::new(S3Backend::open(&loc, &creds(), opts).unwrap()));
}

#[test]
fn s3_errors_are_clear() {
    let Some(ep) = s3_endpoint() else { return };
    let b = s3(&ep, "strata-no-such-bucket", "", &creds());
    assert!(!b.bucket_exists().unwrap());
    let e = b.get("config").unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    let wrong = S3Credentials {
        access_key_id: Some("strata".into()),
        secret_access_key: Some("wrong".into()),
        session_token: None,
    };
    let b = s3(&ep, "strata-conformance", "", &wrong);
    let e = b.put("x", b"y").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permission, "{e}");
    let e = b.bucket_exists().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permission, "{e}");
    // Nothing listening.
    let b = s3("http://127.0.0.1:9", "strata-conformance", "", &creds());
    let e = b.get("config").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
}

/// Objects assembled in the bucket from ranges of others (UploadPartCopy)
/// and bytes from here: what the cloud tier's cleaning does without
/// downloading.
#[test]
fn s3_server_side_assembly() {
    use strata_backend::s3::{CopyPart, MIN_PART};
    let Some(ep) = s3_endpoint() else { return };
    let b = s3(&ep, "strata-conformance", "assemble", &creds());
    b.ensure_bucket().unwrap();
    let a: Vec<u8> = (0..(6u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let c: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 13 % 241) as u8).collect();
    b.put("src/a", &a).unwrap();
    b.put("src/c", &c).unwrap();
    let copy = |s: &str, o: u64, l: u64| CopyPart::Copy {
        source: s.into(),
        offset: o,
        len: l,
    };
    b.assemble_by_copy(
        "out/one",
        &[
            copy("src/a", 1 << 20, MIN_PART),
            CopyPart::Data(b"end".to_vec()),
        ],
    )
    .unwrap();
    let mut want = a[1 << 20..(1 << 20) + MIN_PART as usize].to_vec();
    want.extend_from_slice(b"end");
    assert!(b.get("out/one").unwrap() == want, "assembled bytes");
    // The last part may be a small copy.
    b.assemble_by_copy(
        "out/four",
        &[copy("src/a", 0, MIN_PART + 1), copy("src/c", 10, 100)],
    )
    .unwrap();
    let mut want = a[..MIN_PART as usize + 1].to_vec();
    want.extend_from_slice(&c[10..110]);
    assert!(b.get("out/four").unwrap() == want, "assembled bytes");
    b.delete("out/four").unwrap();
    // A small part before the last is refused before anything is sent.
    let e = b
        .assemble_by_copy(
            "out/two",
            &[copy("src/c", 0, 100), CopyPart::Data(b"x".to_vec())],
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
    // A missing source: an error, and no object.
    assert!(b
        .assemble_by_copy(
            "out/three",
            &[copy("src/none", 0, MIN_PART), CopyPart::Data(b"x".to_vec())]
        )
        .is_err());
    assert!(b.size("out/three").unwrap().is_none());
    for n in ["src/a", "src/c", "out/one"] {
        b.delete(n).unwrap();
    }
}

/// A writer killed in the middle of a multipart upload leaves the upload
/// in the bucket, unseen by listings; the sweep gc runs aborts those begun
/// long enough ago — of a data container under this backend's prefix only
/// (not another repository's, nor another program's upload).
#[test]
fn s3_sweep_aborts_unfinished_uploads() {
    use std::time::Duration;
    let Some(ep) = s3_endpoint() else { return };
    let opts = || S3Options {
        max_retries: 1,
        part_size: strata_backend::s3::MIN_PART as usize,
        ..Default::default()
    };
    let loc = |prefix: &str| S3Location::new("strata-conformance", prefix, Some(ep.clone()));
    let b = S3Backend::open(&loc("sweep/mine"), &creds(), opts()).unwrap();
    b.ensure_bucket().unwrap();
    // Another repository's in the same bucket, its prefix a longer name.
    let other = S3Backend::open(&loc("sweep/mine-too"), &creds(), opts()).unwrap();
    let begin = |b: &S3Backend, name: &str| {
        let mut w = b.stream(name).unwrap().unwrap();
        // One whole part sent, the next being filled: then the process
        // "dies" (the writer is never finished nor dropped).
        w.write(&vec![7u8; strata_backend::s3::MIN_PART as usize + 10])
            .unwrap();
        std::mem::forget(w);
    };
    const MINE: &str = "data/ab/ab0123456789abcdef0123456789abcd";
    const THEIRS: &str = "data/cd/cd0123456789abcdef0123456789abcd";
    // (Uploads left by an earlier run of this test that died half-way:
    // swept first.)
    b.sweep_temporaries(Duration::ZERO).unwrap();
    other.sweep_temporaries(Duration::ZERO).unwrap();
    let before = b.multipart_uploads().unwrap().len();
    begin(&b, MINE);
    begin(&b, "videos/not-ours.mp4");
    begin(&other, THEIRS);
    let wait = std::time::Instant::now();
    while b.multipart_uploads().unwrap().len() < before + 2 && wait.elapsed().as_secs() < 10 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mine = b.multipart_uploads().unwrap();
    assert_eq!(mine.len(), before + 2, "{mine:?}");
    assert!(
        mine.iter().any(|u| u.key == format!("sweep/mine/{MINE}")),
        "{mine:?}"
    );
    assert!(b.list("data/").unwrap().is_empty());
    // Too fresh for an hour's age: kept.
    let s = b.sweep_temporaries(Duration::from_secs(3600)).unwrap();
    assert_eq!(s.files, 0);
    assert_eq!(b.multipart_uploads().unwrap().len(), before + 2);
    // Any age: the container's aborted; the other program's upload and
    // the other prefix's are left alone.
    assert_eq!(b.sweep_temporaries(Duration::ZERO).unwrap().files, 1);
    let left = b.multipart_uploads().unwrap();
    assert_eq!(left.len(), before + 1, "{left:?}");
    assert!(!left.iter().any(|u| u.key.ends_with(MINE)), "{left:?}");
    assert!(other
        .multipart_uploads()
        .unwrap()
        .iter()
        .any(|u| u.key.ends_with(THEIRS)));
    assert_eq!(other.sweep_temporaries(Duration::ZERO).unwrap().files, 1);
    // (The other program's upload, aborted by hand.)
    for u in b.multipart_uploads().unwrap() {
        assert!(b.abort_upload(&u).unwrap());
    }
    assert!(b.multipart_uploads().unwrap().is_empty());
}
