//! An S3-compatible bucket as a backend, on `object_store` (Apache Arrow's
//! object-store client): path-style addressing for a named endpoint and
//! virtual-hosted for AWS unless `?addressing=` says otherwise,
//! credentials given by the caller (the CLI reads the usual AWS variables
//! and profile), objects up to 32 MiB (a container) as one PUT and larger
//! ones streamed as multipart uploads (32 MiB parts, two in flight; one
//! PUT saves the server from assembling parts — a fifth of its CPU on a
//! first backup), `UNSIGNED-PAYLOAD` unless `?payload=signed`, ranged
//! GETs read straight into one buffer, and `object_store`'s own retries
//! of throttling, 5xx and dropped connections. The backend's calls are synchronous: each
//! runs on a small Tokio runtime the backend owns. gc's sweep of what
//! killed writers left aborts the multipart uploads of data containers
//! under the prefix begun more than 10 minutes before (`ListMultipartUploads`, signed by
//! hand as the bucket requests are; `AbortMultipartUpload`).

use crate::location::S3Location;
use crate::object::{
    check_name, check_prefix, Backend, BackendError, ErrorKind, ObjectInfo, ObjectWriter, Result,
};
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::signer::Signer;
use object_store::{
    ClientOptions, GetOptions, GetRange, MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};
use std::sync::Arc;
use std::time::Duration;

/// Credentials for a bucket; `None` fields are left unset (anonymous
/// access when all are).
#[derive(Clone, Default)]
pub struct S3Credentials {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "…"),
            )
            .finish()
    }
}

impl S3Credentials {
    /// The credentials of `[profile]` in the text of an AWS shared
    /// credentials file (INI: `key = value` lines, `#`/`;` comments);
    /// `None` when the file has no such profile.
    pub fn from_profile(text: &str, profile: &str) -> Option<Self> {
        let mut found: Option<Vec<(&str, &str)>> = None;
        let mut current = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                current = Some(name.trim());
                if current == Some(profile) {
                    found.get_or_insert_with(Vec::new);
                }
                continue;
            }
            if current == Some(profile) {
                if let (Some(v), Some((k, val))) = (found.as_mut(), line.split_once('=')) {
                    v.push((k.trim(), val.trim()));
                }
            }
        }
        let pairs = found?;
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        Some(S3Credentials {
            access_key_id: get("aws_access_key_id"),
            secret_access_key: get("aws_secret_access_key"),
            session_token: get("aws_session_token"),
        })
    }
}

/// How the backend talks to the server.
#[derive(Clone, Debug)]
pub struct S3Options {
    /// Attempts `object_store` makes before an error is returned.
    pub max_retries: usize,
    /// Give up retrying after this long.
    pub retry_timeout: Duration,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Bytes per multipart part (at least 5 MiB, S3's minimum).
    pub part_size: usize,
    /// An HTTP proxy for every request (else the system's `HTTP(S)_PROXY`
    /// settings, as `reqwest` reads them).
    pub proxy_url: Option<String>,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            max_retries: 6,
            retry_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(120),
            part_size: 32 << 20,
            proxy_url: None,
        }
    }
}

pub struct S3Backend {
    store: Arc<AmazonS3>,
    rt: Arc<tokio::runtime::Runtime>,
    loc: S3Location,
    opts: S3Options,
}

/// The S3 error code in a server's XML answer (`<Code>…</Code>`).
fn s3_code(m: &str) -> Option<&str> {
    let start = m.find("<Code>")? + "<Code>".len();
    let len = m[start..].find("</Code>")?;
    Some(&m[start..start + len])
}

