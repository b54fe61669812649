//! The systems the runner compares: Strata (one entry per index strategy
//! the binary reports), restic and borg, each driven through its CLI at
//! default settings with encryption off where the tool allows it.

use crate::measure::{run, Measured};
use crate::s3::S3Target;
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One system under test.
pub trait System {
    fn name(&self) -> String;
    /// Settings worth quoting next to results (compression, encryption).
    fn settings(&self) -> String;
    fn init(&mut self, repo: &Path) -> Result<()>;
    /// Backs up `src` as `version` (1-based) of `series`.
    fn backup(&mut self, repo: &Path, series: &str, version: usize, src: &Path)
        -> Result<Measured>;
    /// Out-of-line work the system does after every backup, timed apart
    /// from it (Strata `segment` with the RevDedup lifecycle: `strata
    /// maintain`); `None` when the system has none.
    fn after_backup(&mut self, _repo: &Path) -> Result<Option<Measured>> {
        Ok(None)
    }
    /// Restores `version` of `series` into `target`; returns the measured run
    /// and the directory in `target` where `src` landed.
    fn restore(
        &mut self,
        repo: &Path,
        series: &str,
        version: usize,
        src: &Path,
        target: &Path,
    ) -> Result<(Measured, PathBuf)>;
    /// Deletes versions and frees their space.
    fn delete(&mut self, repo: &Path, versions: &[(String, usize)]) -> Result<Measured>;
    /// Whether the system keeps its repository in a bucket (`+s3`).
    fn wants_s3(&self) -> bool {
        false
    }
    /// The S3 server the runner started for it.
    fn set_s3(&mut self, _target: S3Target) {}
    /// Where its repository's bytes are on this machine (a bucket's
    /// directory in the S3 server's data, for `+s3`).
    fn stored_dir(&self, repo: &Path) -> PathBuf {
        repo.to_path_buf()
    }
    /// Strata only: containers and regions read by the last restore.
    fn last_restore_reads(&self) -> Option<(u64, u64)> {
        None
    }
    /// A trivial run of the same program (`--version`), whose storage reads
    /// after a page-cache drop are the cost of loading the program itself;
    /// the runner subtracts them from each restore's reads.
    fn baseline_command(&self) -> Command;
}

/// Where a system keeps its local cache for `repo`: a sibling of the
/// repository in the work directory (`repo-NAME.cache`), removed together
/// with the repository before each run.
pub fn cache_dir(repo: &Path) -> PathBuf {
    repo.with_extension("cache")
}

/// A system's repository bytes: its bucket's directory on the runner's S3
/// server (`+s3`), else the repository directory.
fn stored_dir(s3: Option<&S3Target>, name: &str, repo: &Path) -> PathBuf {
    s3.map_or_else(|| repo.to_path_buf(), |t| t.bucket_dir(name))
}

fn in_target(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").unwrap_or(src))
}

pub struct Strata {
    pub bin: PathBuf,
    pub index: String,
    /// Extra `strata init` options from the system name
    /// (`strata-segment+segment-kib=1024` → `--segment-kib 1024`).
    pub init_args: Vec<(String, String)>,
    /// Back up with `--force-read`: every file read and looked up in the
    /// index, none reused from the previous version (to compare index
    /// strategies on all the data, not only on changed files).
    pub force_read: bool,
    /// Whether this system runs the RevDedup lifecycle: index `segment` and
    /// a binary with `strata maintain` (decided by `init`).
    pub maintain: bool,
    /// Whether `strata backup` runs the lifecycle itself (by default, as a
    /// user gets it); otherwise the harness runs `strata maintain`.
    pub lifecycle_in_backup: bool,
    /// Seconds of the lifecycle inside the last backup.
    last_lifecycle: Option<f64>,
    last_reads: Option<(u64, u64)>,
    /// `+s3`: the repository is `s3://BUCKET/repo` on this server.
    pub wants_s3: bool,
    pub s3: Option<S3Target>,
}

