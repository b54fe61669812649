//! Naming snapshots: ids and unique id prefixes, `SERIES@VERSION`,
//! `SERIES@latest`, and `latest` — which is unambiguous: the newest
//! version of the one series the filter (series, host, paths, tags)
//! leaves, else of the one series this host backs up; an error naming the
//! candidates otherwise (a `latest` that silently picked another series'
//! database dump would restore the wrong thing).

use crate::error::{Result, StoreError};
use crate::repo::{lock, Repository};
use strata_core::format::Snapshot;
use strata_core::id::SnapshotId;

/// Which snapshots a command considers (`--series`, `--host`, `--path`,
/// `--tag`; restic's snapshot filter). Empty: all.
#[derive(Clone, Debug, Default)]
pub struct SnapshotFilter {
    pub series: Option<String>,
    pub host: Option<String>,
    /// Snapshots that backed up every one of these paths.
    pub paths: Vec<String>,
    /// Snapshots carrying any of these tags.
    pub tags: Vec<String>,
}

impl SnapshotFilter {
    pub fn is_empty(&self) -> bool {
        self.series.is_none()
            && self.host.is_none()
            && self.paths.is_empty()
            && self.tags.is_empty()
    }

    pub fn matches(&self, s: &Snapshot) -> bool {
        self.series.as_ref().is_none_or(|x| &s.series == x)
            && self.host.as_ref().is_none_or(|h| &s.host == h)
            && self.paths.iter().all(|p| {
                s.paths
                    .iter()
                    .any(|q| q.trim_end_matches('/') == p.trim_end_matches('/'))
            })
            && (self.tags.is_empty() || self.tags.iter().any(|t| s.tags.contains(t)))
    }
}

/// Resolves `spec` among `all` (oldest first): a full id or unique hex
/// prefix, `SERIES@VERSION`, `SERIES@latest`, or `latest` within
/// `filter` (see the module doc; `this_host` picks the default series).
pub fn resolve(
    all: &[(SnapshotId, Snapshot)],
    spec: &str,
    filter: &SnapshotFilter,
    this_host: &str,
) -> Result<(SnapshotId, Snapshot)> {
    if spec == "latest" {
        return latest(all, filter, this_host);
    }
    if let Some((series, ver)) = spec.rsplit_once('@') {
        return in_series(all, spec, series, ver);
    }
    if spec.is_empty() || !spec.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(StoreError::NoSnapshot(spec.into()));
    }
    // `forget 2` is far more likely a version number than an id prefix.
    if spec.len() < 4 && spec.chars().all(|c| c.is_ascii_digit()) {
        return Err(StoreError::Invalid(format!(
            "{spec:?} looks like a version number: name a version as SERIES@{spec} \
             (an id prefix of digits only needs at least 4 of them)"
        )));
    }
    let spec_l = spec.to_ascii_lowercase();
    let m: Vec<_> = all
        .iter()
        .filter(|(id, _)| id.starts_with(&spec_l))
        .collect();
    match m.len() {
        0 => Err(StoreError::NoSnapshot(spec.into())),
        1 => Ok(m[0].clone()),
        _ => Err(ambiguous(spec, &m, "give more of the id")),
    }
}

/// `spec` names all of `m`: the error lists their short ids.
fn ambiguous(spec: &str, m: &[&(SnapshotId, Snapshot)], hint: &str) -> StoreError {
    StoreError::AmbiguousSnapshot {
        spec: spec.into(),
        candidates: short_list(
            m.iter()
                .map(|(id, _)| format!("{}…", &id[..id.len().min(8)])),
        ),
        hint: hint.into(),
    }
}

fn in_series(
    all: &[(SnapshotId, Snapshot)],
    spec: &str,
    series: &str,
    ver: &str,
) -> Result<(SnapshotId, Snapshot)> {
    let in_series: Vec<_> = all.iter().filter(|(_, s)| s.series == series).collect();
    if ver == "latest" {
        return in_series
            .iter()
            .max_by_key(|(_, s)| (s.version, s.time_ns))
            .map(|x| (*x).clone())
            .ok_or_else(|| StoreError::NoSnapshot(spec.into()));
    }
    // Digits past any version (u32) name no version: not a bad spec (a
    // caller may try them as an id prefix next).
    let digits = !ver.is_empty() && ver.bytes().all(|b| b.is_ascii_digit());
    let v: u32 = match ver.parse() {
        Ok(v) => v,
        Err(_) if digits => return Err(StoreError::NoSnapshot(spec.into())),
        Err(_) => {
            return Err(StoreError::Invalid(format!(
                "bad version {ver:?} in {spec:?}: use a number or `latest`"
            )))
        }
    };
    let m: Vec<_> = in_series
        .into_iter()
        .filter(|(_, s)| s.version == v)
        .collect();
    match m.len() {
        0 => Err(StoreError::NoSnapshot(spec.into())),
        1 => Ok(m[0].clone()),
        _ => Err(ambiguous(spec, &m, "name it by id")),
    }
}

