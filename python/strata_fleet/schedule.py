"""Round scheduling of a fleet backup job (Parallel VM batch dedup, §4).

A fleet job backs up every VM in one or more *rounds*. A VM's image lives
on one host (its host is fixed), and all VMs of a round go through the
stages of §3 together; each stage ends at a barrier across the cluster
(stage 1b compares a round's detection requests with the global index
partition by partition), so rounds follow each other.

Cost model (per round; every number overridable through `HostCosts` and
`CostModel`):

* Each VM has a size, a dirty part (level-1 dirty 2 MiB segments: a ratio
  of its size or the bytes of a changed-block list) and a predicted unique
  fraction of its dirty bytes (default 25.5 %: §5, block dedup inside dirty
  segments removes 74.5 %).
* Work on the VM's own host (its *load*, §4.1's ``Load(m, r)`` sums it):
  stage 1a reads the dirty segments (prescan: chunk, fingerprint, send
  detection requests), stage 2b reads them again and writes the unique
  blocks, overlapped with that read (§5: "final data copying to the backup
  storage is overlapped with VM scanning")::

      load(v) = dirty/scan + max(dirty/scan, unique/write)

* Work at the partition owners, spread evenly over all p hosts by the
  fingerprint hash: stage 1b, ``detect_us`` per detection request (one per
  4 KiB block of the dirty segments), and stage 3b, ``update_us`` per new
  block. Spilling the round's requests to q on-disk partitions costs seeks
  (Option 2 of §3: 2p network buffers + q disk buffers share the memory
  cap M); q is the fewest partitions whose index part + request part fit
  in M.
* A fixed cost per round: ``round_overhead_s`` (barriers, exchanges,
  stage 4) plus reading every index partition in stage 1b and reading and
  rewriting it in stage 3b (3 × the host's index bytes at the scan rate),
  whatever the round holds. This is what makes many rounds cost job span.

So the time of round r is

    t_r = overhead + max_m Load(m, r) + partition work of r / p + seeks(r)

— the slowest host's load plus the global stages (§4.1: "the execution
time of each round is proportional to the maximum data load of all
physical machines"). `CostModel.pure()` is exactly that statement:
``t_r = max_m Load(m, r)``, nothing else.

Definitions (§4.1): the backup time of a VM is the completion time of its
round; the job span J is the end of the last round; T is the average VM
backup time; the objective is ``alpha*T + (1-alpha)*J``.

Heuristics (§4.2): for every number of rounds k, pick VMs one at a time
and put each into one of the k rounds; keep the k with the smallest
objective. VM selection: ``largest`` (the default: the unscheduled VM with
the largest load) or ``busiest-host`` (the largest VM of the host with the
most unscheduled load). Round selection: ``min-load`` (the round where the
VM's host has the smallest ``Load(m, r)``) or ``min-increase`` (the
smallest increase of the total execution time, i.e. of the round's time).
``RS2`` (named in §4.3) is ``largest`` + ``min-load``; the paper names
none of the other three combinations, so they go by their rules. ``BPL``
(§5.1: "the machine by machine largest VM to shortest round algorithm")
takes hosts one after the other (most load first), each host's VMs
largest first, into the round that is currently shortest. (§5.1's DBP2,
"a relative of the dual bin packing algorithm", is not defined in the
paper and not implemented.) ``one-round`` (§4: "the naive way") is the
baseline.

Our choices where the paper is silent:

* ties between rounds with the same smallest ``Load(m, r)`` go to the
  lowest round index (`build` also offers "currently shortest" and
  "shortest with the VM in it"; none of the three keeps §4.3's bound, see
  below, and the lowest index gives the best T on the vmfleet sizes);
* ``min-increase`` does not count a round's fixed time when the VM is the
  first in it (the k rounds all run; counting it puts every VM into one
  round for every k) and breaks ties to the currently shortest round;
* once the VMs are placed, rounds run in Smith's order (round time / VMs
  in it, ascending): optimal for T given the rounds, J unchanged;
* "all possible k" stops at the first k that leaves a round empty (every
  larger k gives the same schedule) or whose k fixed round times alone
  cannot beat the best objective so far.

§4.3 states, with its proof missing, that RS2's average backup time T is at
most 2·T_opt. `rs2_bound` checks it on a fleet: T_opt exactly by
enumerating every partition of the VMs into rounds (small fleets), else a
lower bound (each host's VMs alone, optimally batched with the per-round
fixed time: the single-machine s-batch problem, exact in SPT order by
dynamic programming). It does not hold in general, even for §4.1's round
time alone (`CostModel.pure`): with ties to the lowest index, a tiny VM of
every other host joins the largest VM's round (T ≈ (h+1)·T_opt for h such
hosts); with either other tie rule, p hosts with one large VM each (of
slightly different sizes) and a few tiny ones keep the large VMs in
separate rounds for every k (T ≈ (p+1)/2·T_opt); with a fixed time per
round, RS2 spreads one host's small VMs over rounds whatever the rule. The
tests hold those fleets; on random fleets of at most 3 hosts and 7 VMs
under ``CostModel.pure``, RS2 with ties to the currently shortest round
stayed within the bound.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

SEGMENT = 2 << 20
"""Level-1 dirty-bit granularity (§3, §5: 2 MB segments)."""
BLOCK = 4096
"""Average content block (§3, §5: 4 KB): one detection request each."""
MIB = 1 << 20

DEFAULT_DIRTY = 0.03
"""Dirty ratio when a VM gives neither ``dirty`` nor a changed-block list:
the harness's ``vmfleet`` daily rate (3 % of segments)."""
DEFAULT_UNIQUE = 0.255
"""Unique fraction of dirty bytes: §5, 74.5 % of the blocks of dirty
segments are duplicates."""


