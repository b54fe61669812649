"""The coordinator of a fleet job: rounds of VMs, each through the stages
of Parallel VM batch dedup §3 on every host at once, with the exchanges
between hosts in between (see strata_store::fleet for the stages).

    validate (once) → per round: scan → [req] → route → compare → [ans]
    → store → [ref] → update → [dwn] → finish

``[kind]``: every host's outgoing file to every other host is moved as
4 MiB pieces, host to host (on Ray: through the object store, never the
driver); the bytes are counted per host and stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .host import PIECE, StageFailed
from .manifest import Vm

class HostLeft(RuntimeError):
    """Hosts whose agent is gone (the node left the cluster)."""

    def __init__(self, hosts: list[str], during: str) -> None:
        super().__init__(f"host {', '.join(hosts)} left the cluster during {during}")
        self.hosts = hosts


def actor_gone(e: BaseException) -> bool:
    """Whether a Ray error says the actor (its node) is gone."""
    try:
        import ray.exceptions as rx
    except ImportError:
        return False
    return isinstance(e, (rx.RayActorError, rx.ActorUnavailableError, rx.NodeDiedError))


EXCHANGES = {"scan": "req", "compare": "ans", "store": "ref", "update": "dwn"}
ROUND_STAGES = ["scan", "route", "compare", "store", "update", "finish"]


class Executor:
    """Calls agents' methods: in-process (tests) or as Ray actor calls."""

    def call(self, agent: Any, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def get(self, futures: list[Any]) -> list[Any]:
        raise NotImplementedError


class Direct(Executor):
    def call(self, agent: Any, method: str, *args: Any) -> Any:
        return getattr(agent, method)(*args)

    def get(self, futures: list[Any]) -> list[Any]:
        return list(futures)


class RayExecutor(Executor):
    def __init__(self) -> None:
        import ray

        self.ray = ray

    def call(self, agent: Any, method: str, *args: Any) -> Any:
        return getattr(agent, method).remote(*args)

    def get(self, futures: list[Any]) -> list[Any]:
        return self.ray.get(futures)


@dataclass
class HostStats:
    name: str
    peak_rss_bytes: int = 0
    cpu_seconds: float = 0.0
    stage_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    stages: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class Job:
    agents: list[Any]
    hosts: list[str]
    work: list[str]
    memory: int
    q: int
    job_id: str
    ex: Executor
    progress: Callable[[str], None] = lambda s: None
    # Called before each stage (the fault tests remove a node here).
    before_stage: Callable[[str], None] = lambda s: None
    stats: dict[str, HostStats] = field(default_factory=dict)
    stage_totals: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stats = {h: HostStats(h) for h in self.hosts}

    def _args(self, h: int, round_: str, vms: list[Vm]) -> dict[str, Any]:
        return {
            "work": self.work[h],
            "round": round_,
            "hosts": len(self.hosts),
            "q": self.q,
            "me": h,
            "memory": self.memory,
            "vms": [
                {
                    "vm": v.index,
                    "name": v.name,
                    "image": v.image,
                    "changed": v.changed,
                    "host_name": v.host,
                    "tags": ["fleet", f"fleet-job:{self.job_id}"],
                }
                for v in vms
                if v.host == self.hosts[h]
            ],
        }

    def gone(self, during: str) -> HostLeft:
        """Which agents no longer answer."""
        dead = []
        for h, a in enumerate(self.agents):
            try:
                self.ex.get([self.ex.call(a, "ping")])
            except Exception as e:
                if not actor_gone(e):
                    raise
                dead.append(self.hosts[h])
        return HostLeft(dead, during)

    def stage(self, name: str, round_: str, vms: list[Vm]) -> list[dict[str, Any]]:
        self.before_stage(name)
        t0 = time.monotonic()
        futs = [self.ex.call(a, "run_stage", name, self._args(h, round_, vms)) for h, a in enumerate(self.agents)]
        results, dead = [], []
        for h, f in enumerate(futs):
            try:
                results.append(self.ex.get([f])[0])
            except Exception as e:
                if not actor_gone(e):
                    raise
                dead.append(self.hosts[h])
        if dead:
            raise HostLeft(dead, f"stage {name}")
        wall = time.monotonic() - t0
        tot = self.stage_totals.setdefault(name, {"seconds": 0.0, "bytes_exchanged": 0})
        tot["seconds"] += wall
        for r in results:
            s = self.stats[r["host"]]
            s.peak_rss_bytes = max(s.peak_rss_bytes, r["peak_rss_bytes"])
            s.cpu_seconds += r["cpu_seconds"]
            s.stage_seconds += r["seconds"]
            st = s.stages.setdefault(name, {"peak_rss_bytes": 0, "cpu_seconds": 0.0, "seconds": 0.0})
            st["peak_rss_bytes"] = max(st["peak_rss_bytes"], r["peak_rss_bytes"])
            st["cpu_seconds"] += r["cpu_seconds"]
            st["seconds"] += r["seconds"]
        return results

    def exchange(self, kind: str, stage: str, round_: str) -> int:
        """Moves every host's `send/KIND-to-D` to host D; returns bytes."""
        p = len(self.agents)
        sizes = self.ex.get([self.ex.call(a, "outgoing", round_, kind, p) for a in self.agents])
        self.ex.get(
            [self.ex.call(self.agents[d], "begin_receive", round_, kind, h) for h in range(p) for d in range(p) if d != h]
        )
        moves = [(h, d, off) for h in range(p) for d in range(p) if d != h for off in range(0, sizes[h][d], PIECE)]
        total = sum(sizes[h][d] for h in range(p) for d in range(p) if d != h)
        window = 2 * p
        for i in range(0, len(moves), window):
            futs = []
            for h, d, off in moves[i : i + window]:
                data = self.ex.call(self.agents[h], "read_piece", round_, kind, d, off, stage)
                futs.append(self.ex.call(self.agents[d], "write_piece", round_, kind, h, off, data, stage))
            self.ex.get(futs)
        for h in range(p):
            sent = sum(sizes[h][d] for d in range(p) if d != h)
            received = sum(sizes[x][h] for x in range(p) if x != h)
            s = self.stats[self.hosts[h]]
            s.bytes_sent += sent
            s.bytes_received += received
            st = s.stages.setdefault(stage, {"peak_rss_bytes": 0, "cpu_seconds": 0.0, "seconds": 0.0})
            st["bytes_sent"] = st.get("bytes_sent", 0) + sent
            st["bytes_received"] = st.get("bytes_received", 0) + received
        self.stage_totals.setdefault(stage, {"seconds": 0.0, "bytes_exchanged": 0})["bytes_exchanged"] += total
        return total

    def validate(self) -> list[dict[str, Any]]:
        return self.stage("validate", f"{self.job_id}-validate", [])

    def run_round(self, k: int, vms: list[Vm]) -> dict[str, Any]:
        round_ = f"{self.job_id}-r{k}"
        t0 = time.monotonic()
        out: dict[str, Any] = {"round": k, "vms": [v.name for v in vms]}
        for name in ROUND_STAGES:
            self.progress(f"round {k}: {name}")
            results = self.stage(name, round_, vms)
            if name in EXCHANGES:
                try:
                    self.exchange(EXCHANGES[name], name, round_)
                except Exception as e:
                    if not actor_gone(e):
                        raise
                    raise self.gone(f"the exchange after {name}") from e
            if name == "finish":
                out["snapshots"] = [v for r in results for v in r["report"]["vms"] if "error" not in v]
                out["failed"] = [{"name": v["name"], "error": v["error"]} for r in results for v in r["report"]["vms"] if "error" in v]
            if name == "scan":
                out["scan_bytes_read"] = sum(v["bytes_read"] for r in results for v in r["report"]["vms"])
                out["dirty_segments"] = sum(v["dirty_segments"] for r in results for v in r["report"]["vms"])
            if name == "compare":
                out["duplicates"] = sum(r["report"]["duplicates"] for r in results)
                out["new"] = sum(r["report"]["new"] for r in results)
                out["dup_with_new"] = sum(r["report"]["dup_with_new"] for r in results)
        out["seconds"] = time.monotonic() - t0
        self.ex.get([self.ex.call(a, "clean_round", round_) for a in self.agents])
        return out

    def sweep(self, vms: list[Vm]) -> dict[str, Any]:
        """Parallel mark-and-sweep over the partitions (§3, snapshot
        deletion): marks from every VM's remaining snapshots, then each
        partition drops what nothing marked."""
        round_ = f"{self.job_id}-sweep"
        self.stage("mark", round_, vms)
        self.exchange("mark", "mark", round_)
        results = self.stage("sweep", round_, vms)
        self.ex.get([self.ex.call(a, "clean_round", round_) for a in self.agents])
        log: dict[str, int] = {}
        for r in results:
            for c, n in r["report"]["deletion_log"].items():
                log[c] = log.get(c, 0) + n
        return {
            "index_entries": sum(r["report"]["index_entries"] for r in results),
            "dead_entries": sum(r["report"]["dead_entries"] for r in results),
            "dead_bytes": sum(r["report"]["dead_bytes"] for r in results),
            "containers_with_dead_bytes": len(log),
        }

    def host_report(self) -> list[dict[str, Any]]:
        return [
            {
                "name": s.name,
                "peak_rss_bytes": s.peak_rss_bytes,
                "cpu_seconds": round(s.cpu_seconds, 3),
                "stage_seconds": round(s.stage_seconds, 3),
                "bytes_sent": s.bytes_sent,
                "bytes_received": s.bytes_received,
                "stages": s.stages,
            }
            for s in self.stats.values()
        ]


def failed_stage(e: BaseException) -> Optional[str]:
    """The message of a stage failure inside a Ray error, if it is one."""
    if isinstance(e, StageFailed):
        return str(e)
    cause = getattr(e, "cause", None)
    if isinstance(cause, StageFailed):
        return str(cause)
    return None
