//! A volume created, opened (its journals replayed, its counts rebuilt
//! after an unclean stop) and its state saved.

use crate::blockmap::BlockMap;
use crate::changes::Changes;
use crate::config::*;
use crate::crypt::{Crypt, VolumeKey};
use crate::error::*;
use crate::files::*;
use crate::idedup::{Fp, MetaCache};
use crate::journal::{self, Journal, Record};
use crate::mutex::lock;
use crate::readahead::Readahead;
use crate::state::*;
use crate::stats::{Histogram, Persistent};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

impl Volume {
    /// Creates volume files in `dir` (which must not hold a volume).
    /// Its `format` is set from whether it is encrypted.
    pub fn create(dir: &Path, mut cfg: VolumeConfig) -> Result<()> {
        cfg.format = match cfg.encryption {
            Some(_) => FORMAT_ENCRYPTED,
            None => FORMAT,
        };
        check_size(cfg.size)?;
        if dir.join("volume.json").exists() {
            return Err(VolumeError::Invalid(format!(
                "a volume already exists at {}",
                dir.display()
            )));
        }
        fs::create_dir_all(dir).map_err(ioe(dir.display().to_string()))?;
        for f in ["data", "map", "refs", "fps"] {
            open_rw(&dir.join(f))?;
        }
        write_json(
            &dir.join("state.json"),
            &State {
                clean: true,
                counters: Persistent {
                    sequence_lengths: Histogram::with_buckets(65),
                    ..Default::default()
                },
            },
        )?;
        write_json(&dir.join("volume.json"), &cfg)
    }

    pub fn config(dir: &Path) -> Result<VolumeConfig> {
        let cfg: VolumeConfig = read_json(&dir.join("volume.json"))?;
        let want = match cfg.encryption {
            Some(_) => FORMAT_ENCRYPTED,
            None => FORMAT,
        };
        if cfg.format != want || cfg.block_size as usize != BLOCK {
            return Err(VolumeError::Invalid(format!(
                "{}: volume format {} / block size {} (this build: {FORMAT}, or {FORMAT_ENCRYPTED} with encryption / {BLOCK})",
                dir.display(),
                cfg.format,
                cfg.block_size
            )));
        }
        check_size(cfg.size)
            .map_err(|e| VolumeError::Invalid(format!("{}: {e}", dir.display())))?;
        Ok(cfg)
    }

    /// Opens a volume, recovers it after an unclean stop (reference
    /// counts from the map, the journal replayed) and starts destaging.
    pub fn open(dir: &Path) -> Result<Arc<Volume>> {
        Self::open_with(dir, true, None)
    }

    /// [`Volume::open`] with the volume's key (an encrypted volume needs
    /// it; a wrong one is refused).
    pub fn open_keyed(dir: &Path, key: Option<&VolumeKey>) -> Result<Arc<Volume>> {
        Self::open_with(dir, true, key)
    }

    /// [`Volume::open`] to read it (a snapshot of a stopped volume):
    /// without filling the dedup cache from `fps` (a third of such a
    /// snapshot's time). What is written meanwhile is deduplicated only
    /// against itself.
    pub fn open_to_read(dir: &Path, key: Option<&VolumeKey>) -> Result<Arc<Volume>> {
        Self::open_with(dir, false, key)
    }

    /// The ciphers of the volume in `dir` with config `cfg` (none if it is
    /// not encrypted), `key` checked.
    pub(crate) fn crypt(
        dir: &Path,
        cfg: &VolumeConfig,
        key: Option<&VolumeKey>,
    ) -> Result<Option<Arc<Crypt>>> {
        match (&cfg.encryption, key) {
            (None, _) => Ok(None),
            (Some(_), None) => Err(VolumeError::Invalid(format!(
                "{}: the volume is encrypted, and no key was given (it is opened through its repository, with the repository's password)",
                dir.display()
            ))),
            (Some(e), Some(k)) if !e.accepts(k) => Err(VolumeError::Invalid(format!(
                "{}: the key does not open this volume (another repository's password, or a damaged volume.json)",
                dir.display()
            ))),
            (Some(_), Some(k)) => Ok(Some(Arc::new(Crypt::new(k)))),
        }
    }