@dataclass(frozen=True)
class HostCosts:
    """Throughput of one host (defaults: §5's controlled I/O rate)."""

    scan_mbps: float = 50.0
    """Reading dirty segments, MB/s (10^6 bytes): §5 "controlled about
    50MB/second"."""
    write_mbps: float = 50.0
    """Writing unique blocks to the shared repository, MB/s."""
    detect_us: float = 2.0
    """Stage 1b: comparing one detection request with its index partition
    (spilled to disk and read back), microseconds."""
    update_us: float = 2.0
    """Stage 3b: adding one new block to its index partition, µs."""

    def __post_init__(self) -> None:
        for k in ("scan_mbps", "write_mbps"):
            if not getattr(self, k) > 0:
                raise ValueError(f"{k} must be > 0, not {getattr(self, k)!r}")
        for k in ("detect_us", "update_us"):
            if not getattr(self, k) >= 0:
                raise ValueError(f"{k} must be >= 0, not {getattr(self, k)!r}")


HOST_KEYS = ("scan_mbps", "write_mbps", "detect_us", "update_us")
MODEL_KEYS = ("round_overhead_s", "index_bytes", "index_ratio", "seek_ms", "request_bytes")


@dataclass(frozen=True)
class CostModel:
    """Cluster-wide parameters of the round-time model (module doc)."""

    hosts: tuple[str, ...] = ()
    """Every host of the cluster (p = its length, or the VMs' hosts when
    empty; hosts without VMs still own index partitions)."""
    costs: HostCosts = HostCosts()
    """Throughput of every host not in `per_host`."""
    per_host: Mapping[str, HostCosts] = field(default_factory=dict)
    round_overhead_s: float = 10.0
    """Fixed per round: barriers between stages, exchanges, stage 4."""
    index_bytes: Optional[int] = None
    """Global index held by each host (bytes); None: ``index_ratio`` of
    the fleet's bytes divided by p."""
    index_ratio: float = 0.008
    """Index bytes per byte of VM image (§5: ~8 GB of index per host for
    25 VMs × 40 GB)."""
    memory: int = 35 * MIB
    """Memory cap M of each stage on each host (§5: 35 MB)."""
    seek_ms: float = 10.0
    """One random I/O (§5: about 10 ms)."""
    request_bytes: int = 40
    """One detection request on disk (20-byte SHA-1 + block id + ref)."""
    buffers: int = 128 * 1024 + 5 * MIB // 2
    """Disk buffers taken from M before the partition / network buffers
    (§3: 128 KB read, 2.5 MB shared by the write buffers)."""

    @classmethod
    def pure(cls, hosts: Sequence[str] = ()) -> "CostModel":
        """§4.1's statement alone: a round takes its largest host load
        (no overhead, no partition work, no seeks)."""
        return cls(
            hosts=tuple(hosts),
            costs=HostCosts(detect_us=0.0, update_us=0.0),
            round_overhead_s=0.0,
            index_bytes=0,
            seek_ms=0.0,
        )

    def host_costs(self, host: str) -> HostCosts:
        return self.per_host.get(host, self.costs)