/// Classifies an `object_store` error and says it in one line.
fn map_err(op: &'static str, name: &str, e: object_store::Error) -> BackendError {
    use object_store::Error as E;
    let full = e.to_string();
    let code = s3_code(&full).map(str::to_string);
    let status = full
        .split("status code: ")
        .nth(1)
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse::<u16>().ok());
    let kind = match (&e, code.as_deref(), status) {
        (E::NotFound { .. }, Some("NoSuchBucket"), _) | (_, Some("NoSuchBucket"), _) => {
            ErrorKind::NotFound
        }
        (E::NotFound { .. }, _, _) => ErrorKind::NotFound,
        (E::PermissionDenied { .. } | E::Unauthenticated { .. }, _, _) => ErrorKind::Permission,
        (E::InvalidPath { .. }, _, _) => ErrorKind::Invalid,
        (_, Some("AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch"), _)
        | (_, _, Some(401 | 403)) => ErrorKind::Permission,
        (_, Some("InvalidRange"), _) | (_, _, Some(416)) => ErrorKind::Corrupt,
        (_, Some("SlowDown" | "InternalError" | "ServiceUnavailable"), _)
        | (_, _, Some(500..=599 | 429)) => ErrorKind::Transient,
        (E::Generic { .. }, None, None) => ErrorKind::Transient,
        _ => ErrorKind::Other,
    };
    let message = match (kind, code.as_deref()) {
        (ErrorKind::NotFound, Some("NoSuchBucket")) => {
            "the bucket does not exist (`strata init` creates it)".to_string()
        }
        (ErrorKind::NotFound, _) => "no such object".to_string(),
        (ErrorKind::Permission, c) => format!(
            "access denied{}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the AWS profile",
            c.map(|c| format!(" ({c})")).unwrap_or_default()
        ),
        (_, Some(c)) => format!("the server answered {c}"),
        _ => {
            // The innermost cause (a refused connection, a timeout), not
            // object_store's request dump.
            let mut cause: &dyn std::error::Error = &e;
            while let Some(next) = cause.source() {
                cause = next;
            }
            let inner = cause.to_string();
            let inner = inner.lines().next().unwrap_or_default();
            if kind == ErrorKind::Transient {
                format!("cannot reach the server: {}", inner.chars().take(200).collect::<String>())
            } else {
                inner.chars().take(300).collect()
            }
        }
    };
    BackendError::new(kind, op, name, message)
}