    pub(crate) fn open_with(
        dir: &Path,
        warm_cache: bool,
        key: Option<&VolumeKey>,
    ) -> Result<Arc<Volume>> {
        // Locked first: the size read next is not changed meanwhile (a
        // resize holds the lock).
        let lock_file = Self::lock(dir)?;
        let cfg = Self::config(dir)?;
        let crypt = Self::crypt(dir, &cfg, key)?;
        remove_frozen_maps(dir);
        let (files, old) = Recovered::open(dir, &cfg, warm_cache)?;
        let vol = Arc::new(Self::assemble(dir, cfg, crypt, lock_file, files)?);
        vol.replay(&old)?;
        vol.checkpoint()?;
        vol.save_state(false)?;
        vol.picks_releases.store(true, Ordering::SeqCst);
        // Room for the live figures while there is room: on a disk that
        // then fills, they are written over it (what they were stays).
        if let Err(e) = crate::report::reserve_live(&vol.dir) {
            tracing::debug!("no room kept for live figures: {e}");
        }
        let v = vol.clone();
        *lock(&vol.destager) = Some(std::thread::spawn(move || v.destage_loop()));
        Ok(vol)
    }

    /// The volume in `dir` from its recovered files, with a new journal
    /// (not yet replayed nor destaging).
    fn assemble(
        dir: &Path,
        cfg: VolumeConfig,
        crypt: Option<Arc<Crypt>>,
        lock_file: File,
        files: Recovered,
    ) -> Result<Volume> {
        let journal = Journal::create(dir, files.next_gen).map_err(ioe("journal"))?;
        Ok(Volume {
            dir: dir.to_path_buf(),
            map: files.map,
            data: files.data,
            crypt,
            readahead: files.readahead,
            mem: Mutex::new(new_mem(journal, files.next_gen, files.changes)),
            kick: Condvar::new(),
            destaged: Condvar::new(),
            disk: Mutex::new(new_disk(files.refs, files.fps, files.cache, files.counters)),
            space: Mutex::new(Space {
                free: files.free,
                end: files.end,
                cursor: files.end,
            }),
            live: LiveStats {
                fragmentation: Mutex::new(Histogram::with_buckets(65)),
                read_sizes: Mutex::new(Histogram::with_buckets(257)),
                ..Default::default()
            },
            cfg,
            destager: Mutex::new(None),
            lock: Mutex::new(Some(lock_file)),
            reuse_guard: std::sync::RwLock::new(()),
            closed: AtomicBool::new(false),
            checkpointing: Mutex::new(()),
            checkpoint_busy: AtomicBool::new(false),
            holds: Default::default(),
            unsynced: Mutex::new(Vec::new()),
            direct_blocks: AtomicU64::new(0),
            data_dirty: AtomicBool::new(false),
            data_sync: Mutex::new(()),
            direct_io: std::sync::RwLock::new(()),
            picks_releases: AtomicBool::new(false),
        })
    }

    /// Replays the journals `old` left by an unclean stop: what they
    /// hold is destaged (the checkpoint after makes it durable and drops
    /// them). Placed writes whose data reached the disk keep their
    /// blocks: those are taken out of the free space before anything is
    /// replayed.
    pub(crate) fn replay(&self, old: &[(u64, PathBuf)]) -> Result<()> {
        let mut journals = Vec::new();
        for (_, p) in old {
            // Durable before the replay writes anything (a kill -9 left
            // them in the page cache only).
            File::open(p)
                .and_then(|f| f.sync_all())
                .map_err(ioe(p.display().to_string()))?;
            let recs = journal::read(p, BLOCK).map_err(ioe(p.display().to_string()))?;
            journals.push((p, self.keep_placed(recs)?));
        }
        for (p, recs) in journals {
            let mut batch = Batch::default();
            for r in recs {
                match r {
                    Record::Placed { block, dbn, crcs } => {
                        for i in 0..crcs.len() as u64 {
                            batch.place(block + i, dbn + i);
                        }
                    }
                    Record::Write { block, mut data } => {
                        let n = data.len() / BLOCK;
                        if let Some(c) = &self.crypt {
                            c.open_journal(block, &mut data);
                        }
                        let data = Arc::new(data);
                        for (i, b) in Block::slices(&data, 0, n).enumerate() {
                            batch.put(block + i as u64, b);
                        }
                    }
                    Record::Zero { block, count } => batch.zero(block, block + count as u64),
                }
            }
            let freed = self.apply(&batch)?;
            let mut d = lock(&self.disk);
            d.free_later(freed);
            d.uncommitted.push(p.clone());
        }
        Ok(())
    }