@dataclass(frozen=True)
class VmTask:
    """One VM to back up."""

    name: str
    host: str
    size: int
    """Image size, bytes."""
    dirty: float = DEFAULT_DIRTY
    """Dirty ratio of the image (ignored when `dirty_bytes` is set)."""
    dirty_bytes: Optional[int] = None
    """Bytes of dirty segments (e.g. from a changed-block list)."""
    unique: float = DEFAULT_UNIQUE
    """Predicted unique fraction of the dirty bytes."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a VM needs a name")
        if self.size < 0:
            raise ValueError(f"VM {self.name}: size {self.size} < 0")
        if not 0.0 <= self.dirty <= 1.0:
            raise ValueError(f"VM {self.name}: dirty ratio {self.dirty} is not within 0..1")
        if not 0.0 <= self.unique <= 1.0:
            raise ValueError(f"VM {self.name}: unique fraction {self.unique} is not within 0..1")
        if self.dirty_bytes is not None and self.dirty_bytes < 0:
            raise ValueError(f"VM {self.name}: dirty bytes {self.dirty_bytes} < 0")

    @property
    def dirty_size(self) -> int:
        """Bytes of dirty segments read (twice) by the backup."""
        d = self.dirty_bytes if self.dirty_bytes is not None else round(self.size * self.dirty)
        return min(d, self.size) if self.size else d


class Fleet:
    """VMs with their per-VM costs under a model: what the heuristics,
    the evaluation and the bound work on. VMs are referred to by index."""

    def __init__(self, vms: Sequence[VmTask], model: Optional[CostModel] = None) -> None:
        model = model or CostModel()
        if not vms:
            raise ValueError("no VMs to schedule")
        names = [v.name for v in vms]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})[0]
            raise ValueError(f"two VMs named {dup!r}")
        vm_hosts = sorted({v.host for v in vms})
        hosts = list(model.hosts) if model.hosts else vm_hosts
        missing = [h for h in vm_hosts if h not in hosts]
        if missing:
            raise ValueError(f"VM host {missing[0]!r} is not one of the cluster's hosts")
        self.vms: list[VmTask] = list(vms)
        self.model = model
        self.hosts: list[str] = hosts
        self.p = len(hosts)
        hidx = {h: i for i, h in enumerate(hosts)}
        self.host_of: list[int] = [hidx[v.host] for v in vms]
        self.load: list[float] = []
        self.requests: list[float] = []
        self.new_blocks: list[float] = []
        for v in vms:
            c = model.host_costs(v.host)
            d = v.dirty_size
            u = d * v.unique
            self.load.append(d / (c.scan_mbps * 1e6) + max(d / (c.scan_mbps * 1e6), u / (c.write_mbps * 1e6)))
            self.requests.append(math.ceil(d / BLOCK))
            self.new_blocks.append(math.ceil(d / BLOCK) * v.unique)
        all_costs = [model.host_costs(h) for h in hosts]
        # Partition work of a round: the slowest host's share (every host
        # gets 1/p of the requests and new blocks).
        self._detect = [c.detect_us * 1e-6 for c in all_costs]
        self._update = [c.update_us * 1e-6 for c in all_costs]
        if model.index_bytes is not None:
            self.index_bytes = float(model.index_bytes)
        else:
            self.index_bytes = model.index_ratio * sum(v.size for v in vms) / self.p
        self.m_avail = model.memory - model.buffers
        if self.m_avail <= 0:
            raise ValueError(f"memory cap {model.memory} bytes leaves nothing beside the disk buffers ({model.buffers} bytes)")
        slowest_scan = min(c.scan_mbps for c in all_costs) * 1e6
        self.q_min = max(1, math.ceil(self.index_bytes / self.m_avail))
        self.setup = model.round_overhead_s + 3 * self.index_bytes / slowest_scan
        self._seek = model.seek_ms / 1000.0
        self._req_per_host = model.request_bytes / self.p
        self._same = len(set(zip(self._detect, self._update))) == 1
        self._a = self._detect[0] / self.p
        self._b = self._update[0] / self.p

    @property
    def n(self) -> int:
        return len(self.vms)

    def partitions(self, requests: float) -> int:
        """q for a round with this many detection requests: index part and
        request part of one partition fit in M."""
        per_host = requests * self.model.request_bytes / self.p
        return max(1, math.ceil((self.index_bytes + per_host) / self.m_avail))

    def global_time(self, requests: float, new: float) -> float:
        """Stages 1b and 3b at the partition owners (the slowest host's
        1/p share), and the seeks of spilling the requests to q partition
        files through 2p + q buffers of M and of loading the partitions."""
        if self._same:
            work = self._a * requests + self._b * new
        else:
            work = max(r * requests + u * new for r, u in zip(self._detect, self._update)) / self.p
        if self._seek:
            per_host = requests * self._req_per_host
            q = max(1, math.ceil((self.index_bytes + per_host) / self.m_avail))
            flushes = math.ceil(per_host * (2 * self.p + q) / self.m_avail)
            work += self._seek * (flushes + 3 * q)
        return work

    def round_time(self, max_load: float, requests: float, new: float, count: int) -> float:
        """Time of a round with `count` VMs, the largest host load
        `max_load` and these totals of requests and new blocks."""
        if count == 0:
            return 0.0
        return self.setup + max_load + self.global_time(requests, new)

    def time_of(self, members: Sequence[int]) -> float:
        """Time of a round holding these VMs."""
        loads = [0.0] * self.p
        req = new = 0.0
        for i in members:
            loads[self.host_of[i]] += self.load[i]
            req += self.requests[i]
            new += self.new_blocks[i]
        return self.round_time(max(loads), req, new, len(members))

    def lb_job(self, i: int) -> float:
        """A lower bound of what VM i adds to its round's time for its own
        host (its load and its share of the partition work)."""
        return self.load[i] + min(
            r * self.requests[i] + u * self.new_blocks[i] for r, u in zip(self._detect, self._update)
        ) / self.p

    @property
    def lb_setup(self) -> float:
        """A lower bound of the fixed time of any round."""
        return self.setup + self._seek * 3 * self.q_min


@dataclass
class Schedule:
    """VMs in rounds, in the order the rounds run, with their times."""

    fleet: Fleet
    heuristic: str
    rounds: list[list[int]]
    round_times: list[float]
    ends: list[float]
    k: int = 0
    """The k the heuristic was run with (rounds may be fewer)."""

    @property
    def J(self) -> float:
        """Job span: the end of the last round."""
        return self.ends[-1] if self.ends else 0.0

    @property
    def T(self) -> float:
        """Average VM backup time (a VM's: the end of its round)."""
        n = sum(len(r) for r in self.rounds)
        return sum(len(r) * e for r, e in zip(self.rounds, self.ends)) / n

    def objective(self, alpha: float) -> float:
        return alpha * self.T + (1 - alpha) * self.J

    def backup_time(self, vm: int) -> float:
        for r, e in zip(self.rounds, self.ends):
            if vm in r:
                return e
        raise KeyError(vm)


def evaluate(fleet: Fleet, rounds: Sequence[Sequence[int]], heuristic: str = "", order: bool = True, k: int = 0) -> Schedule:
    """The schedule of these rounds: empty ones dropped and, with `order`,
    run in Smith's order (ours: round time / VMs ascending, which
    minimises T for these rounds and does not change J)."""
    rs = [list(r) for r in rounds if r]
    times = [fleet.time_of(r) for r in rs]
    idx = list(range(len(rs)))
    if order:
        idx.sort(key=lambda j: (times[j] / len(rs[j]), j))
    ends: list[float] = []
    t = 0.0
    for j in idx:
        t += times[j]
        ends.append(t)
    return Schedule(fleet, heuristic, [rs[j] for j in idx], [times[j] for j in idx], ends, k or len(rs))


def one_round(fleet: Fleet) -> Schedule:
    """Every VM in one round (§4's naive schedule)."""
    return evaluate(fleet, [list(range(fleet.n))], "one-round", k=1)


SELECT = ("largest", "busiest-host", "by-host")
TIE_RULES = ("index", "shortest", "resulting")
TIES = "index"
"""The default tie rule of ``min-load`` (see `build`)."""
PLACE = ("min-load", "min-increase", "shortest-round")

HEURISTICS: dict[str, tuple[str, str]] = {
    "RS2": ("largest", "min-load"),
    "largest/min-increase": ("largest", "min-increase"),
    "busiest-host/min-load": ("busiest-host", "min-load"),
    "busiest-host/min-increase": ("busiest-host", "min-increase"),
    "BPL": ("by-host", "shortest-round"),
}
"""The schedulers: §4.2's two VM selections × two round selections (the
paper names only the largest-VM / smallest-Load(m, r) one, RS2, in §4.3),
and §5.1's BPL."""


def _order(fleet: Fleet, select: str) -> Iterator[int]:
    """VMs in the order a selection rule picks them."""
    key = lambda i: (-fleet.load[i], -fleet.vms[i].size, fleet.vms[i].name)  # noqa: E731
    if select == "largest":
        yield from sorted(range(fleet.n), key=key)
        return
    per_host: dict[int, list[int]] = {}
    for i in sorted(range(fleet.n), key=key):
        per_host.setdefault(fleet.host_of[i], []).append(i)
    if select == "by-host":
        total = {h: sum(fleet.load[i] for i in vs) for h, vs in per_host.items()}
        for h in sorted(per_host, key=lambda h: (-total[h], fleet.hosts[h])):
            yield from per_host[h]
        return
    if select != "busiest-host":
        raise ValueError(f"unknown VM selection {select!r}")
    left = {h: sum(fleet.load[i] for i in vs) for h, vs in per_host.items()}
    pos = {h: 0 for h in per_host}
    for _ in range(fleet.n):
        h = min((h for h in per_host if pos[h] < len(per_host[h])), key=lambda h: (-left[h], fleet.hosts[h]))
        i = per_host[h][pos[h]]
        pos[h] += 1
        left[h] -= fleet.load[i]
        yield i


def build(fleet: Fleet, k: int, select: str, place: str, ties: str = TIES) -> list[list[int]]:
    """Puts every VM into one of k rounds (§4.2's inner loop); returns the
    k rounds (some may be empty).

    ``ties`` (``min-load`` only) chooses among rounds where the VM's host
    has the same smallest load: ``index`` (the default: the lowest index),
    ``shortest`` (the round that is shortest now, then the lowest index)
    or ``resulting`` (the round whose largest host load is smallest with
    the VM in it, then the lowest index). ``min-increase`` counts what the
    VM adds to a round's time apart from its fixed time (the k rounds all
    run); ties go to the round that is shortest now, then the lowest
    index. Every rule treats all empty rounds alike and prefers the lowest
    index, so the empty rounds are always the last ones and only the first
    of them is a candidate."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if place not in PLACE:
        raise ValueError(f"unknown round selection {place!r}")
    if ties not in TIE_RULES:
        raise ValueError(f"unknown tie rule {ties!r} (one of: {', '.join(TIE_RULES)})")
    p = fleet.p
    own = [[0.0] * k for _ in range(p)]  # own[h][r] = Load(h, r)
    rmax = [0.0] * k
    req = [0.0] * k
    new = [0.0] * k
    cnt = [0] * k
    cur = [0.0] * k
    rounds: list[list[int]] = [[] for _ in range(k)]
    used = 0  # rounds 0 … used-1 hold VMs, the others are empty
    round_time = fleet.round_time
    setup = fleet.setup
    for i in _order(fleet, select):
        h, w = fleet.host_of[i], fleet.load[i]
        rq, nw = fleet.requests[i], fleet.new_blocks[i]
        lh = own[h]
        cands = range(min(used + 1, k))
        if place == "min-load":
            m = min(lh[j] for j in cands)
            tied = [j for j in cands if lh[j] == m]
            if ties == "index" or len(tied) == 1:
                r = tied[0]
            elif ties == "shortest":
                r = min(tied, key=lambda j: (cur[j], j))
            else:
                r = min(tied, key=lambda j: (max(rmax[j], lh[j] + w), j))
        elif place == "shortest-round":
            r = min(cands, key=lambda j: (cur[j], j))
        else:  # min-increase: the k rounds all run, so a round's fixed time is no increase
            best, r = (math.inf, 0.0), 0
            for j in cands:
                inc = round_time(max(rmax[j], lh[j] + w), req[j] + rq, new[j] + nw, cnt[j] + 1) - cur[j]
                if cnt[j] == 0:
                    inc -= setup
                key = (round(inc, 9), cur[j])
                if key < best:
                    best, r = key, j
        lh[r] += w
        rmax[r] = max(rmax[r], lh[r])
        req[r] += rq
        new[r] += nw
        cnt[r] += 1
        cur[r] = round_time(rmax[r], req[r], new[r], cnt[r])
        rounds[r].append(i)
        used = max(used, r + 1)
    return rounds


def plan(
    fleet: Fleet,
    heuristic: str = "RS2",
    alpha: float = 0.5,
    rounds: Union[str, int] = "auto",
    ties: str = TIES,
    order: bool = True,
) -> Schedule:
    """The heuristic's schedule: with ``rounds="auto"`` the k (1, 2, …)
    with the smallest ``alpha*T + (1-alpha)*J`` (ties: fewer rounds); with
    an integer K, the schedule for k = K (empty rounds dropped)."""
    if heuristic == "one-round":
        return one_round(fleet)
    if heuristic not in HEURISTICS:
        raise ValueError(f"unknown heuristic {heuristic!r} (one of: {', '.join(['one-round', *HEURISTICS])})")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha} is not within 0..1")
    select, place = HEURISTICS[heuristic]
    if rounds != "auto":
        k = int(rounds)
        return evaluate(fleet, build(fleet, k, select, place, ties), heuristic, order, k)
    best: Optional[Schedule] = None
    lb_t, lb_j = lower_bound_T(fleet), lower_bound_J(fleet)
    for k in range(1, fleet.n + 1):
        if best is not None and _k_bound(fleet, k, alpha, lb_t, lb_j) >= best.objective(alpha):
            break  # k rounds, each at least the fixed time: no better for this k or any larger one
        rs = build(fleet, k, select, place, ties)
        s = evaluate(fleet, rs, heuristic, order, k)
        if best is None or s.objective(alpha) < best.objective(alpha) - 1e-9 * max(1.0, abs(best.objective(alpha))):
            best = s
        if any(not r for r in rs):
            break  # an empty round stays empty for every larger k: same schedule
    assert best is not None
    return best


def _k_bound(fleet: Fleet, k: int, alpha: float, lb_t: float, lb_j: float) -> float:
    """A lower bound of the objective of any schedule with k non-empty
    rounds: the j-th round ends at >= j × the fixed time of a round, every
    round holds a VM (T is smallest with all but k-1 VMs in the first);
    it grows with k."""
    c = fleet.lb_setup
    n = fleet.n
    t = max(lb_t, c * (n - k + k * (k + 1) / 2) / n)
    j = max(lb_j, k * c)
    return alpha * t + (1 - alpha) * j


def best_plan(fleet: Fleet, alpha: float = 0.5, rounds: Union[str, int] = "auto") -> Schedule:
    """The best of all heuristics (and one round) for the objective."""
    cands = [plan(fleet, h, alpha, rounds) for h in HEURISTICS] + [one_round(fleet)]
    return min(cands, key=lambda s: s.objective(alpha))


# --- optimum and bounds --------------------------------------------------


def _partitions(n: int) -> Iterator[list[int]]:
    """Every set partition of range(n), as restricted growth strings."""
    a = [0] * n

    def rec(i: int, m: int) -> Iterator[list[int]]:
        if i == n:
            yield a
            return
        for b in range(m + 1):
            a[i] = b
            yield from rec(i + 1, max(m, b + 1))

    if n == 0:
        return
    yield from rec(1, 1)


def optimum(fleet: Fleet, alpha: float = 1.0, limit: int = 9) -> Schedule:
    """The optimal schedule for ``alpha*T + (1-alpha)*J``, exactly: every
    partition of the VMs into rounds, each run in Smith's order (optimal
    for a given partition). Only for fleets of at most `limit` VMs
    (Bell(9) = 21147 partitions)."""
    n = fleet.n
    if n > limit:
        raise ValueError(f"{n} VMs: the exact optimum enumerates Bell({n}) partitions (limit {limit})")
    p = fleet.p
    best: Optional[tuple[float, list[list[int]]]] = None
    for rgs in _partitions(n):
        m = max(rgs) + 1
        loads = [[0.0] * p for _ in range(m)]
        req = [0.0] * m
        new = [0.0] * m
        cnt = [0] * m
        for i, b in enumerate(rgs):
            loads[b][fleet.host_of[i]] += fleet.load[i]
            req[b] += fleet.requests[i]
            new[b] += fleet.new_blocks[i]
            cnt[b] += 1
        times = [fleet.round_time(max(loads[b]), req[b], new[b], cnt[b]) for b in range(m)]
        order = sorted(range(m), key=lambda b: times[b] / cnt[b])
        t = tot = 0.0
        for b in order:
            t += times[b]
            tot += cnt[b] * t
        obj = alpha * tot / n + (1 - alpha) * t
        if best is None or obj < best[0]:
            best = (obj, [[i for i in range(n) if rgs[i] == b] for b in range(m)])
    assert best is not None
    return evaluate(fleet, best[1], "optimum")


def _batch_sum(jobs: Sequence[float], setup: float) -> float:
    """Smallest sum of completion times of jobs on one machine run in
    batches (each batch: `setup` + its jobs; all its jobs complete at its
    end). Optimal batches are consecutive in SPT order (Coffman, Yannakakis,
    Magazine, Garey 1990), so this DP is exact: O(n²)."""
    p = sorted(jobs)
    n = len(p)
    f = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best = math.inf
        run = 0.0
        for j in range(i + 1, n + 1):
            run += p[j - 1]
            best = min(best, (n - i) * (setup + run) + f[j])
        f[i] = best
    return f[0]


def lower_bound_T(fleet: Fleet) -> float:
    """A lower bound of T_opt: a round takes at least its fixed time plus
    the load (and partition share) of any one host's VMs in it, so the VMs
    of each host alone are a single-machine batching problem; T_opt is at
    least the sum of those optima over hosts, over n."""
    per: dict[int, list[float]] = {}
    for i in range(fleet.n):
        per.setdefault(fleet.host_of[i], []).append(fleet.lb_job(i))
    return sum(_batch_sum(js, fleet.lb_setup) for js in per.values()) / fleet.n


def lower_bound_J(fleet: Fleet) -> float:
    """A lower bound of the job span: every host's load in one round."""
    per = [0.0] * fleet.p
    for i in range(fleet.n):
        per[fleet.host_of[i]] += fleet.lb_job(i)
    return fleet.lb_setup + max(per)


