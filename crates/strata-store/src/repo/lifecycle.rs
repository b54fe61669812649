//! Per-series lifecycle policy (docs/design.md "Vocabulary": live / archival /
//! retention window; RevDedup §2.2.1).
//!
//! The newest `live` versions of a series are *live* (segment-level dedup
//! only, fast restore); older versions within the retention window are
//! *archival* (to be reverse-deduplicated by `maintain`); versions past
//! retention — by count (`retain`, counting live ones too) or by age
//! (`retain_days`) — are *expired*. Policies are small objects
//! `policies/HASH` (HASH = BLAKE3 of the series name), replaced atomically.

use crate::error::{Result, StoreError};
use crate::repo::Repository;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use strata_core::crypto::Kind;
use strata_core::format::{decode, encode, Snapshot};
use strata_core::id::SnapshotId;

/// The lifecycle policy of one series.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub series: String,
    /// Number of newest versions kept live (at least 1).
    pub live: u32,
    /// Versions retained in all (live + archival); `None` keeps all.
    pub retain: Option<u32>,
    /// Versions older than this many days expire; `None` = no age limit.
    pub retain_days: Option<u32>,
}

impl Policy {
    /// The default: one live version, everything retained.
    pub fn default_for(series: &str) -> Self {
        Policy {
            series: series.to_string(),
            live: 1,
            retain: None,
            retain_days: None,
        }
    }
}

/// Where a version stands in its series' lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionState {
    Live,
    Archival,
    Expired,
}

pub(crate) fn policy_name(series: &str) -> String {
    format!("policies/{}", blake3::hash(series.as_bytes()).to_hex())
}

/// Stores a policy, replacing the series' previous one.
pub fn set_policy(repo: &Repository, p: &Policy) -> Result<()> {
    if p.live == 0 {
        return Err(StoreError::Invalid("--live must be at least 1".into()));
    }
    if let Some(r) = p.retain {
        if r < p.live {
            return Err(StoreError::Invalid(format!(
                "--retain {r} is smaller than --live {}: the retention window includes the live versions",
                p.live
            )));
        }
    }
    let env = repo.sealer().seal(Kind::Policy, &encode(p)?, false)?;
    Ok(repo.backend().put(&policy_name(&p.series), &env)?)
}

/// All stored policies, by series.
pub fn list_policies(repo: &Repository) -> Result<HashMap<String, Policy>> {
    let mut out = HashMap::new();
    for o in repo.backend().list("policies/")? {
        let raw = repo.backend().get(&o.name)?;
        let bytes = repo
            .sealer()
            .open(Kind::Policy, &raw)
            .map_err(|e| StoreError::corrupt(&o.name, e))?;
        let p: Policy = decode("policy", &bytes).map_err(|e| StoreError::corrupt(&o.name, e))?;
        out.insert(p.series.clone(), p);
    }
    Ok(out)
}

/// The policy of a series (the default when none is stored).
pub fn policy_of(policies: &HashMap<String, Policy>, series: &str) -> Policy {
    policies
        .get(series)
        .cloned()
        .unwrap_or_else(|| Policy::default_for(series))
}

/// The lifecycle's bookkeeping between runs (`lifecycle/state`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleState {
    /// Plaintext bytes the lifecycle released from the pool (references
    /// reverse dedup made indirect while the next version holds the chunk
    /// elsewhere; direct references of expired versions) since the pool
    /// was last compacted: what a compaction could free, at most.
    pub released_bytes: u64,
}

pub(crate) const STATE_NAME: &str = "lifecycle/state";

/// The lifecycle's bookkeeping (empty when none is stored yet).
pub fn load_state(repo: &Repository) -> Result<LifecycleState> {
    match repo.get_struct(Kind::LifecycleState, STATE_NAME, "lifecycle state") {
        Err(StoreError::NotFound(_)) => Ok(LifecycleState::default()),
        // Derived bookkeeping: a damaged copy only delays a compaction.
        Err(StoreError::Corrupt { .. }) => Ok(LifecycleState::default()),
        other => other,
    }
}

/// Replaces the lifecycle's bookkeeping.
pub fn store_state(repo: &Repository, state: &LifecycleState) -> Result<()> {
    let env = repo
        .sealer()
        .seal(Kind::LifecycleState, &encode(state)?, false)?;
    Ok(repo.backend().put(STATE_NAME, &env)?)
}

