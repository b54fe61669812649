//! Between the walk and the commit: the bounded queue of work units the
//! workers take, and the window of nodes in tree order that turns into
//! recipe parts as soon as everything before them is stored.
//!
//! ```text
//! walk (calling thread) ──► window: node, node, [pending file], node, …
//!        │ files to read                  ▲ stored: segments filled in
//!        ▼                                │
//!   queue of units ──► workers (pullers) ─┘
//!        window front, in order ──► recipe thread: parts written as they fill
//! ```
//!
//! Memory is bounded by design ([`FlowLimits`]): the walk waits while the
//! window holds 16 Ki nodes or 32 MiB of stored references behind a file
//! still being read, or while 512 units / 64 MiB of files wait for a
//! worker. Neither the new tree nor the previous one is ever held whole.

use super::dedup::Outcome;
use super::parent::{CarriedPart, ParentFile};
use super::walk::{Feed, Job, Source};
use crate::error::{Result, StoreError};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;
use strata_core::format::{Node, NodeKind};

/// How much the walk may hold between itself and the recipe.
#[derive(Clone, Copy, Debug)]
pub struct FlowLimits {
    /// Most nodes the window holds.
    pub window_nodes: usize,
    /// Most bytes (paths and chunk references, roughly) of finished nodes
    /// the window holds behind an unfinished one.
    pub window_bytes: u64,
    /// Most work units waiting for a worker, and their file bytes (a
    /// single unit may be larger).
    pub queue_units: usize,
    pub queue_bytes: u64,
}

impl Default for FlowLimits {
    fn default() -> Self {
        FlowLimits {
            window_nodes: 16_384,
            window_bytes: 32 << 20,
            queue_units: 512,
            queue_bytes: 64 << 20,
        }
    }
}
/// Most small files looked up together (SiLo's grouping).
const GROUP_FILES: usize = 1024;

/// What a worker takes: one file, or small files of one directory looked
/// up together.
pub(crate) enum Unit {
    One(Box<Job>),
    Group(Vec<Job>),
}

impl Unit {
    fn bytes(&self) -> u64 {
        match self {
            Unit::One(j) => j.node.size,
            Unit::Group(g) => g.iter().map(|j| j.node.size).sum(),
        }
    }
}

enum Slot {
    Pending,
    Ready(Node),
    Failed,
    /// A part of the previous version taken over as it is (a piece of a
    /// patched image that did not change), and the file's node (boxed:
    /// rare, and large beside the others).
    Part(Box<CarriedPart>, Node),
}

/// What the recipe thread takes, in order.
pub(crate) enum RecipeItem {
    Node(Node),
    Part(Box<CarriedPart>, Node),
}

/// Rough memory of a finished node.
fn node_bytes(n: &Node) -> u64 {
    let chunks: usize = n.segments.iter().map(|s| s.chunks.len() + 1).sum();
    (200 + n.path.len() + 48 * chunks) as u64
}

#[derive(Default)]
struct State {
    /// Sequence number of `slots[0]`.
    base: u64,
    slots: VecDeque<Slot>,
    held_bytes: u64,
    queue: VecDeque<Unit>,
    queued_bytes: u64,
    /// Pullers running or queued on the pool.
    active: usize,
    /// Files handed on and not yet stored (or failed).
    in_flight: usize,
    warnings: Vec<String>,
}

/// The shared half: what the workers touch.
pub(crate) struct Flow<'a> {
    state: Mutex<State>,
    /// The walk waits here for room.
    room: Condvar,
    threads: usize,
    /// The backup's abort flag, and the caller's cancel flag.
    abort: &'a AtomicBool,
    cancel: &'a AtomicBool,
}

/// Figures of the nodes the window let through.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct TreeCounts {
    pub files: u64,
    pub dirs: u64,
    pub logical_bytes: u64,
}

impl<'a> Flow<'a> {
    pub fn new(threads: usize, abort: &'a AtomicBool, cancel: &'a AtomicBool) -> Self {
        Flow {
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            threads,
            abort,
            cancel,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed) || self.cancel.load(Ordering::Relaxed)
    }

    /// A puller's next unit; `None` retires the puller.
    pub fn take_unit(&self) -> Option<Unit> {
        let mut st = self.lock();
        match st.queue.pop_front() {
            Some(u) => {
                st.queued_bytes -= u.bytes();
                drop(st);
                self.room.notify_one();
                Some(u)
            }
            None => {
                st.active -= 1;
                None
            }
        }
    }

