//! `strata volume resize`: a stopped volume made larger (the new blocks
//! read as zeros: nothing is allocated) or, asked to, smaller (the blocks
//! past the new end dropped, their disk blocks freed and given back to
//! the host).

use crate::config::{check_size, read_state, State, BLOCK};
use crate::error::{ioe, Result, VolumeError};
use crate::files::{open_rw, punch_holes, read_counts, write_json};
use crate::state::Volume;
use crate::volume::open::rebuild_refs;
use std::fs::{self, File};
use std::path::Path;

impl Volume {
    /// Gives the stopped, cleanly closed volume in `dir` the size `size`
    /// (a positive multiple of 4 KiB); smaller only with `shrink`. Returns
    /// the old size. Its next snapshot reads everything (the image's
    /// size changed). A crash in the middle leaves it to be recounted at
    /// its next open, at the old or the new size.
    pub fn resize(dir: &Path, size: u64, shrink: bool) -> Result<u64> {
        let _lock = Self::lock(dir)?;
        let mut cfg = Self::config(dir)?;
        let old = cfg.size;
        check_size(size)?;
        if size == old {
            return Ok(old);
        }
        if size < old && !shrink {
            return Err(VolumeError::Invalid(format!(
                "{size} bytes is smaller than the volume ({old} bytes): what lies past it would be dropped (add --shrink to do that)"
            )));
        }
        let state = read_state(dir)?;
        let journals = crate::journal::existing(dir).map_err(ioe(dir.display().to_string()))?;
        let unreplayed = journals
            .iter()
            .any(|(_, p)| fs::metadata(p).map(|m| m.len() > 0).unwrap_or(true));
        if !state.clean || unreplayed {
            return Err(VolumeError::Invalid(
                "the volume was not closed cleanly: serve it (or snapshot it) once, which replays its journal, then resize it".into(),
            ));
        }
        let mark = |clean: bool| {
            write_json(
                &dir.join("state.json"),
                &State {
                    clean,
                    counters: state.counters.clone(),
                },
            )
        };
        // From here a crash has the next open recount the references.
        mark(false)?;
        let nblocks = size / BLOCK as u64;
        // Nothing past the old end may come back into view when growing.
        let map = open_rw(&dir.join("map"))?;
        let len = map.metadata().map_err(ioe("map"))?.len();
        let keep = (size.min(old) / BLOCK as u64) * 8;
        if len > keep {
            map.set_len(keep).map_err(ioe("map"))?;
            map.sync_all().map_err(ioe("map"))?;
        }
        if size < old {
            let data = open_rw(&dir.join("data"))?;
            let end = data.metadata().map_err(ioe("data"))?.len() / BLOCK as u64;
            let refs = open_rw(&dir.join("refs"))?;
            let before = read_counts(&refs, end)?;
            rebuild_refs(dir, &map, &refs, nblocks, end)?;
            let after = read_counts(&refs, end)?;
            let freed: Vec<u64> = (0..end)
                .filter(|&d| before[d as usize] != 0 && after[d as usize] == 0)
                .collect();
            punch_holes(&data, &freed);
        }
        cfg.size = size;
        // Its time is the image's time in snapshots: kept.
        let cfg_path = dir.join("volume.json");
        let time = fs::metadata(&cfg_path).and_then(|m| m.modified()).ok();
        write_json(&cfg_path, &cfg)?;
        if let Some(t) = time {
            File::options()
                .write(true)
                .open(&cfg_path)
                .and_then(|f| f.set_modified(t))
                .map_err(ioe("volume.json"))?;
        }
        // What changed since the last snapshot counts no longer (another
        // size: the next snapshot reads everything).
        match fs::remove_file(dir.join("changes.json")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(VolumeError::Io("changes.json".into(), e))
            }
            _ => {}
        }
        mark(true)?;
        Ok(old)
    }
}
