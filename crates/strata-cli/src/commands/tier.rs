//! `strata tier …`: the cloud tier of a local repository (Data Domain Cloud
//! Tier): attach a bucket, estimate what moving versions frees, migrate
//! them; restore and dump read cloud versions from the bucket.

use crate::location;
use crate::output::{fmt_bytes, Out};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use strata_store::backend::Location;
use strata_store::tier::select::Selection;
use strata_store::Repository;

#[derive(Subcommand)]
pub enum TierCmd {
    /// Attach a bucket as this repository's cloud tier.
    ///
    /// The bucket (s3://BUCKET/PREFIX) becomes a second dedup domain that holds
    /// whole versions (created if missing; the bucket too).
    Add {
        /// The bucket and prefix: s3://BUCKET/PREFIX[?endpoint=URL&region=R].
        url: String,
        /// Size of the cloud tier's objects (1–4 MiB suit object stores;
        /// `tier gc --s3-copy` needs more than 5 MiB).
        #[arg(long, default_value_t = 4)]
        container_mib: u32,
    },
    /// Bytes the active tier would free if the selected versions moved.
    ///
    /// If the selected versions (or paths of them) moved to the cloud tier — or
    /// were forgotten — and `gc` ran: exact to the byte (gc is run on a what-if
    /// copy: it reads what gc would copy forward and writes nothing).
    Estimate {
        #[command(flatten)]
        sel: SelArgs,
        /// Metadata only (the paper's estimate): the stored share of the
        /// selection's own chunks, not gc's exact result.
        #[arg(long)]
        fast: bool,
    },
    /// Move the selected versions (or paths of them) to the cloud tier.
    ///
    /// Only chunks the bucket lacks are sent; `gc` then frees what only they
    /// held locally. With `--path`, only the matching files move and the rest
    /// of each version stays active (`snapshots` shows it as active+cloud;
    /// restore reads both).
    Migrate(SelArgs),
    /// Bring the selected versions back from the cloud tier.
    ///
    /// Whole versions, and the cloud parts of active versions: only chunks the
    /// active tier lacks are read from the bucket.
    Recall(SelArgs),
    /// The bulk first transfer of many versions to an empty cloud tier.
    ///
    /// Reads the active tier in physical order, each chunk once; resumable —
    /// run it again after an interruption.
    Seed {
        #[command(flatten)]
        sel: SelArgs,
        /// Drop an interrupted seed instead of finishing it.
        #[arg(long)]
        restart: bool,
    },
    /// Clean the cloud tier without downloading it.
    ///
    /// Containers with dead regions are deleted or copied forward region by
    /// region next to the store (the cleaning efficiency region granularity
    /// loses is reported).
    Gc {
        /// A `strata copy-forward-service` running next to the bucket.
        #[arg(long, value_name = "URL", conflicts_with_all = ["download", "s3_copy"])]
        service: Option<String>,
        /// S3's own server-side copy (UploadPartCopy): nothing to run, but
        /// parts of at least 5 MiB — only containers larger than that are
        /// copied forward, taking some dead bytes along.
        #[arg(long, conflicts_with = "download")]
        s3_copy: bool,
        /// Read the live regions here and upload them again (pays egress).
        #[arg(long)]
        download: bool,
        /// Copy a container forward when more than this fraction of it is
        /// in dead regions.
        #[arg(long, default_value_t = 0.2)]
        threshold: f64,
        /// Only report what would be done.
        #[arg(long)]
        dry_run: bool,
    },
    /// Disaster recovery: rebuild a lost local repository from its cloud tier.
    ///
    /// The repository (at --repo, which must not exist yet) is rebuilt from its
    /// cloud tier alone; its versions are then listed and restorable again.
    /// Needs the repository's password.
    DrRebuild {
        /// The cloud tier: s3://BUCKET/PREFIX.
        #[arg(long)]
        from: String,
        /// Index strategy of the rebuilt local repository.
        #[arg(long, default_value = "segment")]
        index: String,
    },
}