/// `endpoint` with `bucket.` before its host: where a virtual-hosted
/// bucket of that service answers (`http://s3.example:9000` →
/// `http://bkt.s3.example:9000`).
fn bucket_host(endpoint: &str, bucket: &str) -> std::result::Result<String, String> {
    let mut url = url::Url::parse(endpoint).map_err(|e| format!("endpoint {endpoint:?}: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("endpoint {endpoint:?} has no host"))?;
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return Err(format!(
            "virtual-hosted addressing needs a host name, not the address {host}; \
             use addressing=path"
        ));
    }
    let with_bucket = format!("{bucket}.{host}");
    url.set_host(Some(&with_bucket))
        .map_err(|e| format!("endpoint {endpoint:?}: {e}"))?;
    Ok(url.as_str().trim_end_matches('/').to_string())
}

impl S3Backend {
    /// Connects to the bucket of `loc` (nothing is sent until the first
    /// operation).
    pub fn open(loc: &S3Location, creds: &S3Credentials, opts: S3Options) -> Result<Self> {
        let invalid =
            |m: String| BackendError::new(ErrorKind::Invalid, "open", loc.bucket.clone(), m);
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&loc.bucket)
            .with_region(loc.region.clone().unwrap_or_else(|| "us-east-1".into()))
            .with_virtual_hosted_style_request(loc.virtual_hosted())
            .with_unsigned_payload(!loc.signed_payload())
            .with_retry(RetryConfig {
                max_retries: opts.max_retries,
                retry_timeout: opts.retry_timeout,
                ..Default::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(true)
                    .with_connect_timeout(opts.connect_timeout)
                    .with_timeout(opts.request_timeout),
            );
        if let Some(p) = &opts.proxy_url {
            b = b.with_proxy_url(p);
        }
        if let Some(e) = &loc.endpoint {
            if loc.virtual_hosted() {
                // `object_store` takes the bucket's own host then.
                let url = bucket_host(e, &loc.bucket).map_err(invalid)?;
                b = b.with_endpoint(url);
            } else {
                b = b.with_endpoint(e);
            }
        }
        if let Some(k) = &creds.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &creds.secret_access_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(t) = &creds.session_token {
            b = b.with_token(t);
        }
        if creds.access_key_id.is_none() {
            b = b.with_skip_signature(true);
        }
        let store = b.build().map_err(|e| invalid(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("strata-s3")
            .enable_all()
            .build()
            .map_err(|e| invalid(format!("cannot start the S3 client: {e}")))?;
        Ok(S3Backend {
            store: Arc::new(store),
            rt: Arc::new(rt),
            loc: loc.clone(),
            opts,
        })
    }

    fn key(&self, name: &str) -> Key {
        if self.loc.prefix.is_empty() {
            Key::from(name)
        } else {
            Key::from(format!("{}/{name}", self.loc.prefix))
        }
    }

    /// Our name of a key listed from the bucket.
    fn name_of(&self, key: &Key) -> String {
        let k = key.as_ref();
        if self.loc.prefix.is_empty() {
            k.to_string()
        } else {
            k.strip_prefix(&self.loc.prefix)
                .map(|r| r.trim_start_matches('/').to_string())
                .unwrap_or_else(|| k.to_string())
        }
    }

    /// Sends a request to the bucket itself (not an object), signed with
    /// the backend's credentials: `PUT` creates it, `HEAD` checks it.
    fn bucket_request(&self, method: http::Method) -> Result<u16> {
        let name = self.loc.bucket.clone();
        let store = self.store.clone();
        let m = method.clone();
        let proxy = self.opts.proxy_url.clone();
        self.rt.block_on(async move {
            let url = store
                .signed_url(m.clone(), &Key::from(""), Duration::from_secs(300))
                .await
                .map_err(|e| map_err("sign", &name, e))?;
            // The signed URL names the bucket with a trailing `/`.
            let mut client = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
            if let Some(p) = &proxy {
                let p = reqwest::Proxy::all(p).map_err(|e| {
                    BackendError::new(ErrorKind::Invalid, "connect", &name, e.to_string())
                })?;
                client = client.proxy(p);
            }
            let client = client.build().map_err(|e| {
                BackendError::new(ErrorKind::Other, "connect", &name, e.to_string())
            })?;
            let r = client.request(m, url.as_str()).send().await.map_err(|e| {
                BackendError::new(ErrorKind::Transient, "connect", &name, e.to_string())
            })?;
            Ok(r.status().as_u16())
        })
    }

    /// Whether the bucket exists (and these credentials can see it).
    pub fn bucket_exists(&self) -> Result<bool> {
        match self.bucket_request(http::Method::HEAD)? {
            200..=299 => Ok(true),
            404 => Ok(false),
            403 => Err(BackendError::new(
                ErrorKind::Permission,
                "open",
                &self.loc.bucket,
                "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile",
            )),
            s => Err(BackendError::new(
                ErrorKind::Other,
                "open",
                &self.loc.bucket,
                format!("the server answered {s} to a bucket check"),
            )),
        }
    }

    /// Creates the bucket unless it exists (as `restic init` does). A
    /// server error (5xx: throttling, or a server that fails when several
    /// clients create one bucket at once, as versitygw may) is retried a
    /// few times, with the check first: another client may have made it.
    pub fn ensure_bucket(&self) -> Result<()> {
        let mut wait = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            let status = match self.bucket_request(http::Method::HEAD)? {
                200..=299 => return Ok(()),
                404 => self.bucket_request(http::Method::PUT)?,
                s => s,
            };
            match status {
                200..=299 | 409 => return Ok(()),
                403 => return Err(BackendError::new(
                    ErrorKind::Permission,
                    "create bucket",
                    &self.loc.bucket,
                    "access denied: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile",
                )),
                500..=599 if tries < ENSURE_BUCKET_TRIES => {
                    tries += 1;
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                s => {
                    let kind = match s {
                        500..=599 => ErrorKind::Transient,
                        _ => ErrorKind::Other,
                    };
                    return Err(BackendError::new(
                        kind,
                        "create bucket",
                        &self.loc.bucket,
                        format!("the server answered {s}"),
                    ));
                }
            }
        }
    }

    pub fn location(&self) -> &S3Location {
        &self.loc
    }
}

/// Server errors `ensure_bucket` retries (50 ms, doubling: ~3 s in all).
const ENSURE_BUCKET_TRIES: u32 = 6;

impl Backend for S3Backend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        check_name("write", name)?;
        let payload = PutPayload::from(data.to_vec());
        self.rt
            .block_on(self.store.put(&self.key(name), payload))
            .map(|_| ())
            .map_err(|e| map_err("write", name, e))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        check_name("read", name)?;
        self.rt
            .block_on(async {
                let r = self.store.get(&self.key(name)).await?;
                let size = r.meta.size;
                collect(r, size).await
            })
            .map_err(|e| map_err("read", name, e))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        check_name("read", name)?;
        if len == 0 {
            return self
                .size(name)?
                .map(|_| Vec::new())
                .ok_or_else(|| BackendError::not_found("read", name));
        }
        let end = offset + len;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            ..Default::default()
        };
        let got = self
            .rt
            .block_on(async {
                let r = self.store.get_opts(&self.key(name), opts).await?;
                collect(r, len).await
            })
            .map_err(|e| map_err("read", name, e))?;
        if got.len() as u64 != len {
            return Err(BackendError::new(
                ErrorKind::Corrupt,
                "read",
                name,
                format!("object shorter than {end} bytes"),
            ));
        }
        Ok(got)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        check_prefix(prefix)?;
        let folder = prefix.trim_end_matches('/');
        let key = match (self.loc.prefix.is_empty(), folder.is_empty()) {
            (true, true) => None,
            (true, false) => Some(Key::from(folder)),
            (false, true) => Some(Key::from(self.loc.prefix.as_str())),
            (false, false) => Some(self.key(folder)),
        };
        let metas: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.store.list(key.as_ref()).try_collect())
            .map_err(|e| map_err("list", prefix, e))?;
        let mut out: Vec<ObjectInfo> = metas
            .into_iter()
            .map(|m| ObjectInfo {
                name: self.name_of(&m.location),
                size: m.size,
            })
            .filter(|o| check_name("list", &o.name).is_ok())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        check_name("delete", name)?;
        match self.rt.block_on(self.store.delete(&self.key(name))) {
            Ok(()) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err("delete", name, e)),
        }
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        check_name("stat", name)?;
        match self.rt.block_on(self.store.head(&self.key(name))) {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_err("stat", name, e)),
        }
    }

    fn stream(&self, name: &str) -> Result<Option<Box<dyn ObjectWriter>>> {
        check_name("write", name)?;
        Ok(Some(Box::new(S3Writer {
            store: self.store.clone(),
            rt: self.rt.clone(),
            key: self.key(name),
            name: name.to_string(),
            part_size: self.opts.part_size.max(5 << 20),
            buf: Vec::new(),
            upload: None,
            in_flight: Vec::new(),
            written: 0,
        })))
    }

    /// Aborts the multipart uploads under the backend's prefix begun
    /// more than `older_than` ago: what writers killed half-way (a
    /// container streamed in parts) leave in the bucket, out of sight of
    /// listings but stored — and billed — until aborted.
    fn sweep_temporaries(&self, older_than: Duration) -> Result<crate::object::Swept> {
        let mut swept = crate::object::Swept::default();
        let now = jiff::Timestamp::now();
        for u in self.multipart_uploads()? {
            // Only a repository's streamed objects, its data containers
            // (`data/XX/ID`): not another repository's below this prefix,
            // nor another program's.
            if !is_container_name(&self.name_of(&Key::from(u.key.as_str()))) {
                continue;
            }
            let old = u
                .initiated
                .parse::<jiff::Timestamp>()
                .ok()
                .and_then(|t| now.duration_since(t).try_into().ok())
                .is_some_and(|age: Duration| age >= older_than);
            if !old {
                continue;
            }
            if self.abort_upload(&u)? {
                swept.files += 1;
            }
        }
        Ok(swept)
    }

    fn describe(&self) -> String {
        match self.loc.prefix.as_str() {
            "" => format!("s3://{}", self.loc.bucket),
            p => format!("s3://{}/{p}", self.loc.bucket),
        }
    }
}

