//! Retention policies in the manner of restic's `forget --keep-*`: which
//! snapshots a policy keeps and why.
//!
//! The selection is pure (no I/O, no clock, no environment): the caller
//! lists the snapshots, passes "now" and the time zone in which calendar
//! buckets are cut, and forgets the snapshots whose [`Decision`] says
//! `keep: false` (see [`crate::ops::forget`]).
//!
//! Semantics follow restic's `ApplyPolicy`
//! (`internal/restic/snapshot_policy.go`):
//!
//! * Snapshots are grouped **per series** (Strata's analogue of restic's
//!   host + paths group) and each group is handled on its own, newest
//!   first (by time, then version).
//! * `last N` keeps the N newest snapshots.
//! * `hourly`/`daily`/`weekly`/`monthly`/`yearly N` keep the newest
//!   snapshot of each of the N most recent buckets (hours, days, ISO weeks,
//!   months, years in the given time zone) that hold a snapshot. As restic
//!   does since 0.17, when a rule still has count left on reaching the
//!   group's **oldest** snapshot, that snapshot is kept too (even if its
//!   bucket already has a kept snapshot), which keeps the longest history
//!   the counts allow; its reason carries `(oldest)`.
//! * [`KeepCount::Unlimited`] (restic's `unlimited`, `-1`) keeps one
//!   snapshot per bucket for every bucket.
//! * `within D` keeps the snapshots strictly newer than *latest − D*, where
//!   *latest* is the group's newest snapshot that is not in the future
//!   (not after `now_ns`) — relative to the newest snapshot, **not** to
//!   now, exactly as restic: a series that stopped being backed up keeps
//!   its last stretch instead of expiring whole. The subtraction is Go's
//!   `AddDate(-y, -m, -d)` (calendar fields overflow into the next month,
//!   so 31 March − 1 month is 3 March, not 29 February) followed by
//!   subtracting the hours as an exact duration. If no snapshot of a group
//!   is at or before now, every snapshot of it counts as within (restic's
//!   reference is then the zero time).
//! * `tags` keeps every snapshot carrying any of the listed tags.
//! * A snapshot kept by any rule is kept; every kept snapshot lists the
//!   rules that kept it, every removed one lists none.
//!
//! Differences from restic, all deliberate: buckets are cut in the time
//! zone the caller passes (restic uses the offset each snapshot was taken
//! in; Strata stores UTC only); durations also accept `w` (weeks = 7 days),
//! reject negative numbers and repeated units; each `--keep-tag` value is
//! one tag (restic's comma-separated tag lists, which must all be present,
//! are not interpreted).

use crate::error::{Result, StoreError};
use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use strata_core::format::Snapshot;
use strata_core::id::SnapshotId;

/// How many buckets a count rule (`--keep-last`, `--keep-daily`, …) keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeepCount {
    /// At most this many; `Limit(0)` is the same as no rule (restic's
    /// default of 0).
    Limit(u32),
    /// One per bucket, for every bucket (restic's `unlimited` or `-1`).
    Unlimited,
}

impl KeepCount {
    /// Whether the rule keeps anything (`Limit(0)` does not).
    pub fn is_set(self) -> bool {
        self != KeepCount::Limit(0)
    }

    /// Parses `N` (a non-negative integer), `unlimited` or `-1`.
    pub fn parse(s: &str) -> Result<Self> {
        let t = s.trim();
        if t == "unlimited" || t == "-1" {
            return Ok(KeepCount::Unlimited);
        }
        t.parse::<u32>().map(KeepCount::Limit).map_err(|_| {
            StoreError::Invalid(format!(
                "invalid count {s:?}: expected a non-negative number, \"unlimited\" or -1"
            ))
        })
    }
}

impl From<u32> for KeepCount {
    fn from(n: u32) -> Self {
        KeepCount::Limit(n)
    }
}

impl FromStr for KeepCount {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        KeepCount::parse(s)
    }
}

impl fmt::Display for KeepCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepCount::Limit(n) => write!(f, "{n}"),
            KeepCount::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// A restic-style calendar duration such as `2y5m7d3h` (see
/// [`parse_within`]). Years, months, weeks and days are calendar fields;
/// hours are exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeepWithin {
    pub years: u32,
    pub months: u32,
    pub weeks: u32,
    pub days: u32,
    pub hours: u32,
}

impl KeepWithin {
    /// Whether every field is 0 (such a duration keeps nothing and counts
    /// as no rule, as in restic).
    pub fn is_zero(&self) -> bool {
        *self == KeepWithin::default()
    }