    /// A file's outcome: its node (with `segments` and `size` filled in)
    /// joins the window, or leaves the tree with a warning.
    pub fn complete(&self, seq: u64, mut node: Node, o: Outcome) {
        let mut st = self.lock();
        let slot = match o {
            Outcome::Done {
                segments,
                size,
                warning,
            } => {
                st.warnings.extend(warning);
                node.segments = segments;
                node.size = size;
                st.held_bytes += node_bytes(&node);
                Slot::Ready(node)
            }
            Outcome::Failed(msg) => {
                st.warnings.push(msg);
                Slot::Failed
            }
        };
        let i = (seq - st.base) as usize;
        let mut done = false;
        if let Some(s) = st.slots.get_mut(i) {
            done = matches!(s, Slot::Pending);
            *s = slot;
        }
        if done {
            st.in_flight -= 1;
        }
        drop(st);
        self.room.notify_one();
    }

    /// Wakes the walk (after an error).
    pub fn wake(&self) {
        self.room.notify_all();
    }

    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().warnings)
    }
}

/// The walk's half: hands entries into the window and the queue, sends the
/// window's finished front to the recipe thread, starts pullers.
pub(crate) struct Feeder<'a> {
    pub flow: &'a Flow<'a>,
    /// Starts one more puller on the worker pool.
    pub spawn: &'a dyn Fn(),
    /// Nodes in order, to the recipe thread.
    pub recipe: SyncSender<Vec<RecipeItem>>,
    /// Small files to ask the kernel for ahead of the workers.
    pub prefetch: Option<SyncSender<PathBuf>>,
    /// Files below this size are small; at least this large go through
    /// the block pipeline.
    pub large: u64,
    /// Segment size, when small files of a directory are looked up
    /// together (SiLo).
    pub grouping: Option<u64>,
    pub limits: FlowLimits,
    pub next_seq: u64,
    pub group: Vec<Job>,
    pub group_bytes: u64,
    pub counts: TreeCounts,
    /// Time the walk spent waiting for room (not busy).
    pub waited: Duration,
    /// The path of the last file node sent on.
    pub last_file: Option<Vec<u8>>,
}

fn dir_of(p: &[u8]) -> &[u8] {
    &p[..p.iter().rposition(|&b| b == b'/').unwrap_or(0)]
}