/// What `strata features --json` reports that the harness uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Features {
    pub index_strategies: Vec<String>,
    /// `strata maintain` exists (out-of-line reverse dedup and expiry).
    pub maintain: bool,
    /// `strata backup` runs the lifecycle after its commit by default.
    pub lifecycle_after_backup: bool,
}

impl Strata {
    pub fn new(bin: PathBuf, index: &str) -> Self {
        Strata {
            bin,
            index: index.to_string(),
            init_args: Vec::new(),
            force_read: false,
            maintain: false,
            lifecycle_in_backup: false,
            last_lifecycle: None,
            last_reads: None,
            wants_s3: false,
            s3: None,
        }
    }

    /// A system from its name: `strata-INDEX[+OPTION=VALUE...]`, each
    /// option passed to `strata init` as `--OPTION VALUE`.
    pub fn from_spec(bin: PathBuf, spec: &str) -> Result<Self> {
        let rest = spec
            .strip_prefix("strata-")
            .ok_or_else(|| anyhow!("{spec:?} does not start with strata-"))?;
        let mut parts = rest.split('+');
        let index = parts.next().unwrap_or_default();
        let mut s = Strata::new(bin, index);
        for p in parts {
            if p == "s3" {
                s.wants_s3 = true;
                continue;
            }
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| anyhow!("{p:?} in {spec:?}: use +OPTION=VALUE"))?;
            s.init_args.push((k.to_string(), v.to_string()));
        }
        Ok(s)
    }

    fn cmd(&self, repo: &Path) -> Command {
        let mut c = Command::new(&self.bin);
        match &self.s3 {
            Some(t) => {
                c.arg("--repo")
                    .arg(format!("s3://{}/repo", S3Target::bucket(&self.name())));
                c.envs(t.env());
            }
            None => {
                c.arg("--repo").arg(repo);
            }
        }
        c.arg("--json");
        c.env_remove("STRATA_PASSWORD").env_remove("STRATA_REPO");
        // The local index cache lives next to the repository, inside the
        // run's work directory (the runner deletes it with the repository),
        // so runs never read or fill ~/.cache/strata and every system starts
        // cold the same way (restic's cache is placed alike).
        c.env("STRATA_CACHE_DIR", cache_dir(repo));
        c
    }

    /// Index strategies the binary knows (`strata features --json`).
    pub fn strategies(bin: &Path) -> Result<Vec<String>> {
        Ok(Self::features(bin)?.index_strategies)
    }

    /// What the binary supports (`strata features --json`). A binary
    /// without the `maintain` field has no `strata maintain`.
    pub fn features(bin: &Path) -> Result<Features> {
        let out = Command::new(bin)
            .args(["features", "--json"])
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("parsing `strata features --json`")?;
        Ok(Features {
            index_strategies: v["index_strategies"]
                .as_array()
                .ok_or_else(|| anyhow!("no index_strategies in `strata features --json`"))?
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect(),
            maintain: v["maintain"].as_bool().unwrap_or(false),
            lifecycle_after_backup: v["lifecycle_after_backup"].as_bool().unwrap_or(false),
        })
    }
}

impl System for Strata {
    fn name(&self) -> String {
        let mut n = format!("strata-{}", self.index);
        for (k, v) in &self.init_args {
            n += &format!("+{k}={v}");
        }
        if self.wants_s3 {
            n += "+s3";
        }
        n
    }

    fn settings(&self) -> String {
        format!(
            "index {}{}, zstd 3, FastCDC 8 KiB, unencrypted (checksums){}{}{}",
            self.index,
            self.init_args
                .iter()
                .map(|(k, v)| format!(", --{k} {v}"))
                .collect::<String>(),
            if self.force_read {
                "; backups with --force-read (every file read)"
            } else {
                ""
            },
            match (self.maintain, self.lifecycle_in_backup) {
                (true, true) => {
                    "; defaults: the RevDedup lifecycle runs inside every backup \
                     (timed with it), deletion by `forget --prune`"
                }
                (true, false) => {
                    "; `strata maintain` after every backup (RevDedup lifecycle), \
                     deletion by `forget` without --prune"
                }
                _ => "",
            },
            if self.wants_s3 {
                "; repository in an S3 bucket (versitygw on loopback)"
            } else {
                ""
            }
        )
    }