    /// The instant (ns since the epoch) `self` before `latest_ns`, with
    /// Go's `AddDate` normalisation in `tz`; `i128::MIN` when that lies
    /// outside the representable calendar (everything is then within).
    fn cutoff_ns(&self, latest_ns: i64, tz: &TimeZone) -> i128 {
        let dt = tz.to_datetime(timestamp(latest_ns));
        let calendar = || -> Option<Timestamp> {
            let months = i64::from(dt.year()) * 12 + i64::from(dt.month())
                - 1
                - 12 * i64::from(self.years)
                - i64::from(self.months);
            let year = i16::try_from(months.div_euclid(12)).ok()?;
            let month = i8::try_from(months.rem_euclid(12) + 1).ok()?;
            // Day overflow runs into the neighbouring months, as in Go.
            let days = i64::from(dt.day()) - 1 - 7 * i64::from(self.weeks) - i64::from(self.days);
            let date = Date::new(year, month, 1)
                .ok()?
                .checked_add(Span::new().try_days(days).ok()?)
                .ok()?;
            tz.to_ambiguous_timestamp(date.to_datetime(dt.time()))
                .compatible()
                .ok()
        };
        match calendar() {
            Some(t) => t.as_nanosecond() - i128::from(self.hours) * 3_600_000_000_000,
            None => i128::MIN,
        }
    }
}

impl fmt::Display for KeepWithin {
    /// Canonical form, e.g. `2y5m7d3h` (`0h` when zero).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0h");
        }
        for (n, unit) in [
            (self.years, 'y'),
            (self.months, 'm'),
            (self.weeks, 'w'),
            (self.days, 'd'),
            (self.hours, 'h'),
        ] {
            if n != 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for KeepWithin {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        parse_within(s)
    }
}

/// Parses a restic-style duration: one or more `NUMBER UNIT` pairs with
/// units `y` (years), `m` (months), `w` (weeks), `d` (days), `h` (hours),
/// e.g. `2y5m7d3h`, `36h`, `2w`. Each unit at most once; no signs, no
/// spaces inside.
pub fn parse_within(s: &str) -> Result<KeepWithin> {
    let fail = |detail: String| {
        StoreError::Invalid(format!(
            "invalid duration {s:?}: {detail}; expected numbers each followed by a unit, \
             e.g. \"2y5m7d3h\" (y = years, m = months, w = weeks, d = days, h = hours)"
        ))
    };
    let text = s.trim();
    if text.is_empty() {
        return Err(fail("it is empty".into()));
    }
    let mut out = KeepWithin::default();
    let mut seen = String::new();
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let field = match c {
            'y' => &mut out.years,
            'm' => &mut out.months,
            'w' => &mut out.weeks,
            'd' => &mut out.days,
            'h' => &mut out.hours,
            _ => return Err(fail(format!("{c:?} is not a unit"))),
        };
        if number.is_empty() {
            return Err(fail(format!("unit '{c}' has no number before it")));
        }
        if seen.contains(c) {
            return Err(fail(format!("unit '{c}' is given twice")));
        }
        *field = number
            .parse()
            .map_err(|_| fail(format!("{number} is too large")))?;
        seen.push(c);
        number.clear();
    }
    if !number.is_empty() {
        return Err(fail(format!("number {number} has no unit")));
    }
    Ok(out)
}

/// A `forget --keep-*` policy. A snapshot kept by any rule is kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeepPolicy {
    /// Keep the newest N snapshots.
    pub last: Option<KeepCount>,
    /// Keep the newest snapshot of each of the last N hours with one.
    pub hourly: Option<KeepCount>,
    /// … days.
    pub daily: Option<KeepCount>,
    /// … ISO 8601 weeks (Monday to Sunday; week-numbering year).
    pub weekly: Option<KeepCount>,
    /// … months.
    pub monthly: Option<KeepCount>,
    /// … years.
    pub yearly: Option<KeepCount>,
    /// Keep snapshots newer than the group's newest snapshot minus this.
    pub within: Option<KeepWithin>,
    /// Keep snapshots carrying any of these tags.
    pub tags: Vec<String>,
}

impl KeepPolicy {
    /// True when no rule would keep anything: counts unset or 0, no
    /// (or a zero) duration, no tags. Callers should refuse such a policy
    /// rather than pass it to [`apply`], which then keeps everything.
    pub fn is_empty(&self) -> bool {
        self.counts()
            .iter()
            .all(|(_, c)| !c.is_some_and(KeepCount::is_set))
            && self.within.is_none_or(|w| w.is_zero())
            && self.tags.is_empty()
    }