/// A response body gathered straight into one buffer of the expected
/// size (no intermediate `Bytes` to copy from).
async fn collect(r: object_store::GetResult, expected: u64) -> object_store::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(expected.min(1 << 30) as usize);
    let mut body = r.into_stream();
    while let Some(chunk) = body.try_next().await? {
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Parts of one object uploaded at once, at most.
const PARTS_IN_FLIGHT: usize = 2;

/// An object written as it is produced: a plain PUT when it stays below
/// one part, else a multipart upload whose parts go up while the next is
/// filled. Visible only once completed; dropped before, the upload is
/// aborted.
struct S3Writer {
    store: Arc<AmazonS3>,
    rt: Arc<tokio::runtime::Runtime>,
    key: Key,
    name: String,
    part_size: usize,
    buf: Vec<u8>,
    upload: Option<Box<dyn MultipartUpload>>,
    in_flight: Vec<tokio::task::JoinHandle<object_store::Result<()>>>,
    written: u64,
}

impl S3Writer {
    fn err(&self, e: object_store::Error) -> BackendError {
        map_err("write", &self.name, e)
    }

    /// Sends the buffer as the next part.
    fn send_part(&mut self) -> Result<()> {
        if self.upload.is_none() {
            let up = self
                .rt
                .block_on(self.store.put_multipart(&self.key))
                .map_err(|e| self.err(e))?;
            self.upload = Some(up);
        }
        while self.in_flight.len() >= PARTS_IN_FLIGHT {
            let h = self.in_flight.remove(0);
            self.join(h)?;
        }
        let data = std::mem::take(&mut self.buf);
        if let Some(up) = self.upload.as_mut() {
            let fut = up.put_part(PutPayload::from(data));
            self.in_flight.push(self.rt.spawn(fut));
        }
        Ok(())
    }

    fn join(&self, h: tokio::task::JoinHandle<object_store::Result<()>>) -> Result<()> {
        match self.rt.block_on(h) {
            Ok(r) => r.map_err(|e| self.err(e)),
            Err(e) => Err(BackendError::new(
                ErrorKind::Other,
                "write",
                &self.name,
                e.to_string(),
            )),
        }
    }
}

impl ObjectWriter for S3Writer {
    fn write(&mut self, mut data: &[u8]) -> Result<()> {
        self.written += data.len() as u64;
        while !data.is_empty() {
            let room = self.part_size - self.buf.len();
            let n = room.min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == self.part_size {
                self.send_part()?;
            }
        }
        Ok(())
    }

    fn written(&self) -> u64 {
        self.written
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        if self.upload.is_none() {
            let payload = PutPayload::from(std::mem::take(&mut self.buf));
            return self
                .rt
                .block_on(self.store.put(&self.key, payload))
                .map(|_| ())
                .map_err(|e| self.err(e));
        }
        if !self.buf.is_empty() {
            self.send_part()?;
        }
        for h in std::mem::take(&mut self.in_flight) {
            self.join(h)?;
        }
        let mut up = self.upload.take();
        let r = match up.as_mut() {
            Some(u) => self.rt.block_on(u.complete()).map(|_| ()),
            None => Ok(()),
        };
        if r.is_err() {
            self.upload = up;
        }
        r.map_err(|e| self.err(e))
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        for h in self.in_flight.drain(..) {
            h.abort();
        }
        if let Some(mut up) = self.upload.take() {
            let _ = self.rt.block_on(up.abort());
        }
    }
}

/// One part of an object assembled in the bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyPart {
    /// `len` bytes at `offset` of object `source`, copied by the server
    /// (`UploadPartCopy` with a source range): nothing downloaded.
    Copy {
        source: String,
        offset: u64,
        len: u64,
    },
    /// Bytes sent from here.
    Data(Vec<u8>),
}