    fn init(&mut self, repo: &Path) -> Result<()> {
        // The RevDedup lifecycle (reverse dedup of versions leaving the
        // live window, expiry) applies to the segment index, when the
        // binary has it.
        let f = Self::features(&self.bin)?;
        self.maintain = self.index == "segment" && f.maintain;
        self.lifecycle_in_backup = self.maintain && f.lifecycle_after_backup;
        let mut c = self.cmd(repo);
        c.args(["init", "--index", &self.index]);
        for (k, v) in &self.init_args {
            c.arg(format!("--{k}")).arg(v);
        }
        run(&mut c, &[0])?;
        Ok(())
    }

    fn after_backup(&mut self, repo: &Path) -> Result<Option<Measured>> {
        if !self.maintain {
            return Ok(None);
        }
        if self.lifecycle_in_backup {
            // Already done, inside the backup's own time.
            return Ok(self.last_lifecycle.map(|seconds| Measured {
                seconds,
                ..Default::default()
            }));
        }
        let m = run(self.cmd(repo).arg("maintain"), &[0])?;
        let v: serde_json::Value = serde_json::from_str(&m.stdout)
            .with_context(|| format!("parsing `strata maintain --json`: {:?}", m.stdout))?;
        if v["seconds"].as_f64().is_none() {
            bail!(
                "`strata maintain --json` printed no \"seconds\": {}",
                m.stdout
            );
        }
        Ok(Some(m))
    }

    fn backup(
        &mut self,
        repo: &Path,
        series: &str,
        _version: usize,
        src: &Path,
    ) -> Result<Measured> {
        let mut c = self.cmd(repo);
        c.args(["backup", "--series", series]).arg(src);
        if self.force_read {
            c.arg("--force-read");
        }
        let m = run(&mut c, &[0])?;
        let v: serde_json::Value = serde_json::from_str(&m.stdout).unwrap_or_default();
        self.last_lifecycle = v["lifecycle"]["seconds"].as_f64();
        Ok(m)
    }

    fn restore(
        &mut self,
        repo: &Path,
        series: &str,
        version: usize,
        src: &Path,
        target: &Path,
    ) -> Result<(Measured, PathBuf)> {
        let m = run(
            self.cmd(repo)
                .args(["restore", &format!("{series}@{version}"), "--target"])
                .arg(target),
            &[0],
        )?;
        let v: serde_json::Value = serde_json::from_str(&m.stdout).unwrap_or_default();
        self.last_reads = Some((
            v["containers_read"].as_u64().unwrap_or(0),
            v["regions_read"].as_u64().unwrap_or(0),
        ));
        Ok((m, in_target(target, src)))
    }

    fn delete(&mut self, repo: &Path, versions: &[(String, usize)]) -> Result<Measured> {
        let mut c = self.cmd(repo);
        c.arg("forget");
        for (s, v) in versions {
            c.arg(format!("{s}@{v}"));
        }
        // With the lifecycle run by `strata maintain`, archival versions
        // are deleted by dropping their stamped containers, no gc. When the
        // backups run the lifecycle (the default), archival versions keep
        // their data in the shared pool, so deletion frees it with
        // `forget --prune` as for every other index.
        if !self.maintain || self.lifecycle_in_backup {
            c.arg("--prune");
        }
        run(&mut c, &[0])
    }

    fn last_restore_reads(&self) -> Option<(u64, u64)> {
        self.last_reads
    }

    fn wants_s3(&self) -> bool {
        self.wants_s3
    }

    fn set_s3(&mut self, target: S3Target) {
        self.s3 = Some(target);
    }

    fn stored_dir(&self, repo: &Path) -> PathBuf {
        stored_dir(self.s3.as_ref(), &self.name(), repo)
    }