@dataclass(frozen=True)
class BoundCheck:
    """§4.3's property ``T_RS2 <= 2*T_opt`` for one fleet.

    Unpacks as ``(value, bound, holds)``. With ``exact``, ``t_opt`` is the
    optimum and `holds` is True or False; otherwise ``t_opt`` is a lower
    bound of it and `holds` is True (proved: value <= 2·lower bound <=
    2·T_opt) or None (the lower bound is too weak to decide)."""

    value: float
    """T of RS2 (k chosen for T alone, alpha = 1)."""
    bound: float
    """2 · t_opt."""
    holds: Optional[bool]
    t_opt: float
    exact: bool
    rounds: int

    def __iter__(self) -> Iterator[Any]:
        return iter((self.value, self.bound, self.holds))


def rs2_bound(fleet: Fleet, exact_limit: int = 8, ties: str = TIES, rs2: Optional[Schedule] = None) -> BoundCheck:
    """Checks §4.3's bound on this fleet (see `BoundCheck`): T_opt exactly
    when the fleet has at most `exact_limit` VMs, else its lower bound."""
    s = rs2 if rs2 is not None else plan(fleet, "RS2", alpha=1.0, ties=ties)
    tol = 1e-9 * max(1.0, s.T)
    if fleet.n <= exact_limit:
        t = optimum(fleet, 1.0, max(exact_limit, fleet.n)).T
        return BoundCheck(s.T, 2 * t, s.T <= 2 * t + tol, t, True, len(s.rounds))
    lb = lower_bound_T(fleet)
    return BoundCheck(s.T, 2 * lb, True if s.T <= 2 * lb + tol else None, lb, False, len(s.rounds))