/// Whether `name` (relative to a backend's prefix) is a data container's:
/// `data/XX/ID`, ID 32 lowercase hex digits beginning with XX — the only
/// objects a repository streams in parts.
fn is_container_name(name: &str) -> bool {
    let hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match name.split('/').collect::<Vec<_>>().as_slice() {
        ["data", xx, id] => xx.len() == 2 && id.len() == 32 && hex(id) && id.starts_with(xx),
        _ => false,
    }
}

/// A multipart upload in progress (`ListMultipartUploads`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    pub key: String,
    pub id: String,
    /// When it began (RFC 3339, as the server gives it).
    pub initiated: String,
}

/// The text of the first `<tag>…</tag>` in `xml`, XML entities decoded.
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{tag}>"))?;
    Some(
        xml[start..start + len]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// The uploads of one `ListMultipartUploads` answer, and the markers of the
/// next page if it is truncated.
fn parse_uploads(xml: &str) -> (Vec<Upload>, Option<(String, String)>) {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<Upload>") {
        let body = &rest[i..];
        let end = body
            .find("</Upload>")
            .map_or(body.len(), |e| e + "</Upload>".len());
        let u = &body[..end];
        if let (Some(key), Some(id)) = (xml_text(u, "Key"), xml_text(u, "UploadId")) {
            out.push(Upload {
                key,
                id,
                initiated: xml_text(u, "Initiated").unwrap_or_default(),
            });
        }
        rest = &body[end..];
    }
    let next = (xml_text(xml, "IsTruncated").as_deref() == Some("true"))
        .then(|| {
            Some((
                xml_text(xml, "NextKeyMarker")?,
                xml_text(xml, "NextUploadIdMarker")?,
            ))
        })
        .flatten();
    (out, next)
}

