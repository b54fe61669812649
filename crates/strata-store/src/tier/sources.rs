//! Where a version's data is: the repository itself (the active tier), its
//! cloud tier, or both — a version some of whose files moved (`tier
//! migrate --path`) has its cloud part in the bucket. Every reader of a
//! version (restore, dump, mount, copy, a stored volume served) asks here.

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::ops::restore::{
    restore_from, verify_from, RecipeSource, RestoreOptions, RestoreReport, VerifyReport,
};
use crate::repo::tiers::part_snapshot;
use crate::repo::Repository;
use std::sync::{Arc, Mutex};
use strata_core::format::{Snapshot, Tier};

/// How the caller opens the backend at a URL (the cloud tier's bucket):
/// with its credentials, its request meter. The library reads no
/// environment.
pub type OpenBackend = dyn Fn(&str) -> Result<Arc<dyn Backend>> + Send + Sync;

/// A repository and its cloud tier, opened on first use.
#[derive(Clone)]
pub struct Tiers {
    active: Repository,
    open: Arc<OpenBackend>,
    cloud: Arc<Mutex<Option<Repository>>>,
}

impl Tiers {
    /// `repo`'s tiers; `open` opens the cloud tier's bucket when needed.
    pub fn new(repo: &Repository, open: Arc<OpenBackend>) -> Tiers {
        Tiers {
            active: repo.clone(),
            open,
            cloud: Arc::default(),
        }
    }

    /// The repository (the active tier).
    pub fn active(&self) -> &Repository {
        &self.active
    }

    /// The cloud tier attached to the repository, opened.
    pub fn cloud(&self) -> Result<Repository> {
        let mut c = self.cloud.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &*c {
            return Ok(c.clone());
        }
        let at = super::attach::attached(&self.active)?.ok_or_else(|| {
            StoreError::Invalid(
                "this repository has no cloud tier: `strata tier add s3://BUCKET/PREFIX`".into(),
            )
        })?;
        let opened = super::attach::open_cloud_in(&self.active, (self.open)(&at.peer_url)?)?;
        *c = Some(opened.clone());
        Ok(opened)
    }

    /// Where `s`'s data is, in the order a restore reads it into one tree:
    /// for a version some of whose files moved, first the cloud tier with
    /// the version as the bucket holds it (just those files); then the
    /// repository holding its recipe with `s` — last, since it holds every
    /// directory and sets their metadata. (Recipes load from the
    /// repository, which keeps a copy of every recipe.)
    pub fn sources(&self, s: &Snapshot) -> Result<Vec<(Repository, Snapshot)>> {
        let mut out = Vec::new();
        if let Some(p) = part_snapshot(s) {
            out.push((self.cloud()?, p));
        }
        out.push((self.data_repo(s)?, s.clone()));
        Ok(out)
    }

    /// The repository holding the data of a version's recipe: its active
    /// part's, or its cloud part's (`cloud_part`).
    pub fn part_data(&self, part: &Snapshot, cloud_part: bool) -> Result<Repository> {
        match cloud_part {
            false => self.data_repo(part),
            true => self.cloud(),
        }
    }

    /// The repository holding `s`'s data: the repository, or its cloud
    /// tier.
    pub fn data_repo(&self, s: &Snapshot) -> Result<Repository> {
        match s.tier {
            Tier::Active => Ok(self.active.clone()),
            Tier::Cloud => self.cloud(),
        }
    }
}

impl Tiers {
    /// Restores version `s` from wherever its data is ([`Self::sources`]:
    /// the files in the cloud tier first; the directories' metadata set
    /// last). `readers`: reads in flight, or (None) as many as suit each
    /// source — a bucket wants many, a local disk the default.
    pub fn restore(
        &self,
        s: &Snapshot,
        opts: &mut RestoreOptions,
        readers: Option<usize>,
    ) -> Result<RestoreReport> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut rep = RestoreReport::default();
        let sources = self.sources(s)?;
        let n = sources.len();
        for (i, (data, part)) in sources.into_iter().enumerate() {
            opts.dir_metadata = i + 1 == n;
            opts.readers =
                readers.unwrap_or(match data.backend().describe().starts_with("s3://") {
                    true => (2 * cores).max(4),
                    false => 0,
                });
            let recipe = RecipeSource::Stored {
                repo: &self.active,
                id: &part.recipe,
            };
            rep.add(restore_from(&data, &part, recipe, opts)?, i + 1 == n);
        }
        Ok(rep)
    }

    /// Reads the files of version `s` restored with `opts` back against
    /// its fingerprints, a recipe (active part, cloud part) at a time.
    pub fn verify(&self, s: &Snapshot, opts: &RestoreOptions) -> Result<VerifyReport> {
        let mut total = VerifyReport::default();
        for (_, part) in self.sources(s)? {
            let recipe = RecipeSource::Stored {
                repo: &self.active,
                id: &part.recipe,
            };
            let v = verify_from(&self.active, recipe, opts)?;
            total.files += v.files;
            total.bytes += v.bytes;
            total.mismatches.extend(v.mismatches);
        }
        Ok(total)
    }
}

/// Where a version is, as `snapshots` shows it: "active+cloud" when some
/// of its files moved (`tier migrate --path`), "cloud-part" for the moved
/// files alone (what a bucket holds of such a version).
pub fn tier_name(s: &Snapshot) -> &'static str {
    match (s.tier, s.cloud_part.is_some()) {
        (Tier::Active, false) => "active",
        (Tier::Active, true) => "active+cloud",
        (Tier::Cloud, false) => "cloud",
        (Tier::Cloud, true) => "cloud-part",
    }
}