# --- the vmfleet size distribution --------------------------------------


def vmfleet_sizes(n: int, seed: int = 1, scale: float = 1.0) -> list[int]:
    """Image sizes of n VMs shaped like the harness's ``vmfleet`` workload
    (``strata-bench gen vmfleet``, after the paper's §4 and §5): an OS
    region of 10 GB plus a lognormal data region (median 16 GB, σ = 1.1,
    at least one 2 MiB segment, at most 700 GB), all × `scale` and rounded
    up to whole 2 MiB segments: mean ≈ 40 GB, a long tail (§4: the
    smallest 100 VMs average 15 GB, the largest over 700 GB). Seeded
    (Python's generator: the same shape as the Rust generator's, not the
    same numbers)."""
    rng = random.Random(seed)

    def segs(b: float) -> int:
        return max(1, math.ceil(b / SEGMENT))

    os_segs = segs(10e9 * scale)
    mu = math.log(16e9 * scale)
    out = []
    for _ in range(n):
        x = min(max(rng.lognormvariate(mu, 1.1), float(SEGMENT)), 700e9 * scale)
        out.append((os_segs + segs(x)) * SEGMENT)
    return out


def vmfleet(n: int, hosts: int = 4, seed: int = 1, dirty: float = DEFAULT_DIRTY, unique: float = DEFAULT_UNIQUE, scale: float = 1.0) -> list[VmTask]:
    """n VMs of `vmfleet_sizes`, dealt to host-0 … host-(hosts-1) in turn."""
    return [
        VmTask(f"vm-{i:03d}", f"host-{i % hosts}", s, dirty=dirty, unique=unique)
        for i, s in enumerate(vmfleet_sizes(n, seed, scale))
    ]