/// The newest snapshot of the one series `filter` leaves; with no filter
/// and several series, of the one series of this host.
fn latest(
    all: &[(SnapshotId, Snapshot)],
    filter: &SnapshotFilter,
    this_host: &str,
) -> Result<(SnapshotId, Snapshot)> {
    let mut cand: Vec<&(SnapshotId, Snapshot)> =
        all.iter().filter(|(_, s)| filter.matches(s)).collect();
    let series_of = |c: &[&(SnapshotId, Snapshot)]| {
        let mut v: Vec<String> = c.iter().map(|(_, s)| s.series.clone()).collect();
        v.sort();
        v.dedup();
        v
    };
    let mut series = series_of(&cand);
    if series.len() > 1 && filter.is_empty() {
        let here: Vec<_> = cand
            .iter()
            .copied()
            .filter(|(_, s)| s.host == this_host)
            .collect();
        if series_of(&here).len() == 1 {
            cand = here;
            series = series_of(&cand);
        }
    }
    match series.len() {
        0 => Err(StoreError::NoSnapshot(if filter.is_empty() {
            "latest".into()
        } else {
            format!("latest ({})", describe(filter))
        })),
        1 => Ok(cand
            .iter()
            .max_by_key(|(_, s)| (s.version, s.time_ns))
            .map(|x| (*x).clone())
            .ok_or_else(|| StoreError::NoSnapshot("latest".into()))?),
        _ => Err(StoreError::AmbiguousSnapshot {
            spec: "latest".into(),
            candidates: short_list(series.iter().map(|s| format!("{s}@latest"))),
            hint: "name one, or narrow with --series/--host/--path".into(),
        }),
    }
}

/// Changes the tags of snapshots `ids` (full ids): `set` replaces them
/// (when given), then `add` and `remove` apply. The snapshot objects are
/// replaced in place under an exclusive lock, so ids stay the same.
/// Returns each snapshot's new tags.
pub fn retag(
    repo: &crate::repo::Repository,
    ids: &[SnapshotId],
    set: Option<&[String]>,
    add: &[String],
    remove: &[String],
) -> Result<Vec<(SnapshotId, Vec<String>)>> {
    let _lock = crate::repo::lock::acquire(repo, true, "tag")?;
    let mut out = Vec::new();
    for id in ids {
        let mut s = repo.load_snapshot(id)?;
        let mut tags: Vec<String> = set.map(<[String]>::to_vec).unwrap_or(s.tags.clone());
        for t in add {
            if !tags.contains(t) {
                tags.push(t.clone());
            }
        }
        tags.retain(|t| !remove.contains(t));
        if tags != s.tags {
            s.tags = tags.clone();
            repo.replace_snapshot(id, &s)?;
        }
        out.push((id.clone(), tags));
    }
    Ok(out)
}

fn describe(f: &SnapshotFilter) -> String {
    let mut parts = Vec::new();
    if let Some(s) = &f.series {
        parts.push(format!("series {s}"));
    }
    if let Some(h) = &f.host {
        parts.push(format!("host {h}"));
    }
    for p in &f.paths {
        parts.push(format!("path {p}"));
    }
    for t in &f.tags {
        parts.push(format!("tag {t}"));
    }
    parts.join(", ")
}

/// At most eight, then "and N more".
fn short_list(items: impl Iterator<Item = String>) -> String {
    let all: Vec<String> = items.collect();
    let mut s = all.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
    if all.len() > 8 {
        s += &format!(" and {} more", all.len() - 8);
    }
    s
}

/// Snapshot specs resolved against the repository.
impl Repository {
    /// Resolves `latest`, `SERIES@VERSION`, `SERIES@latest` or an id prefix
    /// among the readable snapshots.
    pub fn resolve_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        self.resolve_snapshot_in(spec, &SnapshotFilter::default())
    }

    /// As [`Repository::resolve_snapshot`], `latest` within `filter`.
    pub fn resolve_snapshot_in(
        &self,
        spec: &str,
        filter: &SnapshotFilter,
    ) -> Result<(SnapshotId, Snapshot)> {
        let (all, _) = self.list_snapshots_tolerant()?;
        resolve(&all, spec, filter, &lock::hostname())
    }
}

