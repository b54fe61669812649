//! Holds: disk blocks a volume keeps for its repository (the first part
//! of linked snapshots, `docs/design-linked-snapshots.md`). A hold names a
//! set of disk blocks (DBNs) the volume must neither reuse nor change,
//! because something outside it — a repository container linking the
//! blocks of a snapshot — reads them.
//!
//! - `holds/NAME.hold`: a versioned header, the blocks as sorted runs, a
//!   CRC-32C; written whole (a file of its own, synced, renamed, the
//!   directory synced). Each held block counts one more reference in
//!   `refs`, so nothing the block map does frees it.
//! - Releasing is a rename to `holds/NAME.released` ([`release`]), which
//!   another process (the repository's gc) may do while the volume is
//!   served. The volume picks releases up at a checkpoint: their counts
//!   subtracted, `refs` synced, then the files deleted. A recount after
//!   an unclean stop counts the map and `.hold` files only, so a release
//!   is never subtracted twice.

use crate::error::{Failure, Result, VolumeError};
use crate::files::read_counts_at;
use crate::mutex::lock;
use crate::state::{Disk, Volume};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The directory of a volume's holds.
pub const DIR: &str = "holds";
const HELD: &str = "hold";
const RELEASED: &str = "released";
const MAGIC: &[u8; 8] = b"STRHOLD\x01";

/// Whether `name` can name a hold: letters, digits, `-`, `_`; at most 64.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The runs of `dbns` (start, length), sorted, duplicates dropped.
pub fn runs_of(mut dbns: Vec<u64>) -> Vec<(u64, u64)> {
    dbns.sort_unstable();
    dbns.dedup();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for d in dbns {
        match out.last_mut() {
            Some((s, l)) if *s + *l == d => *l += 1,
            _ => out.push((d, 1)),
        }
    }
    out
}