    fn baseline_command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--version");
        c
    }
}

/// restic at default settings (it always encrypts; compression `auto`);
/// `restic+s3` keeps its repository in a bucket of the runner's S3 server.
#[derive(Default)]
pub struct Restic {
    ids: std::collections::HashMap<(String, usize), String>,
    pub wants_s3: bool,
    s3: Option<S3Target>,
}

impl Restic {
    /// `restic+s3`.
    pub fn on_s3() -> Self {
        Restic {
            wants_s3: true,
            ..Default::default()
        }
    }

    fn cmd(&self, repo: &Path) -> Command {
        let mut c = Command::new("restic");
        match &self.s3 {
            Some(t) => {
                c.arg("-r").arg(format!(
                    "s3:{}/{}/repo",
                    t.endpoint,
                    S3Target::bucket(&self.name())
                ));
                c.envs(t.env());
            }
            None => {
                c.arg("-r").arg(repo);
            }
        }
        c.env("RESTIC_PASSWORD", "bench")
            .env("RESTIC_CACHE_DIR", cache_dir(repo));
        c
    }
}

impl System for Restic {
    fn name(&self) -> String {
        if self.wants_s3 {
            "restic+s3".into()
        } else {
            "restic".into()
        }
    }

    fn wants_s3(&self) -> bool {
        self.wants_s3
    }

    fn set_s3(&mut self, target: S3Target) {
        self.s3 = Some(target);
    }

    fn stored_dir(&self, repo: &Path) -> PathBuf {
        stored_dir(self.s3.as_ref(), &self.name(), repo)
    }

    fn settings(&self) -> String {
        let s = "default (compression auto = zstd fast, AES-256 encryption always on)";
        if self.wants_s3 {
            format!("{s}; repository in an S3 bucket (versitygw on loopback)")
        } else {
            s.into()
        }
    }

    fn init(&mut self, repo: &Path) -> Result<()> {
        run(self.cmd(repo).arg("init"), &[0])?;
        Ok(())
    }

    fn backup(
        &mut self,
        repo: &Path,
        series: &str,
        version: usize,
        src: &Path,
    ) -> Result<Measured> {
        let m = run(
            self.cmd(repo)
                .args(["backup", "--json", "--host", "bench", "--tag", series])
                .arg(src),
            &[0, 3],
        )?;
        let id = m
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message_type"] == "summary")
            .and_then(|v| v["snapshot_id"].as_str().map(String::from))
            .ok_or_else(|| anyhow!("restic backup printed no snapshot id"))?;
        self.ids.insert((series.to_string(), version), id);
        Ok(m)
    }

    fn restore(
        &mut self,
        repo: &Path,
        series: &str,
        version: usize,
        src: &Path,
        target: &Path,
    ) -> Result<(Measured, PathBuf)> {
        let id = self
            .ids
            .get(&(series.to_string(), version))
            .ok_or_else(|| anyhow!("no restic snapshot for {series}@{version}"))?;
        let m = run(
            self.cmd(repo).args(["restore", id, "--target"]).arg(target),
            &[0],
        )?;
        Ok((m, in_target(target, src)))
    }

    fn delete(&mut self, repo: &Path, versions: &[(String, usize)]) -> Result<Measured> {
        let mut c = self.cmd(repo);
        c.arg("forget");
        for k in versions {
            c.arg(
                self.ids
                    .get(k)
                    .ok_or_else(|| anyhow!("no restic snapshot for {k:?}"))?,
            );
        }
        c.arg("--prune");
        run(&mut c, &[0])
    }

    fn baseline_command(&self) -> Command {
        let mut c = Command::new("restic");
        c.arg("version");
        c
    }
}

/// borg 1.x with encryption off and zstd level 3.
pub struct Borg;

fn borg_cmd() -> Command {
    let mut c = Command::new("borg");
    c.env("BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK", "yes")
        .env("BORG_RELOCATED_REPO_ACCESS_IS_OK", "yes")
        .env("BORG_PASSPHRASE", "");
    c
}