impl S3Backend {
    /// Aborts multipart upload `u` (from [`Self::multipart_uploads`]);
    /// false if it was gone already (completed or aborted meanwhile).
    pub fn abort_upload(&self, u: &Upload) -> Result<bool> {
        use object_store::multipart::MultipartStore;
        let key = Key::from(u.key.as_str());
        match self.rt.block_on(self.store.abort_multipart(&key, &u.id)) {
            Ok(()) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(map_err("delete", &u.key, e)),
        }
    }

    /// The multipart uploads in progress under the backend's prefix, every
    /// page of them.
    pub fn multipart_uploads(&self) -> Result<Vec<Upload>> {
        use object_store::signer::SignedUrlOptions;
        let prefix = match self.loc.prefix.as_str() {
            "" => String::new(),
            p => format!("{}/", p.trim_end_matches('/')),
        };
        let bucket = self.loc.bucket.clone();
        let fail = |kind, m: String| BackendError::new(kind, "list", &bucket, m);
        let mut all = Vec::new();
        let mut marker: Option<(String, String)> = None;
        loop {
            let mut q = vec![("uploads", String::new()), ("prefix", prefix.clone())];
            if let Some((k, u)) = &marker {
                q.push(("key-marker", k.clone()));
                q.push(("upload-id-marker", u.clone()));
            }
            let opts = SignedUrlOptions::new().with_query(q);
            let store = self.store.clone();
            let proxy = self.opts.proxy_url.clone();
            let (status, body) = self.rt.block_on(async move {
                let url = store
                    .signed_url_opts(
                        http::Method::GET,
                        &Key::from(""),
                        Duration::from_secs(300),
                        &opts,
                    )
                    .await
                    .map_err(|e| map_err("list", "multipart uploads", e))?;
                let mut client = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
                if let Some(p) = &proxy {
                    let p = reqwest::Proxy::all(p)
                        .map_err(|e| fail(ErrorKind::Invalid, e.to_string()))?;
                    client = client.proxy(p);
                }
                let client = client
                    .build()
                    .map_err(|e| fail(ErrorKind::Other, e.to_string()))?;
                let r = client
                    .get(url.as_str())
                    .send()
                    .await
                    .map_err(|e| fail(ErrorKind::Transient, e.to_string()))?;
                let status = r.status().as_u16();
                let body = r
                    .text()
                    .await
                    .map_err(|e| fail(ErrorKind::Transient, e.to_string()))?;
                Ok::<_, BackendError>((status, body))
            })?;
            if !(200..300).contains(&status) {
                let kind = match status {
                    403 => ErrorKind::Permission,
                    404 => ErrorKind::NotFound,
                    500.. => ErrorKind::Transient,
                    _ => ErrorKind::Other,
                };
                return Err(fail(
                    kind,
                    format!(
                        "listing multipart uploads: the server answered {status} {}",
                        s3_code(&body).unwrap_or("")
                    ),
                ));
            }
            let (page, next) = parse_uploads(&body);
            all.extend(page.into_iter().filter(|u| u.key.starts_with(&prefix)));
            match next {
                // (A server that does not move on would loop for ever.)
                Some(m) if marker.as_ref() != Some(&m) => marker = Some(m),
                _ => return Ok(all),
            }
        }
    }
}