/// A hold file's bytes.
pub fn encode(runs: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + runs.len() * 16);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(runs.len() as u64).to_le_bytes());
    for (s, l) in runs {
        b.extend_from_slice(&s.to_le_bytes());
        b.extend_from_slice(&l.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The runs of a hold file: checked whole (magic, length, CRC), sorted,
/// none empty or overlapping the one before.
pub fn decode(b: &[u8]) -> std::result::Result<Vec<(u64, u64)>, String> {
    if b.len() < 20 || &b[..8] != MAGIC {
        return Err("not a hold file of this version".into());
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err("its checksum does not match".into());
    }
    let n = u64::from_le_bytes(body[8..16].try_into().map_err(|_| "short")?);
    let rest = &body[16..];
    if n.checked_mul(16) != Some(rest.len() as u64) {
        return Err(format!("{n} runs in {} bytes", rest.len()));
    }
    let mut runs = Vec::with_capacity(n as usize);
    let mut next = 0u64;
    for c in rest.chunks_exact(16) {
        let s = u64::from_le_bytes(c[..8].try_into().map_err(|_| "short")?);
        let l = u64::from_le_bytes(c[8..].try_into().map_err(|_| "short")?);
        let end = s
            .checked_add(l)
            .ok_or("a run past the end of the numbers")?;
        if l == 0 || s < next {
            return Err("runs empty, out of order or overlapping".into());
        }
        next = end;
        runs.push((s, l));
    }
    Ok(runs)
}

fn path(dir: &Path, name: &str, ext: &str) -> PathBuf {
    dir.join(DIR).join(format!("{name}.{ext}"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn invalid_name(name: &str) -> VolumeError {
    VolumeError::Invalid(format!(
        "{name:?} cannot name a hold (letters, digits, `-`, `_`; at most 64)"
    ))
}

/// Writes hold `name` of the volume in `dir`: whole or not at all, and
/// durable when this returns.
pub(crate) fn write(dir: &Path, name: &str, runs: &[(u64, u64)]) -> Result<()> {
    if !valid_name(name) {
        return Err(invalid_name(name));
    }
    let holds = dir.join(DIR);
    let io = |e: io::Error| VolumeError::Io(format!("writing hold {name}"), e);
    fs::create_dir_all(&holds).map_err(io)?;
    let dst = path(dir, name, HELD);
    if dst.exists() || path(dir, name, RELEASED).exists() {
        return Err(VolumeError::Invalid(format!("hold {name} exists already")));
    }
    let tmp = holds.join(format!(".{name}.tmp"));
    let written = fs::write(&tmp, encode(runs))
        .and_then(|_| File::open(&tmp)?.sync_all())
        .and_then(|_| fs::rename(&tmp, &dst))
        .and_then(|_| sync_dir(&holds))
        .and_then(|_| sync_dir(dir));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

/// Releases hold `name` of the volume in `dir` (served or not): its
/// blocks are given back at the volume's next checkpoint. False if there
/// is no such hold.
pub fn release(dir: &Path, name: &str) -> Result<bool> {
    if !valid_name(name) {
        return Err(invalid_name(name));
    }
    match fs::rename(path(dir, name, HELD), path(dir, name, RELEASED)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(VolumeError::Io(format!("releasing hold {name}"), e)),
    }
    sync_dir(&dir.join(DIR)).map_err(|e| VolumeError::Io(format!("releasing hold {name}"), e))?;
    Ok(true)
}

/// The names of the volume's holds with extension `ext`.
fn names(dir: &Path, ext: &str) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir.join(DIR)) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(VolumeError::Io("reading the holds".into(), e)),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| VolumeError::Io("reading the holds".into(), e))?;
        let f = e.file_name();
        let Some(f) = f.to_str() else { continue };
        if let Some(n) = f.strip_suffix(ext).and_then(|n| n.strip_suffix('.')) {
            if valid_name(n) {
                out.push(n.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The names of the volume's holds (not released).
pub fn held(dir: &Path) -> Result<Vec<String>> {
    names(dir, HELD)
}

/// The names of the holds released and not yet given back.
pub(crate) fn released(dir: &Path) -> Result<Vec<String>> {
    names(dir, RELEASED)
}

/// The runs of hold `name` (`released`: of a released one); None when
/// the file is gone (released meanwhile, or given back).
pub(crate) fn read(dir: &Path, name: &str, released: bool) -> Result<Option<Vec<(u64, u64)>>> {
    let p = path(dir, name, if released { RELEASED } else { HELD });
    let b = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(VolumeError::Io(p.display().to_string(), e)),
    };
    decode(&b)
        .map(Some)
        .map_err(|why| VolumeError::Invalid(format!("hold file {}: {why}", p.display())))
}

/// Deletes a released hold once its blocks are given back.
pub(crate) fn forget_released(dir: &Path, name: &str) -> io::Result<()> {
    match fs::remove_file(path(dir, name, RELEASED)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// What [`count_into`] counted.
#[derive(Default)]
pub(crate) struct Counted {
    /// The holds counted.
    pub names: HashSet<String>,
    /// Blocks they name past the counts (damage: a data file cut short):
    /// the first, and how many.
    pub past_first: Option<u64>,
    pub past: u64,
    /// Hold files that could not be read, and why.
    pub damaged: Vec<String>,
    /// Blocks counted.
    pub blocks: u64,
}

/// Adds one to `counts[d]` for every block `d` of every hold, and of every
/// released hold not yet given back with `released` (`volume check` of a
/// stopped volume: its counts still hold those).
pub(crate) fn count_into(dir: &Path, counts: &mut [u32], released_too: bool) -> Result<Counted> {
    let mut out = Counted::default();
    let mut all: Vec<(String, bool)> = held(dir)?.into_iter().map(|n| (n, false)).collect();
    if released_too {
        all.extend(released(dir)?.into_iter().map(|n| (n, true)));
    }
    for (name, rel) in all {
        let runs = match read(dir, &name, rel) {
            Ok(Some(r)) => r,
            // Released meanwhile: not counted.
            Ok(None) => continue,
            Err(e) => {
                out.damaged.push(e.to_string());
                continue;
            }
        };
        for (s, l) in runs {
            // (Bounded by the counts: a run's length comes from a file.)
            let n = counts.len() as u64;
            let in_range = s.min(n)..(s + l).min(n);
            for d in in_range.clone() {
                counts[d as usize] += 1;
            }
            let outside = l - (in_range.end - in_range.start);
            if outside > 0 {
                out.past_first.get_or_insert(s.max(n));
                out.past += outside;
            }
            out.blocks += l;
        }
        out.names.insert(name);
    }
    Ok(out)
}

/// After a recount: released holds that were not counted (released
/// before it read them) are gone for good — nothing to give back.
pub(crate) fn drop_uncounted_releases(dir: &Path, counted: &HashSet<String>) -> Result<()> {
    for name in released(dir)? {
        if !counted.contains(&name) {
            forget_released(dir, &name).map_err(|e| VolumeError::Io(format!("hold {name}"), e))?;
        }
    }
    sync_dir(&dir.join(DIR)).or_else(|e| match e.kind() {
        io::ErrorKind::NotFound => Ok(()),
        _ => Err(VolumeError::Io("holds".into(), e)),
    })
}

impl Volume {
    /// Holds disk blocks `dbns` for `name` (a repository container that
    /// links them): from now on they are neither reused nor changed, until
    /// [`release`]. Each must be in use, or freed since the last checkpoint
    /// while a frozen image keeps it (a block a frozen map names and a
    /// client has overwritten since). Durable when this returns. Only a
    /// volume with dedup holds blocks (one without writes in place).
    pub fn hold(&self, name: &str, dbns: &[u64]) -> Result<()> {
        if !self.cfg.dedup {
            return Err(VolumeError::Invalid(
                "a volume without dedup writes its blocks in place: it holds none".into(),
            ));
        }
        let runs = runs_of(dbns.to_vec());
        if self.closing_or_stopped() {
            return Err(VolumeError::Invalid(
                "the volume is closed or stopped: it takes no holds".into(),
            ));
        }
        if !valid_name(name) {
            return Err(invalid_name(name));
        }
        // Taken already, by a snapshot that stopped before its stub and
        // is taken up again: the same blocks are held once (the file is
        // written before the counts, and a volume that stopped in between
        // recounts).
        if let Some(have) = read(&self.dir, name, false)? {
            return match have == runs {
                true => Ok(()),
                false => Err(VolumeError::Invalid(format!(
                    "hold {name} exists already, of other blocks"
                ))),
            };
        }
        // Checked, then the file written (its syncs) without the disk lock
        // — a served volume's destage and checkpoints go on meanwhile —,
        // then checked again and counted under it. (The blocks cannot be
        // reused in between: a frozen image keeps them, and a stopped
        // volume has nobody writing.)
        self.holdable(&lock(&self.disk), &runs)?;
        write(&self.dir, name, &runs)?;
        let mut d = lock(&self.disk);
        if let Err(e) = self.holdable(&d, &runs) {
            // Not counted yet: gone again (left by a crash here, a recount
            // would count it — blocks kept, never data lost).
            let _ = fs::remove_file(path(&self.dir, name, HELD));
            return Err(e);
        }
        let delta: HashMap<u64, i64> = runs
            .iter()
            .flat_map(|&(s, l)| (s..s + l).map(|b| (b, 1)))
            .collect();
        // The counts durable too (a close in between could mark the volume
        // clean over counts still in the page cache).
        if let Err(e) = crate::destage::apply_refs(&d.refs, &delta).and_then(|_| {
            d.refs
                .sync_data()
                .map_err(|e| VolumeError::Io("refs".into(), e))
        }) {
            // The hold is on disk and its counts not all taken: the volume
            // stops, and the next open recounts.
            drop(d);
            self.fail(Failure::new(format!("taking hold {name}: {e}"), None));
            return Err(e);
        }
        d.pending_free.retain(|b| !delta.contains_key(b));
        d.freeing.retain(|b| !delta.contains_key(b));
        Ok(())
    }

    /// Whether `runs` can be held now: each block within the data file,
    /// and in use or freed while a frozen image keeps it.
    fn holdable(&self, d: &Disk, runs: &[(u64, u64)]) -> Result<()> {
        // (It only grows.)
        let end = lock(&self.space).end;
        let pending: HashSet<u64> = d.pending_free.iter().chain(&d.freeing).copied().collect();
        for &(s, l) in runs {
            if s + l > end {
                return Err(VolumeError::Invalid(format!(
                    "blocks {s}..{} are past the end of the data file ({end} blocks)",
                    s + l
                )));
            }
            let counts = read_counts_at(&d.refs, s, l)?;
            if let Some(k) =
                (0..l).find(|&k| counts[k as usize] == 0 && !pending.contains(&(s + k)))
            {
                return Err(VolumeError::Invalid(format!(
                    "disk block {} is free: its data may be gone",
                    s + k
                )));
            }
        }
        Ok(())
    }

    /// Gives back the blocks of holds released since the last look (at
    /// the start of a checkpoint, under the disk lock): their counts
    /// subtracted, the blocks no longer in use freed as the destage's are.
    /// Their files go once the checkpoint has synced the counts
    /// ([`Volume::forget_given_back`]).
    pub(crate) fn pick_up_releases(&self, d: &mut Disk) {
        let names = match released(&self.dir) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("looking for released holds: {e}");
                return;
            }
        };
        for name in names {
            if d.released_applied.contains(&name) {
                continue;
            }
            let runs = match read(&self.dir, &name, true) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    // Its blocks stay counted until a recount: space
                    // lost, never data.
                    tracing::warn!("released hold {name} unreadable, its blocks kept: {e}");
                    d.released_applied.insert(name);
                    continue;
                }
            };
            let delta: HashMap<u64, i64> = runs
                .iter()
                .flat_map(|&(s, l)| (s..s + l).map(|b| (b, -1)))
                .collect();
            match crate::destage::apply_refs(&d.refs, &delta) {
                Ok(freed) => {
                    d.pending_free.extend(freed);
                    d.released_applied.insert(name);
                }
                Err(e) => {
                    // (Counts below zero: a damaged hold or refs file.)
                    tracing::warn!("giving back released hold {name}: {e}");
                    d.released_applied.insert(name);
                }
            }
        }
    }

    /// Deletes the files of the released holds given back, once the
    /// checkpoint has synced their counts (the holds directory synced).
    pub(crate) fn forget_given_back(&self, d: &mut Disk) {
        if d.released_applied.is_empty() {
            return;
        }
        let names: Vec<String> = d.released_applied.iter().cloned().collect();
        let mut gone = Vec::new();
        for name in names {
            match forget_released(&self.dir, &name) {
                Ok(()) => gone.push(name),
                Err(e) => tracing::warn!("deleting released hold {name}: {e}"),
            }
        }
        // Gone for good only once the directory is synced: until then they
        // stay given back, so the volume is not marked clean over a file a
        // power loss could bring back.
        match sync_dir(&self.dir.join(DIR)) {
            Ok(()) => {
                for name in gone {
                    d.released_applied.remove(&name);
                }
            }
            Err(e) => tracing::warn!("syncing the holds directory: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_round_trip_and_damage_is_refused() {
        let runs = runs_of(vec![9, 3, 4, 5, 9, 20]);
        assert_eq!(runs, [(3, 3), (9, 1), (20, 1)]);
        let b = encode(&runs);
        assert_eq!(decode(&b).unwrap(), runs);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(decode(&c).is_err(), "byte {i} flipped");
        }
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(decode(&encode(&[])).unwrap(), []);
        // Well formed but overlapping, or empty runs: refused.
        assert!(decode(&encode(&[(3, 3), (4, 1)])).is_err());
        assert!(decode(&encode(&[(3, 0)])).is_err());
        assert!(decode(&encode(&[(u64::MAX, 2)])).is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("0a1b-c_d"));
        for bad in ["", "../x", "a.b", "a/b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
