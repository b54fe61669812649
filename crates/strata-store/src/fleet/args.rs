//! What the coordinator passes to a stage (JSON from Python).

use super::{HostDir, Shape};
use crate::error::Result;
use serde::Deserialize;
use std::path::PathBuf;

/// One stage's arguments.
#[derive(Clone, Debug, Deserialize)]
pub struct StageArgs {
    /// The host's work directory (index partitions, round scratch files).
    pub work: PathBuf,
    /// The round's name (scratch files live under `rounds/ROUND`).
    pub round: String,
    pub hosts: u32,
    pub q: u32,
    /// This host's number among `hosts`.
    pub me: u32,
    /// Memory cap M of the stage's process, bytes.
    pub memory: u64,
    /// The VMs this host backs up in this round.
    #[serde(default)]
    pub vms: Vec<VmArgs>,
}

/// One VM of a round.
#[derive(Clone, Debug, Deserialize)]
pub struct VmArgs {
    /// The VM's number in the job (its answers are addressed by it).
    pub vm: u32,
    /// Its name: the series of its snapshots.
    pub name: String,
    /// Its disk image (a raw image file).
    pub image: PathBuf,
    /// Changed extents since the previous snapshot (offset, length), when
    /// the hypervisor tracks them (a QEMU dirty bitmap export or a list);
    /// without one, segments are compared by fingerprint.
    #[serde(default)]
    pub changed: Option<Vec<(u64, u64)>>,
    /// The host recorded in the snapshot.
    pub host_name: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

impl StageArgs {
    pub fn shape(&self) -> Result<Shape> {
        let s = Shape {
            hosts: self.hosts,
            q: self.q,
            me: self.me,
        };
        s.check()?;
        Ok(s)
    }

    pub fn dir(&self) -> Result<HostDir> {
        super::valid_round(&self.round)?;
        Ok(HostDir {
            root: self.work.clone(),
            round: self.round.clone(),
        })
    }
}