/// Which versions a tier command works on.
#[derive(Args)]
pub struct SelArgs {
    /// Snapshots: id (prefix), SERIES@VERSION, `latest`.
    pub snapshots: Vec<String>,
    /// Every version of this series (repeatable).
    #[arg(long)]
    pub series: Vec<String>,
    /// Versions at least this many days old.
    #[arg(long, value_name = "DAYS")]
    pub older_than: Option<u64>,
    /// Only these files of the versions (globs on the path as `strata ls`
    /// shows it, e.g. '/srv/logs/**'; `tier estimate` and `tier migrate`).
    #[arg(long)]
    pub path: Vec<String>,
}

impl SelArgs {
    fn selection(&self) -> Selection {
        Selection {
            snapshots: self.snapshots.clone(),
            series: self.series.clone(),
            older_than_days: self.older_than,
            paths: self.path.clone(),
        }
    }
}

use crate::location::CLOUD_METER;

/// Object-store prices (US dollars), from `STRATA_PRICE_GB_MONTH`,
/// `STRATA_PRICE_PUT_PER_1000` (PUT, COPY, LIST), `STRATA_PRICE_GET_PER_1000`
/// (GET, HEAD) and `STRATA_PRICE_EGRESS_GB`; S3 Standard's list prices by
/// default.
fn prices() -> [(&'static str, f64); 4] {
    let p = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| *v >= 0.0)
            .unwrap_or(d)
    };
    [
        ("gb_month", p("STRATA_PRICE_GB_MONTH", 0.023)),
        ("put_per_1000", p("STRATA_PRICE_PUT_PER_1000", 0.005)),
        ("get_per_1000", p("STRATA_PRICE_GET_PER_1000", 0.0004)),
        ("egress_gb", p("STRATA_PRICE_EGRESS_GB", 0.09)),
    ]
}

/// A tier command's JSON with what it cost: its requests and egress to
/// the cloud tier, and the cloud tier's storage per month afterwards.
fn with_cost(mut v: serde_json::Value, cloud: &Repository) -> Result<serde_json::Value> {
    let [(_, gb_month), (_, put), (_, get), (_, egress)] = prices();
    let m = CLOUD_METER.get().map(|m| m.read()).unwrap_or_default();
    let stored = strata_store::repo::index::RepoIndex::load_summaries(cloud)?.stored_bytes();
    let gb = |b: u64| b as f64 / 1e9;
    // S3's server-side copy requests (tier gc --s3-copy) are PUT-class.
    let copies = v["server_side_copy_requests"].as_u64().unwrap_or(0);
    let requests = (m.puts + m.lists + copies) as f64 / 1000.0 * put
        + (m.gets + m.ranged_gets + m.heads) as f64 / 1000.0 * get;
    let egress_usd = gb(m.bytes_received) * egress;
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "cost".into(),
            json!({
                "prices_usd": prices().iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "requests_usd": requests,
                "egress_usd": egress_usd,
                "command_usd": requests + egress_usd,
                "cloud_stored_bytes": stored,
                "storage_usd_per_month": gb(stored) * gb_month,
            }),
        );
    }
    Ok(v)
}

pub fn run(cli: &crate::cli::Cli, out: &Out, cmd: &TierCmd) -> Result<i32> {
    if let TierCmd::DrRebuild { from, index } = cmd {
        return dr_rebuild(cli, out, from, index);
    }
    let repo = crate::cli::open(cli)?;
    match cmd {
        TierCmd::Add { url, container_mib } => add(out, &repo, url, *container_mib),
        TierCmd::Estimate { sel, fast } => estimate(out, &repo, sel, *fast),
        TierCmd::Migrate(a) => moves(cli, out, &repo, a, true),
        TierCmd::Recall(a) => moves(cli, out, &repo, a, false),
        TierCmd::Gc {
            service,
            s3_copy,
            download,
            threshold,
            dry_run,
        } => {
            let c = crate::cli::tiers(&repo).cloud()?;
            let how = (service.as_deref(), *s3_copy, *download, *dry_run);
            let copier = copier(&repo, &c, how)?;
            let opts = strata_store::tier::cloud_gc::CloudGcOptions {
                threshold: *threshold,
                dry_run: *dry_run,
            };
            gc(out, &repo, &c, copier.as_ref(), &opts)
        }
        TierCmd::Seed { sel, restart } => seed(cli, out, &repo, sel, *restart),
        TierCmd::DrRebuild { .. } => unreachable!("handled above"),
    }
}