    /// A journal's records without the placed writes whose data is not on
    /// disk (unflushed when the machine stopped: they are lost, as a
    /// plain disk's unflushed writes are); the blocks of the rest are taken
    /// out of the free space.
    pub(crate) fn keep_placed(&self, recs: Vec<Record>) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(recs.len());
        let mut buf = vec![0u8; BLOCK];
        for r in recs {
            let Record::Placed { block, dbn, crcs } = r else {
                out.push(r);
                continue;
            };
            // Block by block: one may since have been written over in
            // place (a later record of the journal has it), another not
            // have reached the disk. A block dropped reads as it did when
            // it was placed — zeros — even if its map entry was written
            // back before the crash.
            for (i, crc) in (0u64..).zip(crcs) {
                let got = read_full_at(&self.data, &mut buf, (dbn + i) * BLOCK as u64)
                    .map_err(ioe("data"))?;
                if got == BLOCK && crc32c::crc32c(&buf) == crc {
                    crate::destage::reserve(&mut lock(&self.space), dbn + i, 1);
                    out.push(Record::Placed {
                        block: block + i,
                        dbn: dbn + i,
                        crcs: vec![crc],
                    });
                } else {
                    out.push(Record::Zero {
                        block: block + i,
                        count: 1,
                    });
                }
            }
        }
        Ok(out)
    }

    pub fn size(&self) -> u64 {
        self.cfg.size
    }

    /// Takes the volume's lock (`lock` in its directory, an exclusive
    /// `flock`: released by the kernel when the process ends, even by
    /// kill -9). Fails at once when another process holds it.
    pub fn lock(dir: &Path) -> Result<File> {
        use std::os::fd::AsRawFd;
        let f = open_rw(&dir.join("lock"))?;
        // SAFETY: flock on a file descriptor we own.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(VolumeError::Invalid(format!(
                    "the volume at {} is in use by another process (a running `strata volume serve`?)",
                    dir.display()
                )));
            }
            return Err(VolumeError::Io(format!("locking {}", dir.display()), e));
        }
        Ok(f)
    }

    pub(crate) fn save_state(&self, clean: bool) -> Result<()> {
        let d = lock(&self.disk);
        let counters = d.counters.clone();
        write_json(&self.dir.join("state.json"), &State { clean, counters })
    }

    /// The counters after a batch (the volume stays marked in use).
    pub(crate) fn write_state(&self, counters: Persistent) -> Result<()> {
        write_json(
            &self.dir.join("state.json"),
            &State {
                clean: false,
                counters,
            },
        )
    }
}