/// S3's smallest multipart part (every part but the last).
pub const MIN_PART: u64 = 5 << 20;

impl S3Backend {
    /// Assembles object `dest` in the bucket from `parts` as one multipart
    /// upload — copied parts never leave the server. Every part but the
    /// last must hold at least [`MIN_PART`] bytes. The object appears whole
    /// or (on any error, the upload aborted) not at all.
    pub fn assemble_by_copy(&self, dest: &str, parts: &[CopyPart]) -> Result<()> {
        use object_store::multipart::MultipartStore;
        check_name("write", dest)?;
        check_parts(dest, parts)?;
        let key = self.key(dest);
        let store = self.store.clone();
        let r = self.rt.block_on(async {
            let id = store
                .create_multipart(&key)
                .await
                .map_err(|e| map_err("copy", dest, e))?;
            let upload = Assembly {
                backend: self,
                key: &key,
                id: &id,
                dest,
                client: reqwest::Client::new(),
            };
            let result: Result<()> = upload.parts(parts).await;
            if result.is_err() {
                let _ = store.abort_multipart(&key, &id).await;
            }
            result
        });
        r
    }
}

/// Checks the parts of object `dest` before anything is sent: none empty,
/// every one but the last at least [`MIN_PART`] bytes, sources named well.
fn check_parts(dest: &str, parts: &[CopyPart]) -> Result<()> {
    let bad = |m: String| BackendError::new(ErrorKind::Invalid, "copy", dest, m);
    for (i, p) in parts.iter().enumerate() {
        let len = match p {
            CopyPart::Copy { source, len, .. } => {
                check_name("copy", source)?;
                *len
            }
            CopyPart::Data(d) => d.len() as u64,
        };
        if i + 1 < parts.len() && len < MIN_PART {
            return Err(bad(format!(
                "part {i} holds {len} bytes, under S3's 5 MiB minimum"
            )));
        }
        if len == 0 {
            return Err(bad(format!("part {i} is empty")));
        }
    }
    Ok(())
}

/// A multipart upload (`id`) assembling object `dest` at `key`.
struct Assembly<'a> {
    backend: &'a S3Backend,
    key: &'a Key,
    id: &'a object_store::MultipartId,
    dest: &'a str,
    client: reqwest::Client,
}