    fn counts(&self) -> [(Period, Option<KeepCount>); 6] {
        [
            (Period::Last, self.last),
            (Period::Hourly, self.hourly),
            (Period::Daily, self.daily),
            (Period::Weekly, self.weekly),
            (Period::Monthly, self.monthly),
            (Period::Yearly, self.yearly),
        ]
    }
}

/// What the policy decided for one snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Snapshot id.
    pub id: String,
    pub series: String,
    pub version: u32,
    /// The snapshot's time (ns since the epoch, UTC).
    pub time_ns: i64,
    pub keep: bool,
    /// Why it is kept, e.g. `last`, `daily 2025-01-03`, `weekly 2025-W01`,
    /// `monthly 2025-01 (oldest)`, `within 7d`, `tag prod`; empty when it
    /// is to be removed.
    pub reasons: Vec<String>,
}

/// The bucketing of a count rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Period {
    Last,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Yearly,
}

impl Period {
    fn name(self) -> &'static str {
        match self {
            Period::Last => "last",
            Period::Hourly => "hourly",
            Period::Daily => "daily",
            Period::Weekly => "weekly",
            Period::Monthly => "monthly",
            Period::Yearly => "yearly",
        }
    }

    /// The bucket of the `nr`-th newest snapshot, taken at civil time `dt`
    /// (`last` puts every snapshot in a bucket of its own).
    fn key(self, nr: usize, dt: DateTime) -> i64 {
        let (y, m, d, h) = (
            i64::from(dt.year()),
            i64::from(dt.month()),
            i64::from(dt.day()),
            i64::from(dt.hour()),
        );
        match self {
            Period::Last => nr as i64,
            Period::Hourly => ((y * 100 + m) * 100 + d) * 100 + h,
            Period::Daily => (y * 100 + m) * 100 + d,
            Period::Weekly => {
                let w = dt.date().iso_week_date();
                i64::from(w.year()) * 100 + i64::from(w.week())
            }
            Period::Monthly => y * 100 + m,
            Period::Yearly => y,
        }
    }

    /// The reason given for a snapshot this rule keeps.
    fn reason(self, dt: DateTime) -> String {
        let label = match self {
            Period::Last => return "last".to_string(),
            Period::Hourly => dt.strftime("%Y-%m-%dT%H").to_string(),
            Period::Daily => dt.strftime("%Y-%m-%d").to_string(),
            Period::Weekly => {
                let w = dt.date().iso_week_date();
                format!("{:04}-W{:02}", w.year(), w.week())
            }
            Period::Monthly => dt.strftime("%Y-%m").to_string(),
            Period::Yearly => dt.strftime("%Y").to_string(),
        };
        format!("{} {label}", self.name())
    }
}

/// A count rule while a group is walked.
struct CountRule {
    period: Period,
    /// Buckets still to keep; `None` = unlimited.
    remaining: Option<u32>,
    /// Bucket of the last snapshot this rule kept.
    last_key: Option<i64>,
}

/// Applies `policy` to `snaps`: one decision per snapshot, ordered by
/// series, then version (then id). `now_ns` (ns since the epoch) only
/// decides which snapshots are in the future and so cannot be the
/// reference of `within`; `tz` is where hour/day/week/month/year buckets
/// begin and in which `within`'s calendar arithmetic is done.
///
/// An empty policy ([`KeepPolicy::is_empty`]) keeps everything, each with
/// the reason `policy is empty`, as restic does; callers should reject it
/// before getting here.
pub fn apply(
    snaps: &[(SnapshotId, Snapshot)],
    policy: &KeepPolicy,
    now_ns: i64,
    tz: &TimeZone,
) -> Vec<Decision> {
    let mut out = if policy.is_empty() {
        snaps
            .iter()
            .map(|(id, s)| decision(id, s, vec!["policy is empty".to_string()]))
            .collect()
    } else {
        let mut groups: BTreeMap<&str, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
        for s in snaps {
            groups.entry(s.1.series.as_str()).or_default().push(s);
        }
        let mut out = Vec::with_capacity(snaps.len());
        for group in groups.into_values() {
            out.extend(apply_group(group, policy, now_ns, tz));
        }
        out
    };
    out.sort_by(|a, b| (&a.series, a.version, &a.id).cmp(&(&b.series, b.version, &b.id)));
    out
}

fn decision(id: &str, s: &Snapshot, reasons: Vec<String>) -> Decision {
    Decision {
        id: id.to_string(),
        series: s.series.clone(),
        version: s.version,
        time_ns: s.time_ns,
        keep: !reasons.is_empty(),
        reasons,
    }
}