/// Deletes the frozen maps in `dir` of a server that is gone.
fn remove_frozen_maps(dir: &Path) {
    // Frozen maps of a server that is gone (its snapshots ended with it).
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("map.frozen.") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// A volume's files opened and what they hold recovered, before the
/// volume is assembled.
struct Recovered {
    map: Arc<BlockMap>,
    data: File,
    refs: File,
    fps: File,
    free: BTreeMap<u64, u64>,
    cache: MetaCache,
    end: u64,
    /// The generation of the next journal.
    next_gen: u64,
    counters: Persistent,
    readahead: Readahead,
    changes: Changes,
}

impl Recovered {
    /// Opens the files of the volume in `dir`, rebuilding the reference
    /// counts after an unclean stop; also the journals left to replay.
    fn open(
        dir: &Path,
        cfg: &VolumeConfig,
        warm_cache: bool,
    ) -> Result<(Recovered, Vec<(u64, PathBuf)>)> {
        let state: State = read_json(&dir.join("state.json"))?;
        let nblocks = cfg.size / BLOCK as u64;
        let map_file = open_rw(&dir.join("map"))?;
        let data = open_rw(&dir.join("data"))?;
        let refs = open_rw(&dir.join("refs"))?;
        let fps = open_rw(&dir.join("fps"))?;
        let end = data.metadata().map_err(ioe("data"))?.len() / BLOCK as u64;
        if !state.clean {
            rebuild_refs(dir, &map_file, &refs, nblocks, end)?;
        }
        let (free, cache) = scan_refs(&refs, &fps, end, cfg, state.clean && warm_cache)?;
        let old = journal::existing(dir).map_err(ioe(dir.display().to_string()))?;
        let next_gen = old.last().map(|(g, _)| g + 1).unwrap_or(1);
        let mut counters = state.counters;
        if counters.sequence_lengths.counts.is_empty() {
            counters.sequence_lengths = Histogram::with_buckets(65);
        }
        let map = Arc::new(BlockMap::new(map_file));
        let readahead = Readahead::new(map.clone(), &data, nblocks);
        // What was written since the last snapshot: known only after a
        // clean close (a replayed journal's writes were not counted).
        let changes = match state.clean && old.is_empty() {
            true => Changes::load(dir, nblocks),
            false => {
                let _ = Changes::unknown(nblocks).save(dir);
                Changes::unknown(nblocks)
            }
        };
        let files = Recovered {
            map,
            data,
            refs,
            fps,
            free,
            cache,
            end,
            next_gen,
            counters,
            readahead,
            changes,
        };
        Ok((files, old))
    }
}

/// The in-memory write state of a volume just opened, writing journal
/// `journal` of generation `next_gen`.
fn new_mem(journal: Journal, next_gen: u64, changes: Changes) -> Mem {
    Mem {
        buf: Batch::default(),
        destaging: None,
        journal,
        prev_journal: None,
        failed: None,
        full: None,
        stop: false,
        urgent: false,
        applied: next_gen - 1,
        recent: HashMap::new(),
        inflight: HashMap::new(),
        next_token: 0,
        changes,
    }
}

/// The on-disk bookkeeping of a volume just opened.
fn new_disk(refs: File, fps: File, cache: MetaCache, counters: Persistent) -> Disk {
    Disk {
        refs,
        fps,
        cache,
        counters,
        pending_free: Vec::new(),
        freeing: Default::default(),
        uncommitted: Vec::new(),
        uncommitted_bytes: 0,
        uncommitted_generation: 0,
        placed_since: HashMap::new(),
        last_checkpoint: Instant::now(),
        released_applied: Default::default(),
    }
}

/// Reference counts recounted from the map and the holds (after an
/// unclean stop); a released hold the recount did not count is given
/// back already, its file deleted.
pub(crate) fn rebuild_refs(
    dir: &Path,
    map: &File,
    refs: &File,
    nblocks: u64,
    end: u64,
) -> Result<()> {
    let mut counts = vec![0u32; end as usize];
    let held = crate::holds::count_into(dir, &mut counts, false)?;
    if let Some(why) = held.damaged.first() {
        // Which blocks it keeps is not known: none may be freed.
        return Err(VolumeError::Invalid(format!(
            "{why}: the disk blocks it keeps for the repository are not known, so the \
             volume's free space cannot be counted. Put the file back from a copy, or, once \
             no snapshot of the repository links to the volume, delete it"
        )));
    }
    if let Some(first) = held.past_first {
        tracing::warn!(
            "{} held blocks lie past the end of the data file (first: {first}): not counted",
            held.past
        );
    }
    let step = 1 << 16;
    let mut at = 0;
    while at < nblocks {
        let n = step.min(nblocks - at) as usize;
        let mut entries = read_u64s(map, at, n).map_err(ioe("map"))?;
        let mut past = false;
        for e in entries.iter_mut() {
            if *e != 0 && *e - 1 < end {
                counts[(*e - 1) as usize] += 1;
            } else if *e != 0 {
                // Data the crash lost with the file's growth (never
                // flushed: FLUSH syncs the file's size too): zeros.
                *e = 0;
                past = true;
            }
        }
        if past {
            let bytes: Vec<u8> = entries.iter().flat_map(|v| v.to_le_bytes()).collect();
            map.write_all_at(&bytes, at * 8).map_err(ioe("map"))?;
        }
        at += n as u64;
    }
    let bytes: Vec<u8> = counts.iter().flat_map(|c| c.to_le_bytes()).collect();
    refs.set_len(0).map_err(ioe("refs"))?;
    refs.write_all_at(&bytes, 0).map_err(ioe("refs"))?;
    refs.sync_all().map_err(ioe("refs"))?;
    crate::holds::drop_uncounted_releases(dir, &held.names)
}

/// Free disk blocks from the reference counts, and the metadata cache
/// warmed with the fingerprints of blocks in use (after a clean stop).
pub(crate) fn scan_refs(
    refs: &File,
    fps: &File,
    end: u64,
    cfg: &VolumeConfig,
    warm: bool,
) -> Result<(BTreeMap<u64, u64>, MetaCache)> {
    let mut free = BTreeMap::new();
    let mut cache = MetaCache::with_bytes(cfg.cache_bytes);
    let counts = read_counts(refs, end)?;
    let mut fp_raw = Vec::new();
    if warm && cfg.dedup {
        fp_raw = vec![0u8; (end * 16) as usize];
        let got = read_full_at(fps, &mut fp_raw, 0).map_err(ioe("fps"))?;
        fp_raw[got..].fill(0);
    }
    let mut run: Option<(u64, u64)> = None;
    for d in 0..end {
        let i = d as usize;
        if counts[i] == 0 {
            run = match run {
                Some((s, l)) if s + l == d => Some((s, l + 1)),
                Some((s, l)) => {
                    free.insert(s, l);
                    Some((d, 1))
                }
                None => Some((d, 1)),
            };
        } else if !fp_raw.is_empty() {
            let fp: Fp = fp_raw[i * 16..i * 16 + 16].try_into().unwrap_or_default();
            cache.insert(fp, d);
        }
    }
    if let Some((s, l)) = run {
        free.insert(s, l);
    }
    Ok((free, cache))
}
