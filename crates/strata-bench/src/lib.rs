//! Strata's benchmark harness (docs/design.md "Principles" 4: measure everything
//! the papers measure).
//!
//! * [`gen`] — deterministic workload generators modelled on the papers'
//!   evaluations (RevDedup SG1–5/GP, Data Domain ddgen, SiLo small files,
//!   Parallel-VM fleets, iDedup primary traces, fingerprint-only traces).
//! * [`runner`] — runs one workload through several systems in the same
//!   run, interleaved, and records per-version backup/restore figures.
//! * [`report`] — a run's summary, CSV files and charts.
//! * [`systems`] — how to drive Strata, restic and borg.
//! * [`measure`] — wall time, peak RSS and I/O of a child process.
//! * [`chart`] — SVG charts like the papers' figures.
//! * [`limits`] — what this machine's hardware allows.
//! * [`deltasim`] — what delta compression of near-duplicate chunks saves
//!   on a series of real trees.
//! * [`indextrace`] — index strategies (exact, SiLo, Extreme Binning) on
//!   fingerprint traces at terabyte scale.

pub mod chart;
pub mod deltasim;
pub mod gen;
pub mod indextrace;
pub mod limits;
pub mod measure;
pub mod report;
pub mod results;
pub mod runner;
pub mod s3;
pub mod systems;