impl System for Borg {
    fn name(&self) -> String {
        "borg".into()
    }

    fn settings(&self) -> String {
        "encryption none, compression zstd,3".into()
    }

    fn init(&mut self, repo: &Path) -> Result<()> {
        run(borg_cmd().args(["init", "-e", "none"]).arg(repo), &[0])?;
        Ok(())
    }

    fn backup(
        &mut self,
        repo: &Path,
        series: &str,
        version: usize,
        src: &Path,
    ) -> Result<Measured> {
        run(
            borg_cmd()
                .args(["create", "--compression", "zstd,3"])
                .arg(format!(
                    "{}::{}-v{version}",
                    repo.display(),
                    sanitize(series)
                ))
                .arg(src),
            &[0, 1],
        )
    }

    fn restore(
        &mut self,
        repo: &Path,
        series: &str,
        version: usize,
        src: &Path,
        target: &Path,
    ) -> Result<(Measured, PathBuf)> {
        let m = run(
            borg_cmd().current_dir(target).arg("extract").arg(format!(
                "{}::{}-v{version}",
                repo.display(),
                sanitize(series)
            )),
            &[0],
        )?;
        Ok((m, in_target(target, src)))
    }

    fn delete(&mut self, repo: &Path, versions: &[(String, usize)]) -> Result<Measured> {
        let mut total = Measured::default();
        for (s, v) in versions {
            let m = run(
                borg_cmd()
                    .arg("delete")
                    .arg(format!("{}::{}-v{v}", repo.display(), sanitize(s))),
                &[0],
            )?;
            total.seconds += m.seconds;
            total.peak_rss_bytes = total.peak_rss_bytes.max(m.peak_rss_bytes);
        }
        let m = run(borg_cmd().arg("compact").arg(repo), &[0])?;
        total.seconds += m.seconds;
        total.peak_rss_bytes = total.peak_rss_bytes.max(m.peak_rss_bytes);
        Ok(total)
    }

