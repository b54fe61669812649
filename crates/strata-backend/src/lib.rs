//! Storage backends (docs/design.md "Principles": the repository is the truth).
//!
//! A backend stores immutable named objects with object-store semantics:
//! put a whole object, get it (or a byte range), list by prefix, delete. No
//! rename or append is needed, so a directory, memory and an S3 bucket fit
//! behind the same [`Backend`] trait. Every backend refuses object names
//! outside the repository's grammar ([`check_name`]), so no name read from
//! a repository can reach outside it.
//!
//! | module | what |
//! |---|---|
//! | [`local`] | a directory: crash-safe puts (temporary file, fsync, rename, fsync the directory) |
//! | [`memory`] | a map in memory, for tests and scratch repositories |
//! | [`s3`] | an S3-compatible bucket (`object_store`), multipart streaming, ranged reads |
//! | [`wrap`] | retry with backoff on transient errors; a limit on concurrent operations; metering |
//! | [`cache`] | a local copy of a remote repository's immutable metadata (checksummed, pruned by listings) |
//! | [`overlay`] | a what-if layer: runs maintenance to learn what it would do, changing nothing |
//! | [`conformance`] | the checks every backend passes |
//! | [`fault_proxy`] | a TCP proxy that injects 503s, dropped connections and latency in front of a real S3 server (tests) |
//! | [`object`] | the [`Backend`] trait, its errors, the object-name grammar |
//! | [`open`] | the backend of a location, as every front end opens it (directory made private, bucket behind retries and a request bound, meter, cache) |
//! | [`location`] | `--repo` values: a directory or `s3://BUCKET/PREFIX?endpoint=URL` |

pub mod cache;
pub mod conformance;
pub mod crash;
pub mod fault_proxy;
pub mod local;
pub mod location;
pub mod memory;
pub mod object;
pub mod open;
pub mod overlay;
pub mod s3;
pub mod wrap;

pub use cache::Cache;
pub use crash::Crash;
pub use local::LocalBackend;
pub use location::Location;
pub use memory::MemoryBackend;
pub use object::{
    check_name, check_prefix, create_object, slice_range, Backend, BackendError, ErrorKind,
    ObjectInfo, ObjectWriter, Result, Swept, MAX_NAME,
};
pub use overlay::OverlayBackend;