fn timestamp(ns: i64) -> Timestamp {
    // Every i64 of nanoseconds (years 1677 to 2262) is a valid Timestamp.
    Timestamp::from_nanosecond(i128::from(ns)).expect("i64 nanoseconds are within jiff's range")
}

/// Restic's `ApplyPolicy` on one group (one series), policy not empty.
fn apply_group(
    mut group: Vec<&(SnapshotId, Snapshot)>,
    policy: &KeepPolicy,
    now_ns: i64,
    tz: &TimeZone,
) -> Vec<Decision> {
    // Newest first; equal times by version, then id, for determinism.
    group.sort_by(|a, b| (b.1.time_ns, b.1.version, &b.0).cmp(&(a.1.time_ns, a.1.version, &a.0)));
    let within = policy.within.filter(|w| !w.is_zero()).map(|w| {
        let latest = group
            .iter()
            .map(|s| s.1.time_ns)
            .filter(|&t| t <= now_ns)
            .max();
        (w, latest.map_or(i128::MIN, |l| w.cutoff_ns(l, tz)))
    });
    let mut rules: Vec<CountRule> = policy
        .counts()
        .into_iter()
        .filter_map(|(period, count)| match count? {
            KeepCount::Limit(0) => None,
            KeepCount::Limit(n) => Some(CountRule {
                period,
                remaining: Some(n),
                last_key: None,
            }),
            KeepCount::Unlimited => Some(CountRule {
                period,
                remaining: None,
                last_key: None,
            }),
        })
        .collect();
    let oldest = group.len().saturating_sub(1);
    let mut out = Vec::with_capacity(group.len());
    for (nr, (id, s)) in group.iter().map(|x| (&x.0, &x.1)).enumerate() {
        let dt = tz.to_datetime(timestamp(s.time_ns));
        let mut reasons = Vec::new();
        for t in &policy.tags {
            if s.tags.contains(t) {
                reasons.push(format!("tag {t}"));
            }
        }
        if let Some((w, cutoff)) = within {
            if i128::from(s.time_ns) > cutoff {
                reasons.push(format!("within {w}"));
            }
        }
        for rule in &mut rules {
            if rule.remaining == Some(0) {
                continue;
            }
            let key = rule.period.key(nr, dt);
            let new_bucket = rule.last_key != Some(key);
            if new_bucket || nr == oldest {
                rule.last_key = Some(key);
                if let Some(r) = &mut rule.remaining {
                    *r -= 1;
                }
                let mut reason = rule.period.reason(dt);
                if !new_bucket {
                    reason.push_str(" (oldest)");
                }
                reasons.push(reason);
            }
        }
        out.push(decision(id, s, reasons));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    const NS: i64 = 1_000_000_000;
    const HOUR: i64 = 3600 * NS;
    const DAY: i64 = 24 * HOUR;

    /// ns since the epoch of a UTC civil time.
    fn utc(y: i16, mo: i8, d: i8, h: i8, mi: i8) -> i64 {
        let dt = jiff::civil::datetime(y, mo, d, h, mi, 0, 0);
        TimeZone::UTC
            .to_timestamp(dt)
            .unwrap()
            .as_nanosecond()
            .try_into()
            .unwrap()
    }

    use crate::testutil::snapshot_id as sid;

    fn snap(series: &str, version: u32, time_ns: i64, tags: &[&str]) -> (SnapshotId, Snapshot) {
        let s = Snapshot {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..crate::testutil::snapshot(series, version, time_ns)
        };
        (sid(series, version), s)
    }

    /// One series, versions 1.. in the order of `times`.
    fn series(name: &str, times: &[i64]) -> Vec<(SnapshotId, Snapshot)> {
        times
            .iter()
            .enumerate()
            .map(|(i, &t)| snap(name, i as u32 + 1, t, &[]))
            .collect()
    }

    fn far_future() -> i64 {
        utc(2200, 1, 1, 0, 0)
    }

    /// Versions kept, in version order.
    fn kept(ds: &[Decision]) -> Vec<u32> {
        ds.iter().filter(|d| d.keep).map(|d| d.version).collect()
    }

    fn reasons_of(ds: &[Decision], version: u32) -> Vec<String> {
        ds.iter()
            .find(|d| d.version == version)
            .unwrap()
            .reasons
            .clone()
    }

    fn run(snaps: &[(SnapshotId, Snapshot)], p: &KeepPolicy) -> Vec<Decision> {
        apply(snaps, p, far_future(), &TimeZone::UTC)
    }

    fn daily(n: u32) -> KeepPolicy {
        KeepPolicy {
            daily: Some(KeepCount::Limit(n)),
            ..Default::default()
        }
    }

    #[test]
    fn thirty_days_keep_daily_seven() {
        let start = utc(2025, 1, 1, 12, 0);
        let times: Vec<i64> = (0..30).map(|i| start + i * DAY).collect();
        let ds = run(&series("a", &times), &daily(7));
        assert_eq!(kept(&ds), (24..=30).collect::<Vec<_>>());
        assert_eq!(reasons_of(&ds, 30), vec!["daily 2025-01-30"]);
        assert_eq!(reasons_of(&ds, 24), vec!["daily 2025-01-24"]);
        assert!(reasons_of(&ds, 23).is_empty());
    }

    #[test]
    fn same_day_keeps_the_newer() {
        let d = |day, h| utc(2025, 3, day, h, 0);
        // Version 3 and 4 on the same day; 4 is newer.
        let times = [d(1, 9), d(2, 9), d(3, 8), d(3, 20), d(4, 9), d(5, 9)];
        let ds = run(&series("a", &times), &daily(3));
        assert_eq!(kept(&ds), vec![4, 5, 6]);
        assert_eq!(reasons_of(&ds, 4), vec!["daily 2025-03-03"]);
    }

    #[test]
    fn oldest_is_kept_while_counts_remain() {
        // Three snapshots on one day, keep-daily 7: the newest for the day
        // and, as restic since 0.17, the group's oldest.
        let times = [
            utc(2025, 3, 1, 8, 0),
            utc(2025, 3, 1, 12, 0),
            utc(2025, 3, 1, 18, 0),
        ];
        let ds = run(&series("a", &times), &daily(7));
        assert_eq!(kept(&ds), vec![1, 3]);
        assert_eq!(reasons_of(&ds, 1), vec!["daily 2025-03-01 (oldest)"]);
        assert_eq!(reasons_of(&ds, 3), vec!["daily 2025-03-01"]);
    }

    #[test]
    fn weekly_uses_iso_weeks_across_the_year_boundary() {
        // 2020-W53 runs from Monday 2020-12-28 to Sunday 2021-01-03.
        let times = [
            utc(2020, 12, 27, 12, 0), // Sun, 2020-W52
            utc(2020, 12, 28, 12, 0), // Mon, 2020-W53
            utc(2021, 1, 1, 12, 0),   // Fri, 2020-W53
            utc(2021, 1, 3, 12, 0),   // Sun, 2020-W53
            utc(2021, 1, 4, 12, 0),   // Mon, 2021-W01
            utc(2021, 1, 10, 12, 0),  // Sun, 2021-W01
            utc(2021, 1, 11, 12, 0),  // Mon, 2021-W02
        ];
        let p = KeepPolicy {
            weekly: Some(KeepCount::Limit(3)),
            ..Default::default()
        };
        let ds = run(&series("a", &times), &p);
        assert_eq!(kept(&ds), vec![4, 6, 7]);
        assert_eq!(reasons_of(&ds, 7), vec!["weekly 2021-W02"]);
        assert_eq!(reasons_of(&ds, 6), vec!["weekly 2021-W01"]);
        assert_eq!(reasons_of(&ds, 4), vec!["weekly 2020-W53"]);
    }

    #[test]
    fn monthly_and_yearly() {
        let times = [
            utc(2023, 6, 1, 0, 0),
            utc(2024, 1, 31, 23, 0),
            utc(2024, 2, 1, 0, 0),
            utc(2024, 2, 29, 12, 0),
            utc(2024, 3, 15, 0, 0),
            utc(2024, 3, 31, 0, 0),
        ];
        let p = KeepPolicy {
            monthly: Some(KeepCount::Limit(2)),
            ..Default::default()
        };
        let ds = run(&series("a", &times), &p);
        assert_eq!(kept(&ds), vec![4, 6]);
        assert_eq!(reasons_of(&ds, 4), vec!["monthly 2024-02"]);
        let p = KeepPolicy {
            yearly: Some(KeepCount::Unlimited),
            ..Default::default()
        };
        let ds = run(&series("a", &times), &p);
        // Newest of 2024, newest of 2023 (also the oldest).
        assert_eq!(kept(&ds), vec![1, 6]);
        assert_eq!(reasons_of(&ds, 1), vec!["yearly 2023"]);
    }

    #[test]
    fn hourly() {
        let t0 = utc(2025, 5, 5, 10, 0);
        let times = [
            t0,
            t0 + 20 * 60 * NS,
            t0 + HOUR,
            t0 + 2 * HOUR + 5 * 60 * NS,
        ];
        let p = KeepPolicy {
            hourly: Some(KeepCount::Limit(2)),
            ..Default::default()
        };
        let ds = run(&series("a", &times), &p);
        assert_eq!(kept(&ds), vec![3, 4]);
        assert_eq!(reasons_of(&ds, 4), vec!["hourly 2025-05-05T12"]);
    }

    #[test]
    fn last_and_daily_overlap() {
        let times = [
            utc(2025, 1, 1, 10, 0),
            utc(2025, 1, 2, 10, 0),
            utc(2025, 1, 2, 20, 0),
            utc(2025, 1, 3, 8, 0),
            utc(2025, 1, 3, 12, 0),
            utc(2025, 1, 3, 18, 0),
        ];
        let p = KeepPolicy {
            last: Some(KeepCount::Limit(2)),
            daily: Some(KeepCount::Limit(2)),
            ..Default::default()
        };
        let ds = run(&series("a", &times), &p);
        assert_eq!(kept(&ds), vec![3, 5, 6]);
        assert_eq!(reasons_of(&ds, 6), vec!["last", "daily 2025-01-03"]);
        assert_eq!(reasons_of(&ds, 5), vec!["last"]);
        assert_eq!(reasons_of(&ds, 3), vec!["daily 2025-01-02"]);
    }

    #[test]
    fn keep_last_unlimited_keeps_all() {
        let times: Vec<i64> = (0..5).map(|i| i * HOUR).collect();
        let p = KeepPolicy {
            last: Some(KeepCount::Unlimited),
            ..Default::default()
        };
        assert_eq!(kept(&run(&series("a", &times), &p)), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn within_is_relative_to_the_newest_snapshot() {
        let t0 = utc(2020, 1, 1, 12, 0);
        let times: Vec<i64> = (0..=10).map(|i| t0 + i * DAY).collect();
        let p = KeepPolicy {
            within: Some(parse_within("3d").unwrap()),
            ..Default::default()
        };
        // "Now" is years later: relative to now nothing would be kept.
        let now = utc(2025, 1, 1, 0, 0);
        let ds = apply(&series("a", &times), &p, now, &TimeZone::UTC);
        // Day 7 is exactly newest - 3d: not newer, so removed.
        assert_eq!(kept(&ds), vec![9, 10, 11]);
        assert_eq!(reasons_of(&ds, 11), vec!["within 3d"]);
    }

    #[test]
    fn within_ignores_future_snapshots_as_reference() {
        let t0 = utc(2020, 1, 1, 12, 0);
        let mut times: Vec<i64> = (0..=10).map(|i| t0 + i * DAY).collect();
        times.push(t0 + 400 * DAY); // in the future of `now`
        let p = KeepPolicy {
            within: Some(parse_within("1d12h").unwrap()),
            ..Default::default()
        };
        let now = t0 + 20 * DAY;
        let ds = apply(&series("a", &times), &p, now, &TimeZone::UTC);
        assert_eq!(kept(&ds), vec![10, 11, 12]);
        // All in the future: everything is within.
        let ds = apply(&series("a", &times), &p, t0 - DAY, &TimeZone::UTC);
        assert_eq!(kept(&ds).len(), times.len());
    }

    #[test]
    fn within_month_arithmetic_is_gos() {
        // Go: 2024-03-31 minus one month is "2024-02-31" = 2024-03-02.
        let newest = utc(2024, 3, 31, 0, 0);
        let times = [
            utc(2024, 2, 29, 12, 0),
            utc(2024, 3, 2, 0, 0),
            utc(2024, 3, 2, 0, 1),
            newest,
        ];
        let p = KeepPolicy {
            within: Some(parse_within("1m").unwrap()),
            ..Default::default()
        };
        assert_eq!(kept(&run(&series("a", &times), &p)), vec![3, 4]);
        // Years and weeks: 2024-03-31 - 1y2w = 2023-03-17.
        let times = [utc(2023, 3, 17, 0, 0), utc(2023, 3, 17, 0, 1), newest];
        let p = KeepPolicy {
            within: Some(parse_within("1y2w").unwrap()),
            ..Default::default()
        };
        assert_eq!(kept(&run(&series("a", &times), &p)), vec![2, 3]);
    }

    #[test]
    fn keep_tag() {
        let snaps = vec![
            snap("a", 1, DAY, &["prod", "x"]),
            snap("a", 2, 2 * DAY, &["test"]),
            snap("a", 3, 3 * DAY, &["y"]),
            snap("a", 4, 4 * DAY, &[]),
        ];
        let p = KeepPolicy {
            tags: vec!["prod".into(), "test".into(), "x".into()],
            ..Default::default()
        };
        let ds = run(&snaps, &p);
        assert_eq!(kept(&ds), vec![1, 2]);
        assert_eq!(reasons_of(&ds, 1), vec!["tag prod", "tag x"]);
        assert_eq!(reasons_of(&ds, 2), vec!["tag test"]);
    }

    #[test]
    fn series_are_independent_and_output_is_ordered() {
        let mut snaps = series("b", &[DAY, 2 * DAY, 3 * DAY]);
        snaps.extend(series("a", &[10 * DAY, 11 * DAY]));
        snaps.reverse();
        let p = KeepPolicy {
            last: Some(KeepCount::Limit(1)),
            ..Default::default()
        };
        let ds = run(&snaps, &p);
        let order: Vec<(&str, u32, bool)> = ds
            .iter()
            .map(|d| (d.series.as_str(), d.version, d.keep))
            .collect();
        assert_eq!(
            order,
            vec![
                ("a", 1, false),
                ("a", 2, true),
                ("b", 1, false),
                ("b", 2, false),
                ("b", 3, true)
            ]
        );
    }

    #[test]
    fn buckets_follow_the_time_zone() {
        let times = [
            utc(2024, 12, 31, 12, 0),
            utc(2025, 1, 1, 10, 0),
            utc(2025, 1, 1, 12, 0),
            utc(2025, 1, 1, 23, 30),
        ];
        let snaps = series("a", &times);
        let ds = apply(&snaps, &daily(2), far_future(), &TimeZone::UTC);
        assert_eq!(kept(&ds), vec![1, 4]);
        assert_eq!(reasons_of(&ds, 4), vec!["daily 2025-01-01"]);
        // In UTC+2, 23:30 UTC is 01:30 on 2 January.
        let plus2 = TimeZone::fixed(jiff::tz::offset(2));
        let ds = apply(&snaps, &daily(2), far_future(), &plus2);
        assert_eq!(kept(&ds), vec![3, 4]);
        assert_eq!(reasons_of(&ds, 4), vec!["daily 2025-01-02"]);
        assert_eq!(reasons_of(&ds, 3), vec!["daily 2025-01-01"]);
    }

    #[test]
    fn empty_policy_keeps_everything() {
        let p = KeepPolicy {
            daily: Some(KeepCount::Limit(0)),
            within: Some(KeepWithin::default()),
            ..Default::default()
        };
        assert!(p.is_empty());
        assert!(KeepPolicy::default().is_empty());
        let ds = run(&series("a", &[DAY, 2 * DAY]), &p);
        assert!(ds
            .iter()
            .all(|d| d.keep && d.reasons == vec!["policy is empty"]));
        assert!(!daily(1).is_empty());
        let tags_only = KeepPolicy {
            tags: vec!["t".into()],
            ..Default::default()
        };
        assert!(!tags_only.is_empty());
        assert!(apply(&[], &daily(1), 0, &TimeZone::UTC).is_empty());
    }

    #[test]
    fn parse_within_accepts_and_rejects() {
        let w = parse_within("2y5m7d3h").unwrap();
        assert_eq!(
            w,
            KeepWithin {
                years: 2,
                months: 5,
                weeks: 0,
                days: 7,
                hours: 3
            }
        );
        assert_eq!(w.to_string(), "2y5m7d3h");
        assert_eq!(parse_within(" 2w ").unwrap().to_string(), "2w");
        assert_eq!(parse_within("36h").unwrap().hours, 36);
        assert!(parse_within("0d").unwrap().is_zero());
        for bad in [
            "",
            "5",
            "d",
            "5x",
            "1d2d",
            "-1d",
            "1.5d",
            "1 d",
            "99999999999y",
        ] {
            let e = parse_within(bad).unwrap_err().to_string();
            assert!(e.contains("y = years"), "{bad:?}: {e}");
        }
        assert!(parse_within("5x").unwrap_err().to_string().contains("'x'"));
    }

    #[test]
    fn keep_count_parses() {
        assert_eq!(KeepCount::parse("7").unwrap(), KeepCount::Limit(7));
        assert_eq!(KeepCount::parse("unlimited").unwrap(), KeepCount::Unlimited);
        assert_eq!("-1".parse::<KeepCount>().unwrap(), KeepCount::Unlimited);
        assert!(KeepCount::parse("-2").is_err());
        assert!(KeepCount::parse("many").is_err());
        assert_eq!(KeepCount::Unlimited.to_string(), "unlimited");
    }

    fn count() -> impl Strategy<Value = Option<KeepCount>> {
        prop_oneof![
            3 => Just(None),
            4 => (0u32..6).prop_map(|n| Some(KeepCount::Limit(n))),
            1 => Just(Some(KeepCount::Unlimited)),
        ]
    }

    fn policy() -> impl Strategy<Value = KeepPolicy> {
        (
            [count(), count(), count(), count(), count(), count()],
            prop::option::of((0u32..3, 0u32..3, 0u32..10, 0u32..48)),
            prop::collection::vec(prop::sample::select(vec!["p", "q"]), 0..2),
        )
            .prop_map(|(c, w, tags)| KeepPolicy {
                last: c[0],
                hourly: c[1],
                daily: c[2],
                weekly: c[3],
                monthly: c[4],
                yearly: c[5],
                within: w.map(|(months, weeks, days, hours)| KeepWithin {
                    months,
                    weeks,
                    days,
                    hours,
                    ..Default::default()
                }),
                tags: tags.into_iter().map(String::from).collect(),
            })
    }

    /// Snapshots of up to three series over about two years.
    fn snapshots() -> impl Strategy<Value = Vec<(SnapshotId, Snapshot)>> {
        let base = utc(2023, 6, 1, 0, 0);
        prop::collection::vec(
            (
                prop::sample::select(vec!["a", "b", "c"]),
                0..(800 * DAY),
                prop::collection::vec(prop::sample::select(vec!["p", "q", "r"]), 0..2),
            ),
            0..40,
        )
        .prop_map(move |raw| {
            let mut next: HashMap<&str, u32> = HashMap::new();
            raw.into_iter()
                .map(|(s, t, tags)| {
                    let v = next.entry(s).or_insert(0);
                    *v += 1;
                    snap(s, *v, base + t, &tags)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn invariants(
            snaps in snapshots(),
            p in policy(),
            offset in -12i8..=14,
            now_days in 0i64..900,
        ) {
            let tz = TimeZone::fixed(jiff::tz::offset(offset));
            let now = utc(2023, 6, 1, 0, 0) + now_days * DAY;
            let ds = apply(&snaps, &p, now, &tz);
            // One decision per snapshot, ordered by series then version.
            prop_assert_eq!(ds.len(), snaps.len());
            let ids: HashSet<&str> = ds.iter().map(|d| d.id.as_str()).collect();
            prop_assert!(snaps.iter().all(|(id, _)| ids.contains(id.as_str())));
            let order: Vec<(&str, u32)> =
                ds.iter().map(|d| (d.series.as_str(), d.version)).collect();
            prop_assert!(order.windows(2).all(|w| w[0] < w[1]));
            // Kept exactly when there is a reason.
            for d in &ds {
                prop_assert_eq!(d.keep, !d.reasons.is_empty(), "{:?}", d);
            }
            let mut groups: BTreeMap<&str, Vec<&Decision>> = BTreeMap::new();
            for d in &ds {
                groups.entry(d.series.as_str()).or_default().push(d);
            }
            let any_count = p.counts().iter().any(|(_, c)| c.is_some_and(KeepCount::is_set));
            for group in groups.values() {
                let kept = group.iter().filter(|d| d.keep).count();
                match p.last {
                    Some(KeepCount::Limit(n)) => {
                        prop_assert!(kept >= (n as usize).min(group.len()))
                    }
                    Some(KeepCount::Unlimited) => prop_assert_eq!(kept, group.len()),
                    None => {}
                }
                let newest = group
                    .iter()
                    .max_by_key(|d| (d.time_ns, d.version, d.id.clone()))
                    .unwrap();
                if any_count {
                    prop_assert!(newest.keep, "newest {:?} removed", newest);
                }
                // A limited count rule keeps at most N snapshots.
                for (period, c) in p.counts() {
                    if let Some(KeepCount::Limit(n)) = c {
                        let prefix = format!("{} ", period.name());
                        let by_rule = group
                            .iter()
                            .filter(|d| {
                                d.reasons
                                    .iter()
                                    .any(|r| r == period.name() || r.starts_with(&prefix))
                            })
                            .count();
                        prop_assert!(by_rule <= n as usize);
                    }
                }
            }
            if p.is_empty() {
                prop_assert!(ds.iter().all(|d| d.keep));
            }
        }
    }
}