impl Feeder<'_> {
    fn cancelled(&self) -> Result<()> {
        if self.flow.aborted() {
            return Err(StoreError::Cancelled);
        }
        Ok(())
    }

    /// Queues a unit and makes sure a puller will take it.
    fn enqueue(&mut self, u: Unit) {
        let mut st = self.flow.lock();
        st.queued_bytes += u.bytes();
        st.queue.push_back(u);
        let start = st.active < self.flow.threads;
        if start {
            st.active += 1;
        }
        drop(st);
        if start {
            (self.spawn)();
        }
    }

    /// Queues the small files collected so far as one unit.
    fn dispatch_group(&mut self) {
        self.group_bytes = 0;
        let mut g = std::mem::take(&mut self.group);
        if g.len() > 1 {
            self.enqueue(Unit::Group(g));
        } else if let Some(j) = g.pop() {
            self.enqueue(Unit::One(Box::new(j)));
        }
    }

    /// Sends the window's finished front to the recipe thread.
    fn drain(&mut self) -> Result<()> {
        let mut out = Vec::new();
        {
            let mut st = self.flow.lock();
            while matches!(
                st.slots.front(),
                Some(Slot::Ready(_) | Slot::Failed | Slot::Part(..))
            ) {
                st.base += 1;
                match st.slots.pop_front() {
                    Some(Slot::Ready(n)) => {
                        st.held_bytes = st.held_bytes.saturating_sub(node_bytes(&n));
                        out.push(RecipeItem::Node(n));
                    }
                    Some(Slot::Part(p, n)) => out.push(RecipeItem::Part(p, n)),
                    _ => {}
                }
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        let nodes = out.iter().filter_map(|i| match i {
            RecipeItem::Node(n) => Some(n),
            RecipeItem::Part(..) => None,
        });
        for n in nodes {
            // The further pieces of a file handed on a piece at a time
            // (a patched image) are the same file.
            let piece = self.last_file.as_deref() == Some(n.path.as_slice());
            match n.kind {
                NodeKind::File if piece => {}
                NodeKind::File => {
                    self.counts.files += 1;
                    self.counts.logical_bytes += n.size;
                    self.last_file = Some(n.path.clone());
                }
                NodeKind::Dir => self.counts.dirs += 1,
                _ => {}
            }
        }
        self.recipe
            .send(out)
            .map_err(|_| StoreError::Invalid("the recipe writer stopped".into()))
    }

    /// Waits until the window has room for a node (and, for a file to
    /// read, the queue for a unit), sending the finished front on.
    fn wait_room(&mut self, file: bool) -> Result<()> {
        loop {
            self.cancelled()?;
            self.drain()?;
            let full = {
                let st = self.flow.lock();
                let l = &self.limits;
                (!st.slots.is_empty()
                    && (st.slots.len() >= l.window_nodes || st.held_bytes >= l.window_bytes))
                    || (file
                        && !st.queue.is_empty()
                        && (st.queue.len() >= l.queue_units || st.queued_bytes >= l.queue_bytes))
            };
            if !full {
                return Ok(());
            }
            // What the walk holds back itself must go before it waits.
            if !self.group.is_empty() {
                self.dispatch_group();
                continue;
            }
            self.wait();
        }
    }

    /// Waits (up to 50 ms) for a worker to take a unit or finish a file.
    fn wait(&mut self) {
        let t = std::time::Instant::now();
        let st = self.flow.lock();
        let _ = self
            .flow
            .room
            .wait_timeout(st, Duration::from_millis(50))
            .unwrap_or_else(|e| e.into_inner());
        self.waited += t.elapsed();
    }

    /// After the walk: queues what is left and waits until every node has
    /// gone to the recipe thread.
    pub fn finish(&mut self) -> Result<()> {
        self.dispatch_group();
        loop {
            self.cancelled()?;
            self.drain()?;
            if self.flow.lock().slots.is_empty() {
                return Ok(());
            }
            self.wait();
        }
    }
}

impl Feed for Feeder<'_> {
    fn push_part(&mut self, part: CarriedPart, node: Node) -> Result<()> {
        self.wait_room(false)?;
        self.next_seq += 1;
        self.flow
            .lock()
            .slots
            .push_back(Slot::Part(Box::new(part), node));
        Ok(())
    }

    fn wait_in_flight(&mut self, max: usize) -> Result<()> {
        // Small files held back for a group are in flight too: they go
        // before anyone waits for them.
        if !self.group.is_empty() {
            self.dispatch_group();
        }
        loop {
            self.cancelled()?;
            self.drain()?;
            if self.flow.lock().in_flight < max {
                return Ok(());
            }
            self.wait();
        }
    }

    fn push(&mut self, node: Node, source: Option<(Source, Option<ParentFile>)>) -> Result<()> {
        self.wait_room(source.is_some())?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some((source, prev)) = source else {
            let mut st = self.flow.lock();
            st.held_bytes += node_bytes(&node);
            st.slots.push_back(Slot::Ready(node));
            return Ok(());
        };
        {
            let mut st = self.flow.lock();
            st.slots.push_back(Slot::Pending);
            st.in_flight += 1;
        }
        let small = matches!(source, Source::Path(_)) && node.size < self.large;
        if let (true, Some(tx), Source::Path(p)) = (small, &self.prefetch, &source) {
            // Only a hint: dropped when the prefetcher is behind.
            let _ = tx.try_send(p.clone());
        }
        let job = Job {
            seq,
            node,
            source,
            prev,
        };
        match self.grouping {
            Some(segment) if small && job.node.size <= segment / 4 => {
                let same_dir = self
                    .group
                    .last()
                    .is_some_and(|l| dir_of(&l.node.path) == dir_of(&job.node.path));
                if !same_dir || self.group_bytes >= segment || self.group.len() >= GROUP_FILES {
                    self.dispatch_group();
                }
                self.group_bytes += job.node.size;
                self.group.push(job);
            }
            _ => {
                self.dispatch_group();
                self.enqueue(Unit::One(Box::new(job)));
            }
        }
        Ok(())
    }
}