    fn baseline_command(&self) -> Command {
        let mut c = borg_cmd();
        c.arg("--version");
        c
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Whether a peer's binary is installed.
pub fn installed(bin: &str) -> bool {
    // restic has a `version` command and no `--version` flag.
    let arg = if bin == "restic" {
        "version"
    } else {
        "--version"
    };
    Command::new(bin)
        .arg(arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in `strata` that logs its arguments and STRATA_CACHE_DIR and
    /// prints `features` as given.
    pub(crate) fn fake_strata(dir: &Path, features: &str) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let log = dir.join("calls.log");
        let bin = dir.join("strata");
        let script = format!(
            "#!/bin/sh\n\
             echo \"$* | cache=$STRATA_CACHE_DIR\" >> '{log}'\n\
             case \" $* \" in\n\
             *' features '*) echo '{features}' ;;\n\
             *' maintain '*) echo '{{\"seconds\": 0.01}}' ;;\n\
             *' restore '*) echo '{{\"containers_read\": 3, \"regions_read\": 5}}' ;;\n\
             *) echo '{{}}' ;;\n\
             esac\n",
            log = log.display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        (bin, log)
    }

    #[test]
    fn strata_commands_use_a_cache_dir_beside_the_repo() {
        let t = tempfile::tempdir().unwrap();
        let (bin, log) = fake_strata(t.path(), r#"{"index_strategies": ["exact"]}"#);
        let repo = t.path().join("work/repo-strata-exact");
        let mut s = Strata::new(bin, "exact");
        s.init(&repo).unwrap();
        s.backup(&repo, "a", 1, t.path()).unwrap();
        s.restore(&repo, "a", 1, t.path(), &t.path().join("r"))
            .unwrap();
        assert_eq!(s.last_restore_reads(), Some((3, 5)));
        s.delete(&repo, &[("a".into(), 1)]).unwrap();
        let calls = std::fs::read_to_string(log).unwrap();
        let want = format!(
            "cache={}",
            t.path().join("work/repo-strata-exact.cache").display()
        );
        let repo_calls: Vec<&str> = calls.lines().filter(|l| l.contains("--repo")).collect();
        assert_eq!(repo_calls.len(), 4, "{calls}");
        assert!(repo_calls.iter().all(|l| l.ends_with(&want)), "{calls}");
    }

    /// Whether a Strata system with these features and index runs the
    /// lifecycle, what `after_backup` measured, and the commands (without
    /// `--repo DIR --json` and paths) of init, a backup and a deletion.
    fn lifecycle_calls(features: &str, index: &str) -> (bool, Option<f64>, Vec<String>) {
        let t = tempfile::tempdir().unwrap();
        let (bin, log) = fake_strata(t.path(), features);
        let repo = t.path().join("repo");
        let mut s = Strata::new(bin, index);
        s.init(&repo).unwrap();
        s.backup(&repo, "a", 1, t.path()).unwrap();
        let m = s.after_backup(&repo).unwrap();
        s.delete(&repo, &[("a".into(), 1), ("b".into(), 2)])
            .unwrap();
        let calls = std::fs::read_to_string(log).unwrap();
        let tmp = t.path().display().to_string();
        let calls = calls
            .lines()
            .map(|l| {
                l.split(" | ")
                    .next()
                    .unwrap()
                    .split(' ')
                    .filter(|a| *a != "--repo" && *a != "--json" && !a.starts_with(&tmp))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        (s.maintain, m.map(|m| m.seconds), calls)
    }

    #[test]
    fn segment_runs_maintain_and_forgets_without_prune_when_available() {
        let with = r#"{"index_strategies": ["exact", "segment"], "maintain": true}"#;
        let (on, secs, calls) = lifecycle_calls(with, "segment");
        assert!(on);
        assert!(secs.is_some_and(|s| s >= 0.0));
        assert_eq!(
            calls,
            [
                "features",
                "init --index segment",
                "backup --series a",
                "maintain",
                "forget a@1 b@2"
            ]
        );
        // Other index strategies keep gc-based deletion and no maintain.
        let (on, secs, calls) = lifecycle_calls(with, "exact");
        assert!(!on && secs.is_none());
        assert_eq!(
            calls[calls.len() - 2..],
            ["backup --series a", "forget a@1 b@2 --prune"]
        );
        // A binary whose backups run the lifecycle: no separate maintain
        // after a backup; its seconds come from the backup's report; a
        // deletion is forget --prune.
        let auto = r#"{"index_strategies": ["segment"], "maintain": true, "lifecycle_after_backup": true}"#;
        let (on, _, calls) = lifecycle_calls(auto, "segment");
        assert!(on);
        assert_eq!(
            calls,
            [
                "features",
                "init --index segment",
                "backup --series a",
                "forget a@1 b@2 --prune"
            ]
        );
        // A binary without maintain: as before.
        let without = r#"{"index_strategies": ["exact", "segment"]}"#;
        let (on, secs, calls) = lifecycle_calls(without, "segment");
        assert!(!on && secs.is_none());
        assert_eq!(
            calls[calls.len() - 2..],
            ["backup --series a", "forget a@1 b@2 --prune"]
        );
    }

    #[test]
    fn system_specs_carry_init_options() {
        let s =
            Strata::from_spec(PathBuf::from("strata"), "strata-segment+segment-kib=1024").unwrap();
        assert_eq!(s.index, "segment");
        assert_eq!(
            s.init_args,
            [("segment-kib".to_string(), "1024".to_string())]
        );
        assert_eq!(s.name(), "strata-segment+segment-kib=1024");
        assert!(s.settings().contains("--segment-kib 1024"));
        assert_eq!(
            Strata::from_spec(PathBuf::from("strata"), "strata-exact")
                .unwrap()
                .name(),
            "strata-exact"
        );
        assert!(Strata::from_spec(PathBuf::from("strata"), "strata-segment+oops").is_err());
    }
}
