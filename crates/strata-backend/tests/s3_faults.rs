//! The S3 backend behind a fault-injecting proxy in front of a real S3
//! server (versitygw, `STRATA_TEST_S3`): throttling (503 SlowDown),
//! uploads and downloads cut mid-way and a server that is gone. Every
//! operation either succeeds whole (after retries) or fails with a clear
//! transient error; no partial object is ever visible.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_backend::fault_proxy::{FaultProxy, Faults};
use strata_backend::location::S3Location;
use strata_backend::s3::{S3Backend, S3Credentials, S3Options};
use strata_backend::{conformance, Backend, ErrorKind};

fn upstream() -> Option<String> {
    match std::env::var("STRATA_TEST_S3") {
        Ok(e) if !e.is_empty() => Some(e.trim_start_matches("http://").to_string()),
        _ => {
            eprintln!("STRATA_TEST_S3 is not set: skipping (scripts/test starts an S3 server)");
            None
        }
    }
}

fn backend(endpoint: &str, prefix: &str, retries: usize) -> S3Backend {
    let loc = S3Location::new("strata-faults", prefix, Some(endpoint.into()));
    let creds = S3Credentials {
        access_key_id: Some("strata".into()),
        secret_access_key: Some("strata-secret".into()),
        session_token: None,
    };
    let opts = S3Options {
        max_retries: retries,
        retry_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(20),
        // Small parts: the suite's 12 MiB stream goes up as a multipart
        // upload the proxy cuts.
        part_size: strata_backend::s3::MIN_PART as usize,
        ..Default::default()
    };
    S3Backend::open(&loc, &creds, opts).unwrap()
}

#[test]
fn throttling_and_dropped_connections_are_survived() {
    let Some(up) = upstream() else { return };
    let proxy = FaultProxy::start(&up).unwrap();
    let b = backend(&proxy.endpoint(), "flaky", 10);
    b.ensure_bucket().unwrap();
    proxy.set(Faults {
        slow_down_every: 3,
        cut_upload_every: 2,
        cut_upload_after: 50_000,
        cut_download_every: 2,
        cut_download_after: 50_000,
        ..Default::default()
    });
    // As the CLI stacks it: object_store's own retries inside, and the
    // `Retry` wrapper for what they do not cover (a response body cut
    // after its headers, as MinIO's longer listings are here).
    let b: Arc<dyn Backend> = Arc::new(strata_backend::wrap::Retry::new(Arc::new(b)));
    if let Err(e) = conformance::run(b.clone()) {
        panic!("through the faulty proxy: {e} ({:?})", proxy.injected());
    }
    let i = proxy.injected();
    // Which connections carry big responses depends on how the server
    // keeps them alive (versitygw: cuts both ways; MinIO reuses more and
    // may see only cut uploads), so at least one cut of either kind.
    assert!(
        i.slow_downs > 0 && i.cut_uploads + i.cut_downloads > 0,
        "faults were injected: {i:?}"
    );
}

/// Clients creating one bucket at once all get it (a server may fail
/// some of the simultaneous creations: they are retried after a check);
/// a server that throttles a while is waited for; one that answers every
/// request with 503 gives a transient error in bounded time.
#[test]
fn a_bucket_created_by_several_clients_at_once() {
    let Some(up) = upstream() else { return };
    let bucket = format!("strata-race-{}", std::process::id());
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (up, bucket) = (up.clone(), bucket.clone());
            std::thread::spawn(move || {
                let loc = S3Location::new(&bucket, "p", Some(format!("http://{up}")));
                let creds = S3Credentials {
                    access_key_id: Some("strata".into()),
                    secret_access_key: Some("strata-secret".into()),
                    session_token: None,
                };
                S3Backend::open(&loc, &creds, S3Options::default())
                    .unwrap()
                    .ensure_bucket()
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    // Throttled at first, then not: the bucket is made after retries.
    let proxy = FaultProxy::start(&up).unwrap();
    let b = backend(&proxy.endpoint(), "throttled", 0);
    proxy.set(Faults {
        slow_down_next: 3,
        ..Default::default()
    });
    b.ensure_bucket().unwrap();
    assert_eq!(proxy.injected().slow_downs, 3);
    // Throttled for good: a transient error, soon.
    proxy.set(Faults {
        slow_down_every: 1,
        ..Default::default()
    });
    let t = Instant::now();
    let e = S3Backend::ensure_bucket(&b).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("503"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn a_server_that_is_gone_fails_clearly_and_comes_back() {
    let Some(up) = upstream() else { return };
    let proxy = FaultProxy::start(&up).unwrap();
    let b = backend(&proxy.endpoint(), "gone", 2);
    b.ensure_bucket().unwrap();
    b.put("kept", b"before").unwrap();
    proxy.set(Faults {
        down: true,
        ..Default::default()
    });
    let t = Instant::now();
    let e = b.put("lost", b"during").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let e = b.get("kept").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    proxy.set(Faults::default());
    assert_eq!(b.get("kept").unwrap(), b"before");
    // The failed put left nothing.
    assert!(b.size("lost").unwrap().is_none());
    b.delete("kept").unwrap();
}

/// `?addressing=virtual`: the bucket goes in the host name
/// (`strata-vhost.localhost`), as on AWS. The name need not resolve here:
/// requests go through an HTTP proxy on loopback (the fault proxy, passing
/// bytes through) to the server, which routes by the Host header
/// (`scripts/s3-server` starts versitygw with `--virtual-domain`).
#[test]
fn virtual_hosted_addressing_reaches_the_same_bucket() {
    let Some(up) = upstream() else { return };
    let Ok(domain) = std::env::var("STRATA_TEST_S3_VHOST") else {
        eprintln!("STRATA_TEST_S3_VHOST is not set: skipping (the server has no virtual domain)");
        return;
    };
    let port = up.rsplit(':').next().unwrap_or_default();
    let proxy = FaultProxy::start(&up).unwrap();
    let mut loc = S3Location::new("strata-vhost", "v", Some(format!("http://{domain}:{port}")));
    loc.addressing = Some(true);
    let creds = S3Credentials {
        access_key_id: Some("strata".into()),
        secret_access_key: Some("strata-secret".into()),
        session_token: None,
    };
    let opts = S3Options {
        max_retries: 1,
        proxy_url: Some(proxy.endpoint()),
        ..Default::default()
    };
    let b = S3Backend::open(&loc, &creds, opts).unwrap();
    b.ensure_bucket().unwrap();
    conformance::run(Arc::new(b)).unwrap();
    let b = S3Backend::open(
        &loc,
        &creds,
        S3Options {
            proxy_url: Some(proxy.endpoint()),
            ..Default::default()
        },
    )
    .unwrap();
    b.put("seen-both-ways", b"virtual").unwrap();
    // Path-style, straight to the server: the same bucket and object.
    let loc = S3Location::new("strata-vhost", "v", Some(format!("http://{up}")));
    let p = S3Backend::open(&loc, &creds, S3Options::default()).unwrap();
    assert_eq!(p.get("seen-both-ways").unwrap(), b"virtual");
    p.delete("seen-both-ways").unwrap();
    // An address cannot carry a bucket name.
    let mut ip = S3Location::new("strata-vhost", "v", Some(format!("http://{up}")));
    ip.addressing = Some(true);
    let e = S3Backend::open(&ip, &creds, S3Options::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("addressing=path"), "{e}");
}
