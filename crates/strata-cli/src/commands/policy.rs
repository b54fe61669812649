//! `strata policy`: a series' lifecycle policy (live window, retention).

use crate::cli::{open, Cli};
use crate::output::Out;
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct PolicyArgs {
    /// The series (all series with a stored policy when omitted).
    series: Option<String>,
    /// Newest versions kept live (segment-level dedup, fastest restore).
    #[arg(long)]
    live: Option<u32>,
    /// Versions retained in all, live ones included.
    #[arg(long, conflicts_with = "retain_all")]
    retain: Option<u32>,
    /// Versions older than this many days expire.
    #[arg(long)]
    retain_days: Option<u32>,
    /// Retain every version (clears --retain and --retain-days).
    #[arg(long)]
    retain_all: bool,
}

pub fn run(cli: &Cli, out: &Out, a: &PolicyArgs) -> Result<i32> {
    let PolicyArgs {
        series,
        live,
        retain,
        retain_days,
        retain_all,
    } = a;
    use strata_store::repo::lifecycle::{list_policies, policy_of, set_policy};
    let repo = open(cli)?;
    let mut policies = list_policies(&repo)?;
    let changing = live.is_some() || retain.is_some() || retain_days.is_some() || *retain_all;
    if let Some(series) = series {
        let mut p = policy_of(&policies, series);
        if changing {
            if !repo
                .list_snapshots_tolerant()?
                .0
                .iter()
                .any(|(_, s)| &s.series == series)
            {
                out.warn(&format!(
                    "no snapshot of series {series:?} yet; the policy applies once there is"
                ));
            }
            if let Some(l) = live {
                p.live = *l;
            }
            if let Some(r) = retain {
                p.retain = Some(*r);
            }
            if let Some(d) = retain_days {
                p.retain_days = Some(*d);
            }
            if *retain_all {
                p.retain = None;
                p.retain_days = None;
            }
            set_policy(&repo, &p)?;
        }
        policies.insert(series.clone(), p);
    }
    let mut list: Vec<_> = policies
        .values()
        .filter(|p| series.as_ref().is_none_or(|s| &p.series == s))
        .cloned()
        .collect();
    list.sort_by(|a, b| a.series.cmp(&b.series));
    out.result(&serde_json::to_value(&list)?, || {
        let mut t = String::new();
        for p in &list {
            t += &format!(
                "{}: live {}, retain {}{}\n",
                p.series,
                p.live,
                p.retain
                    .map(|r| format!("{r} versions"))
                    .unwrap_or_else(|| "all versions".into()),
                p.retain_days
                    .map(|d| format!(", at most {d} days"))
                    .unwrap_or_default()
            );
        }
        if list.is_empty() {
            t = "no policies set (default: live 1, retain all)".into();
        }
        t.trim_end().to_string()
    });
    Ok(0)
}