impl Assembly<'_> {
    /// Sends or copies every part, in order, then completes the upload.
    async fn parts(&self, parts: &[CopyPart]) -> Result<()> {
        use object_store::multipart::MultipartStore;
        let (store, dest) = (&self.backend.store, self.dest);
        let mut ids = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            let pid = match p {
                CopyPart::Data(d) => store
                    .put_part(self.key, self.id, i, PutPayload::from(d.clone()))
                    .await
                    .map_err(|e| map_err("copy", dest, e))?,
                CopyPart::Copy {
                    source,
                    offset,
                    len,
                } => self.copy_part(i, source, *offset, *len).await?,
            };
            ids.push(pid);
        }
        store
            .complete_multipart(self.key, self.id, ids)
            .await
            .map(|_| ())
            .map_err(|e| map_err("copy", dest, e))
    }

    /// Part `i` copied by the server from `len` bytes at `offset` of
    /// `source` (`UploadPartCopy`, a request signed here).
    async fn copy_part(
        &self,
        i: usize,
        source: &str,
        offset: u64,
        len: u64,
    ) -> Result<object_store::multipart::PartId> {
        use object_store::signer::SignedUrlOptions;
        let dest = self.dest;
        let bad = |m: String| BackendError::new(ErrorKind::Invalid, "copy", dest, m);
        let bucket = &self.backend.loc.bucket;
        let src = format!("{bucket}/{}", self.backend.key(source).as_ref());
        let range = format!("bytes={}-{}", offset, offset + len - 1);
        let hv = |v: &str| http::HeaderValue::from_str(v).map_err(|e| bad(e.to_string()));
        let opts = SignedUrlOptions::new()
            .with_query([
                ("partNumber", (i + 1).to_string()),
                ("uploadId", self.id.clone()),
            ])
            .with_signed_header(
                http::HeaderName::from_static("x-amz-copy-source"),
                hv(&src)?,
            )
            .with_signed_header(
                http::HeaderName::from_static("x-amz-copy-source-range"),
                hv(&range)?,
            );
        let url = self
            .backend
            .store
            .signed_url_opts(http::Method::PUT, self.key, Duration::from_secs(600), &opts)
            .await
            .map_err(|e| map_err("copy", dest, e))?;
        let resp = self
            .client
            .put(url.as_str())
            .header("x-amz-copy-source", &src)
            .header("x-amz-copy-source-range", &range)
            .send()
            .await
            .map_err(|e| BackendError::new(ErrorKind::Transient, "copy", dest, e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        part_copied(status, &body, source, dest)
    }
}

/// The part an `UploadPartCopy` of `source` answered (`status`, `body`)
/// made: its ETag, or the error.
fn part_copied(
    status: u16,
    body: &str,
    source: &str,
    dest: &str,
) -> Result<object_store::multipart::PartId> {
    let etag = body
        .split("<ETag>")
        .nth(1)
        .and_then(|r| r.split("</ETag>").next())
        .map(|e| e.replace("&quot;", "\"").replace("&#34;", "\""));
    match (status, etag) {
        (200, Some(e)) => Ok(object_store::multipart::PartId { content_id: e }),
        _ => Err(BackendError::new(
            if status == 403 {
                ErrorKind::Permission
            } else {
                ErrorKind::Other
            },
            "copy",
            dest,
            format!(
                "UploadPartCopy from {source} answered {status}{}",
                s3_code(body).map(|c| format!(" ({c})")).unwrap_or_default()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_are_read_from_a_listing_page() {
        let page = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>p/data/cd/x&amp;y</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>
  <IsTruncated>true</IsTruncated>
  <Upload><Key>p/data/ab/one</Key><UploadId>u1</UploadId>
    <Initiator><ID>i</ID></Initiator><Initiated>2026-11-28T00:10:41.000Z</Initiated></Upload>
  <Upload><Key>p/data/cd/x&amp;y</Key><UploadId>u2</UploadId>
    <Initiated>2026-11-28T00:11:00Z</Initiated></Upload>
</ListMultipartUploadsResult>"#;
        let (ups, next) = parse_uploads(page);
        assert_eq!(ups.len(), 2);
        assert_eq!(ups[0].key, "p/data/ab/one");
        assert_eq!(ups[0].id, "u1");
        assert!(ups[0].initiated.parse::<jiff::Timestamp>().is_ok());
        assert_eq!(ups[1].key, "p/data/cd/x&y");
        assert_eq!(next, Some(("p/data/cd/x&y".into(), "u2".into())));
        // The last page; an empty one.
        let last = page.replace("<IsTruncated>true", "<IsTruncated>false");
        assert_eq!(parse_uploads(&last).1, None);
        let (none, next) = parse_uploads("<ListMultipartUploadsResult/>");
        assert!(none.is_empty() && next.is_none());
    }

    #[test]
    fn only_data_containers_are_swept() {
        let id = "ab0123456789abcdef0123456789abcd";
        assert!(is_container_name(&format!("data/ab/{id}")));
        for other in [
            format!("data/cd/{id}"),
            format!("x/data/ab/{id}"),
            format!("data/ab/{id}/more"),
            "data/ab/AB0123456789ABCDEF0123456789ABCD".into(),
            "recipes/abc".into(),
            "video.mp4".into(),
        ] {
            assert!(!is_container_name(&other), "{other}");
        }
    }

    #[test]
    fn profiles_are_found() {
        let text = "[default]\naws_access_key_id = A\naws_secret_access_key=B\n\n[other]\n# c\naws_access_key_id = C\n";
        let d = S3Credentials::from_profile(text, "default").unwrap();
        assert_eq!(d.access_key_id.as_deref(), Some("A"));
        assert_eq!(d.secret_access_key.as_deref(), Some("B"));
        assert_eq!(d.session_token, None);
        let o = S3Credentials::from_profile(text, "other").unwrap();
        assert_eq!(o.access_key_id.as_deref(), Some("C"));
        assert_eq!(o.secret_access_key, None);
        assert!(S3Credentials::from_profile(text, "none").is_none());
    }
}