/// Each snapshot's state as `strata snapshots` shows it: `live`,
/// `archival` (reverse-deduplicated), `archival*` (left the live window,
/// waiting for the lifecycle), `expired`, `live (rev)` for a version that
/// is reverse-deduplicated yet back in the window, `-` for a version in
/// the cloud tier (the lifecycle works on the active tier only).
pub fn display_states(
    snapshots: &[(SnapshotId, Snapshot)],
    policies: &HashMap<String, Policy>,
    now_ns: i64,
) -> HashMap<SnapshotId, String> {
    let states = version_states(snapshots, policies, now_ns);
    snapshots
        .iter()
        .map(|(id, s)| {
            let st = states
                .get(id)
                .map(|s| format!("{s:?}").to_lowercase())
                .unwrap_or_default();
            let shown = match (s.tier, st.as_str(), s.archival.is_some()) {
                (strata_core::format::Tier::Cloud, _, _) => "-".to_string(),
                (_, "archival", false) => "archival*".to_string(),
                (_, _, true) if st != "archival" => format!("{st} (rev)"),
                _ => st,
            };
            (id.clone(), shown)
        })
        .collect()
}

/// The state of every snapshot under the policies, at time `now_ns`.
pub fn version_states(
    snapshots: &[(SnapshotId, Snapshot)],
    policies: &HashMap<String, Policy>,
    now_ns: i64,
) -> HashMap<SnapshotId, VersionState> {
    let mut by_series: HashMap<&str, Vec<&(SnapshotId, Snapshot)>> = HashMap::new();
    for s in snapshots {
        by_series.entry(s.1.series.as_str()).or_default().push(s);
    }
    let mut out = HashMap::new();
    for (series, mut list) in by_series {
        let p = policy_of(policies, series);
        // Newest first.
        list.sort_by_key(|x| std::cmp::Reverse((x.1.version, x.1.time_ns)));
        for (i, (id, s)) in list.into_iter().enumerate().map(|(i, x)| (i, (&x.0, &x.1))) {
            let i = i as u32;
            let too_many = p.retain.is_some_and(|r| i >= r);
            let too_old = p
                .retain_days
                .is_some_and(|d| now_ns - s.time_ns > d as i64 * 86_400 * 1_000_000_000);
            let state = if i < p.live {
                VersionState::Live
            } else if too_many || too_old {
                VersionState::Expired
            } else {
                VersionState::Archival
            };
            out.insert(id.clone(), state);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::snapshot_id as sid;

    fn snap(series: &str, version: u32, day: i64) -> (SnapshotId, Snapshot) {
        let time_ns = day * 86_400 * 1_000_000_000;
        (
            sid(series, version),
            crate::testutil::snapshot(series, version, time_ns),
        )
    }

    #[test]
    fn windows() {
        let snaps: Vec<_> = (1..=6)
            .map(|v| snap("a", v, v as i64))
            .chain([snap("b", 1, 1)])
            .collect();
        let mut pols = HashMap::new();
        pols.insert(
            "a".to_string(),
            Policy {
                series: "a".into(),
                live: 2,
                retain: Some(4),
                retain_days: None,
            },
        );
        let st = version_states(&snaps, &pols, 10 * 86_400 * 1_000_000_000);
        assert_eq!(st[&sid("a", 6)], VersionState::Live);
        assert_eq!(st[&sid("a", 5)], VersionState::Live);
        assert_eq!(st[&sid("a", 4)], VersionState::Archival);
        assert_eq!(st[&sid("a", 3)], VersionState::Archival);
        assert_eq!(st[&sid("a", 2)], VersionState::Expired);
        assert_eq!(st[&sid("a", 1)], VersionState::Expired);
        // Default policy: the newest is live, the rest archival.
        assert_eq!(st[&sid("b", 1)], VersionState::Live);
        // Age limit: older than 5 days at day 10 expires (live ones never).
        pols.get_mut("a").unwrap().retain = None;
        pols.get_mut("a").unwrap().retain_days = Some(5);
        let st = version_states(&snaps, &pols, 10 * 86_400 * 1_000_000_000);
        assert_eq!(st[&sid("a", 4)], VersionState::Expired);
        assert_eq!(st[&sid("a", 5)], VersionState::Live);
    }
}