/// `tier add`: attaches a bucket as the cloud tier.
fn add(out: &Out, repo: &Repository, url: &str, container_mib: u32) -> Result<i32> {
    let loc = location::location(Some(url))?;
    if !matches!(loc, Location::S3(_)) {
        return Err(anyhow!("a cloud tier is a bucket: s3://BUCKET/PREFIX"));
    }
    let backend = location::backend(&loc, true)?;
    let c =
        strata_store::tier::attach_with(repo, backend, url, container_mib.clamp(1, 1024) << 20)?;
    out.result(
        &json!({"cloud_tier": url, "id": c.config().id,
                "container_size": c.config().container_size}),
        || {
            format!(
                "cloud tier {} attached ({})",
                url,
                crate::output::short(&c.config().id)
            )
        },
    );
    Ok(0)
}

/// `tier estimate`: what moving the selection would free here.
fn estimate(out: &Out, repo: &Repository, sel: &SelArgs, fast: bool) -> Result<i32> {
    let e = strata_store::tier::estimate::estimate(repo, &sel.selection(), !fast)?;
    out.result(&serde_json::to_value(&e)?, || {
        let how = if e.exact {
            format!(
                "exactly, by the next gc: {} containers deleted, {} copied forward",
                e.gc_containers_deleted, e.gc_containers_rewritten
            )
        } else {
            format!(
                "the selection's own chunks, if gc cleaned every one; not exact: {}",
                e.not_exact_because.as_deref().unwrap_or("-")
            )
        };
        format!(
            "{} versions: {} freed on the active tier ({how})\n\
             selection's own chunks: {} stored ({} in {} whole containers, {} in whole \
             regions), {} uncompressed\n\
             {} fingerprints, {} of perfect-hash vector, {:.1}s",
            e.versions.len(),
            if e.freed_bytes < 0 {
                format!("-{}", fmt_bytes(e.freed_bytes.unsigned_abs()))
            } else {
                fmt_bytes(e.freed_bytes as u64)
            },
            fmt_bytes(e.selection_bytes),
            fmt_bytes(e.freed_container_bytes),
            e.freed_containers,
            fmt_bytes(e.freed_region_bytes),
            fmt_bytes(e.freed_raw_bytes),
            e.fingerprints,
            fmt_bytes(e.phv_bytes),
            e.seconds
        )
    });
    Ok(0)
}

/// `tier migrate` (`to_cloud`) and `tier recall`.
fn moves(
    cli: &crate::cli::Cli,
    out: &Out,
    repo: &Repository,
    a: &SelArgs,
    to_cloud: bool,
) -> Result<i32> {
    let c = crate::cli::tiers(repo).cloud()?;
    let pd = crate::cli::progress_for(cli, if to_cloud { "migrate" } else { "recall" });
    let r = if to_cloud {
        strata_store::tier::migrate::migrate(repo, &c, &a.selection(), &pd.progress)
    } else {
        strata_store::tier::migrate::recall(repo, &c, &a.selection(), &pd.progress)
    };
    pd.finish();
    let r = r?;
    out.result(&with_cost(serde_json::to_value(&r)?, &c)?, || {
        let files = if a.path.is_empty() {
            String::new()
        } else {
            format!("{} files of ", r.files)
        };
        format!(
            "{files}{} versions moved to the {} tier: {} logical, {} new chunks copied ({} stored, \
             {} containers), {} already there; {:.1}s.{}",
            r.versions.len(),
            if to_cloud { "cloud" } else { "active" },
            fmt_bytes(r.logical_bytes),
            r.chunks_sent,
            fmt_bytes(r.stored_bytes_sent),
            r.containers_written,
            r.chunks_deduplicated,
            r.seconds,
            if to_cloud { " `strata gc` frees the local copies." } else { "" }
        )
    });
    Ok(0)
}