/// Snapshot resolution over an already loaded list (oldest first), with
/// no filter: see [`resolve`].
pub fn resolve_in(all: &[(SnapshotId, Snapshot)], spec: &str) -> Result<(SnapshotId, Snapshot)> {
    resolve(all, spec, &SnapshotFilter::default(), &lock::hostname())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(series: &str, version: u32, host: &str) -> Snapshot {
        Snapshot {
            host: host.into(),
            paths: vec![format!("/{series}")],
            ..crate::testutil::snapshot(series, version, version as i64)
        }
    }

    /// A snapshot id beginning with `p`.
    fn sid(p: &str) -> SnapshotId {
        SnapshotId::parse(&format!("{p:0<64}")).unwrap()
    }

    fn list() -> Vec<(SnapshotId, Snapshot)> {
        vec![
            (sid("a2660000"), snap("h1:/home", 1, "h1")),
            (sid("a2f00000"), snap("h1:/home", 2, "h1")),
            (sid("b0000000"), snap("h1:db", 1, "h1")),
            (sid("c0000000"), snap("h2:/srv", 1, "h2")),
        ]
    }

    #[test]
    fn prefixes_resolve_or_name_the_candidates() {
        let l = list();
        let f = SnapshotFilter::default();
        assert_eq!(resolve(&l, "a26", &f, "h1").unwrap().0, sid("a2660000"));
        assert_eq!(resolve(&l, "B", &f, "h1").unwrap().0, sid("b0000000"));
        assert!(resolve(&l, "2", &f, "h1")
            .unwrap_err()
            .to_string()
            .contains("SERIES@2"));
        let e = resolve(&l, "a2", &f, "h1").unwrap_err().to_string();
        assert!(e.contains("a2660000…") && e.contains("a2f00000…"), "{e}");
        assert!(matches!(
            resolve(&l, "d", &f, "h1"),
            Err(StoreError::NoSnapshot(_))
        ));
        assert!(matches!(
            resolve(&l, "zz", &f, "h1"),
            Err(StoreError::NoSnapshot(_))
        ));
    }

    /// `volume serve --at 460925553221` tries a version, then an id
    /// prefix: a number no version can have is no snapshot, not an error
    /// (an id prefix of 12 digits comes once in about 280 ids).
    #[test]
    fn a_version_past_any_is_no_snapshot() {
        let l = list();
        let f = SnapshotFilter::default();
        for spec in ["h1:/home@460925553221", "h1:/home@3"] {
            assert!(
                matches!(resolve(&l, spec, &f, "h1"), Err(StoreError::NoSnapshot(_))),
                "{spec}"
            );
        }
        let e = resolve(&l, "h1:/home@x1", &f, "h1").unwrap_err();
        assert!(e.to_string().contains("bad version"), "{e}");
    }

    #[test]
    fn latest_is_the_one_series_of_the_filter_or_an_error() {
        let l = list();
        let none = SnapshotFilter::default();
        // Host h1 has two series: ambiguous, both named.
        let e = resolve(&l, "latest", &none, "h1").unwrap_err().to_string();
        assert!(
            e.contains("h1:/home@latest") && e.contains("h1:db@latest"),
            "{e}"
        );
        // Host h2 has one: its newest.
        assert_eq!(
            resolve(&l, "latest", &none, "h2").unwrap().0,
            sid("c0000000")
        );
        let home = SnapshotFilter {
            paths: vec!["/h1:/home/".into()],
            ..Default::default()
        };
        assert_eq!(
            resolve(&l, "latest", &home, "h1").unwrap().0,
            sid("a2f00000")
        );
        let db = SnapshotFilter {
            series: Some("h1:db".into()),
            ..Default::default()
        };
        assert_eq!(
            resolve(&l, "latest", &db, "elsewhere").unwrap().0,
            sid("b0000000")
        );
        assert_eq!(
            resolve(&l, "h1:/home@latest", &none, "x").unwrap().0,
            sid("a2f00000")
        );
        assert_eq!(
            resolve(&l, "h1:/home@1", &none, "x").unwrap().0,
            sid("a2660000")
        );
        let nothing = SnapshotFilter {
            host: Some("h9".into()),
            ..Default::default()
        };
        assert!(resolve(&l, "latest", &nothing, "h1").is_err());
        // One series in all: no host needed.
        assert_eq!(
            resolve(&l[..2], "latest", &none, "other").unwrap().0,
            sid("a2f00000")
        );
    }
}