/// How `tier gc` copies live data forward: next to the bucket (a
/// service, or S3's server-side copy), or through this host.
fn copier(
    repo: &Repository,
    c: &Repository,
    (service, s3_copy, download, dry_run): (Option<&str>, bool, bool, bool),
) -> Result<Box<dyn strata_store::tier::copy_forward::CopyForward>> {
    use strata_store::tier::copy_forward::{Download, S3Copy, Service};
    Ok(match (service, download) {
        (Some(url), _) => Box::new(Service::new(url)?),
        (None, _) if s3_copy => {
            let url = strata_store::tier::attached(repo)?
                .map(|t| t.peer_url)
                .unwrap_or_default();
            let b = location::s3_backend(&location::location(Some(&url))?)?;
            Box::new(S3Copy(std::sync::Arc::new(b)))
        }
        (None, true) => Box::new(Download(c.backend().clone())),
        (None, false) if dry_run => Box::new(Download(c.backend().clone())),
        (None, false) => {
            return Err(anyhow!(
                "say how to copy forward: --service URL (a `strata copy-forward-service` \
                 next to the bucket), --s3-copy (S3 server-side copy, containers over \
                 5 MiB) — neither downloads — or --download (reads the live data here)"
            ))
        }
    })
}

/// `tier gc`: cleans the cloud tier.
fn gc(
    out: &Out,
    repo: &Repository,
    c: &Repository,
    copier: &dyn strata_store::tier::copy_forward::CopyForward,
    opts: &strata_store::tier::cloud_gc::CloudGcOptions,
) -> Result<i32> {
    let r = strata_store::tier::cloud_gc::cloud_gc(repo, c, copier, opts)?;
    out.result(&with_cost(serde_json::to_value(&r)?, c)?, || {
        format!(
            "cloud tier: {} freed ({} containers deleted, {} copied forward into {}); \
             {} of dead chunks kept in live regions ({:.1} % efficiency lost); \
             {} copied next to the store, {} downloaded here; {:.1}s",
            fmt_bytes(r.dead_bytes_freed),
            r.containers_deleted,
            r.containers_copied_forward,
            r.containers_written,
            fmt_bytes(r.dead_bytes_kept),
            r.efficiency_loss * 100.0,
            fmt_bytes(r.bytes_copied),
            fmt_bytes(r.bytes_downloaded),
            r.seconds
        )
    });
    Ok(0)
}

/// `tier seed`: the bulk first transfer (or, `restart`, dropping an
/// interrupted one first).
fn seed(
    cli: &crate::cli::Cli,
    out: &Out,
    repo: &Repository,
    sel: &SelArgs,
    restart: bool,
) -> Result<i32> {
    if restart {
        let had = strata_store::tier::seed::restart(repo)?;
        out.result(&json!({ "dropped": had }), || {
            if had {
                "the interrupted seed was dropped".into()
            } else {
                "no seed was in progress".into()
            }
        });
        if sel.snapshots.is_empty() && sel.series.is_empty() && sel.older_than.is_none() {
            return Ok(0);
        }
    }
    let c = crate::cli::tiers(repo).cloud()?;
    let pd = crate::cli::progress_for(cli, "seed");
    let r = strata_store::tier::seed::seed(repo, &c, &sel.selection(), &pd.progress);
    pd.finish();
    let r = r?;
    out.result(&with_cost(serde_json::to_value(&r)?, &c)?, || {
        format!(
            "{} versions seeded into the cloud tier{}: {} containers read in physical order, \
             {} chunks sent ({} stored); {:.1}s. `strata gc` frees the local copies.",
            r.versions.len(),
            if r.resumed { " (resumed)" } else { "" },
            r.containers_read,
            r.chunks_sent,
            fmt_bytes(r.stored_bytes_sent),
            r.seconds
        )
    });
    Ok(0)
}

fn dr_rebuild(cli: &crate::cli::Cli, out: &Out, from: &str, index: &str) -> Result<i32> {
    let cloud_loc = location::location(Some(from))?;
    let cloud = Repository::open(location::backend(&cloud_loc, false)?, &|| {
        crate::cli::read_password(cli, false)
    })?;
    let loc = crate::cli::repo_location(cli)?;
    let local = location::backend(&loc, true)?;
    let (repo, r) = strata_store::tier::dr_rebuild(local, &cloud, from, index)?;
    let _ = repo;
    out.result(&serde_json::to_value(&r)?, || {
        format!(
            "rebuilt repository {} at {} from {}: {} versions (in the cloud tier), {} recipes, {} parts; {:.1}s",
            crate::output::short(&r.repository_id),
            loc,
            from,
            r.snapshots,
            r.recipes,
            r.parts,
            r.seconds
        )
    });
    Ok(0)
}
