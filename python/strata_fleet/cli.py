"""``strata-fleet``: fleet-wide batch dedup of VM images on Ray.

    strata-fleet run --cluster local:4 --repo DIR --images DIR [--memory 35M] [--rounds 1] [--json]
    strata-fleet forget --cluster local:4 --repo DIR --images DIR --keep-last N [--gc] [--json]
    strata-fleet plan --manifest vms.toml [--hosts N] [--alpha 0.5] [--rounds auto|K] [--json]

``plan`` prints the round schedule (§4: the RS2 heuristic and the others of
§4.2, predicted job span J and average VM backup time T, against one
round, and the RS2 bound check) before anything runs; ``run`` backs up every VM into one shared repository (each VM a series;
any snapshot restores with the plain ``strata`` CLI). ``--cluster
local:N`` starts N simulated hosts on this machine (a Ray node each);
``ray://HOST:PORT`` or ``auto`` joins a running cluster whose nodes were
started with ``--resources '{"strata_host_I": 1}'`` (I = 0 … p-1, in the
order of the hosts' names). The repository's password comes from
``$STRATA_PASSWORD`` or ``--password-file``; S3 settings from the usual
AWS variables. Exit status: 0 all VMs backed up, 3 some VMs failed (the
others are committed), 1 the job failed (nothing half-committed: run it
again to resume), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .manifest import ManifestError, Vm, from_directory, load_manifest
from .secrets import repo_config


def parse_size(s: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = s.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (e.g. 35M)")


def rounds_for(vms: list[Vm], rounds: str, alpha: float) -> tuple[list[list[Vm]], dict[str, Any]]:
    """The VMs in rounds, in the order they run: §4.2's RS2 (largest VM
    first, into the round where its host's load is smallest) with the
    number of rounds that minimises alpha·T + (1−alpha)·J (``auto``) or
    K; rounds run shortest-per-VM first (see strata_fleet.schedule)."""
    from .schedule import Fleet, VmTask, plan

    if not vms:
        return [], {}
    tasks = [
        VmTask(v.name, v.host, max(v.size, 1), dirty_bytes=sum(n for _, n in v.changed) if v.changed is not None else None)
        for v in vms
    ]
    s = plan(Fleet(tasks), "RS2", alpha, rounds if rounds == "auto" else int(rounds))
    predicted = {"heuristic": s.heuristic, "rounds": len(s.rounds), "T_seconds": s.T, "J_seconds": s.J}
    return [[vms[i] for i in r] for r in s.rounds], predicted


def start_cluster(spec: str, hosts: list[str]) -> Any:
    import ray

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if spec.startswith("local:"):
        from ray.cluster_utils import Cluster

        n = int(spec.split(":", 1)[1])
        if n < len(hosts):
            raise ManifestError(f"the VMs live on {len(hosts)} hosts but --cluster {spec} has {n}")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        cluster.strata_nodes = {}
        for i, h in enumerate(hosts):
            cluster.strata_nodes[h] = cluster.add_node(num_cpus=1, resources={f"strata_host_{i}": 1})
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        return cluster
    ray.init(address=spec, logging_level="ERROR", log_to_driver=False)
    return None


def start_agents(a: argparse.Namespace, hosts: list[str], work: Path, repo_cfg: dict[str, Any]) -> tuple[Any, Any, list[Any]]:
    """The cluster (``--cluster``) and one host agent per host, each a
    Ray actor pinned to its host's node."""
    import ray

    from .host import HostAgent

    cluster = start_cluster(a.cluster, hosts)
    Agent = ray.remote(HostAgent)
    agents = [
        Agent.options(num_cpus=0, resources={f"strata_host_{i}": 0.01}, max_concurrency=4).remote(
            h, i, str(work / "hosts" / h), repo_cfg
        )
        for i, h in enumerate(hosts)
    ]
    return cluster, Agent, agents


def common_args(ap: argparse.ArgumentParser) -> None:
    """The options `run` and `forget` share."""
    ap.add_argument("--cluster", default="local:4", help="local:N (N simulated hosts), ray://HOST:PORT or auto")
    ap.add_argument("--repo", required=True, help="the shared repository (directory or s3://BUCKET/PREFIX)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="a directory of images (a subdirectory per VM, or an image file per VM)")
    src.add_argument("--manifest", help="a TOML manifest of VMs (see strata_fleet.manifest)")
    ap.add_argument("--memory", type=parse_size, default=parse_size("35M"), help="memory cap M of each host's stages (default 35M)")
    ap.add_argument("--partitions", type=int, default=16, help="index partitions per host, q (default 16)")
    ap.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "strata", "fleet"), help="each host's local work directory (index partitions, scratch)")
    ap.add_argument("--password-file", help="read the repository password from this file")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")


def load_input(a: argparse.Namespace) -> tuple[list[Vm], Optional[str], Any]:
    """The VMs, the password, and where the report goes (with --json,
    standard output is kept for it: Ray's notices go to standard error)."""
    hosts_hint = [f"host-{i}" for i in range(int(a.cluster.split(":")[1]))] if a.cluster.startswith("local:") else ["host-0"]
    vms = load_manifest(a.manifest) if a.manifest else from_directory(a.images, hosts_hint)
    password = None
    if a.password_file:
        password = Path(a.password_file).read_text().rstrip("\n")
    elif os.environ.get("STRATA_PASSWORD"):
        password = os.environ["STRATA_PASSWORD"]
    out = sys.stdout
    if a.json:
        sys.stdout.flush()
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    return vms, password, out


def forget(argv: list[str]) -> int:
    """``strata-fleet forget --keep-last N``: expired VM snapshots removed,
    then the parallel mark-and-sweep over the index partitions (§3,
    snapshot deletion), then, with ``--gc``, the repository's compaction."""
    ap = argparse.ArgumentParser(prog="strata-fleet forget", description="Remove expired VM snapshots; mark and sweep the fleet's index.")
    common_args(ap)
    ap.add_argument("--keep-last", type=int, required=True, help="versions of each VM to keep (at least 1)")
    ap.add_argument("--gc", action="store_true", help="then free the space (strata gc)")
    ap.add_argument("--gc-threshold", type=float, default=0.2, help="with --gc: rewrite containers with more than this fraction dead (default 0.2, as strata gc)")
    a = ap.parse_args(argv)
    if a.keep_last < 1:
        print("strata-fleet: --keep-last must be at least 1", file=sys.stderr)
        return 2
    try:
        vms, password, out = load_input(a)
    except (ManifestError, ValueError) as e:
        print(f"strata-fleet: {e}", file=sys.stderr)
        return 2
    import strata
    from strata import _native

    from .job import Job, RayExecutor

    try:
        repo = strata.open(a.repo, password)
    except strata.StrataError as e:
        print(f"strata-fleet: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    drop = []
    for v in vms:
        snaps = sorted(repo.snapshots(series=v.name), key=lambda s: s.version)
        drop += [s.id for s in snaps[: max(0, len(snaps) - a.keep_last)]]
    report: dict[str, Any] = {"forgotten": len(drop)}
    if drop:
        report["forget"] = repo.forget(drop)
    hosts = sorted({v.host for v in vms})
    work = Path(a.work) / repo.id
    repo_cfg = repo_config(a.repo, password, work)
    cluster, _, agents = start_agents(a, hosts, work, repo_cfg)
    import ray

    job = Job(agents, hosts, [str(work / "hosts" / h) for h in hosts], a.memory, a.partitions, time.strftime("forget-%Y%m%dT%H%M%S"), RayExecutor())
    lock = _native.Lock(repo._n, "fleet mark-and-sweep")
    try:
        job.validate()
        report["sweep"] = job.sweep([v for v in vms if not v.problem])
    finally:
        lock.release()
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    report["hosts"] = job.host_report()
    if a.gc:
        report["gc"] = repo.gc(a.gc_threshold)
    report["seconds"] = time.monotonic() - t0
    if a.json:
        print(json.dumps(report, indent=1), file=out)
        out.flush()
    else:
        sw = report["sweep"]
        print(f"forgot {len(drop)} snapshots; the index dropped {sw['dead_entries']} blocks ({sw['dead_bytes'] / 1e6:.1f} MB) "
              f"in {sw['containers_with_dead_bytes']} containers, {sw['index_entries']} remain"
              + (f"; gc deleted {report['gc']['containers_deleted']} containers" if a.gc else "; run with --gc (or strata gc) to free the space"))
    return 0


def leave_hook(cluster: Any) -> Any:
    """Test hook (the fleet's fault tests): ``STRATA_FLEET_FAULT=leave:HOST:STAGE``
    removes HOST's Ray node (of a ``local:N`` cluster) just before STAGE,
    the first time that stage comes."""
    parts = os.environ.get("STRATA_FLEET_FAULT", "").split(":")
    if len(parts) != 3 or parts[0] != "leave" or cluster is None:
        return lambda stage: None
    done = []

    def hook(stage: str) -> None:
        if stage == parts[2] and not done and parts[1] in cluster.strata_nodes:
            done.append(1)
            cluster.remove_node(cluster.strata_nodes[parts[1]], allow_graceful=False)

    return hook


def job_id(work: Path, vms: list[Vm], resume: bool) -> str:
    """A new job's id, or the unfinished one's (run again to resume)."""
    state = work / "job.json"
    key = json.dumps(sorted((v.name, v.image) for v in vms))
    if resume and state.exists():
        try:
            s = json.loads(state.read_text())
            if not s.get("finished") and s.get("key") == key:
                return s["id"]
        except (ValueError, KeyError):
            pass
    jid = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"id": jid, "key": key, "finished": False}))
    return jid


def run(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="strata-fleet run", description="Back up every VM of a cluster into one repository.")
    common_args(ap)
    ap.add_argument("--rounds", default="1", help="number of rounds K, or auto (the K minimising alpha·T + (1−alpha)·J, §4.2)")
    ap.add_argument("--alpha", type=float, default=0.5, help="weight of the average VM backup time T against the job span J (default 0.5)")
    ap.add_argument("--no-resume", action="store_true", help="start a new job even if the last one did not finish")
    a = ap.parse_args(argv)
    try:
        vms, password, out = load_input(a)
    except (ManifestError, ValueError) as e:
        print(f"strata-fleet: {e}", file=sys.stderr)
        return 2
    return execute(a, vms, password, out)


def execute(a: argparse.Namespace, vms: list[Vm], password: Optional[str], out: Any) -> int:
    import strata
    from strata import _native

    from .job import HostLeft, Job, RayExecutor, failed_stage

    bad = [v for v in vms if v.problem]
    good = [v for v in vms if not v.problem]
    hosts = sorted({v.host for v in vms})
    try:
        repo = strata.open(a.repo, password)
    except strata.StrataError as e:
        print(f"strata-fleet: {e}", file=sys.stderr)
        return 2
    work = Path(a.work) / repo.id
    jid = job_id(work, vms, not a.no_resume)
    repo_cfg = repo_config(a.repo, password, work)
    t0 = time.monotonic()
    try:
        cluster, Agent, agents = start_agents(a, hosts, work, repo_cfg)
    except (ManifestError, ValueError, ConnectionError) as e:
        print(f"strata-fleet: --cluster {a.cluster}: {e}", file=sys.stderr)
        return 2
    import ray
    say = (lambda s: None) if a.json else (lambda s: print(f"  {s}", file=sys.stderr))
    job = Job(agents, hosts, [str(work / "hosts" / h) for h in hosts], a.memory, a.partitions, jid, RayExecutor(), say)
    lock = _native.Lock(repo._n, f"fleet job {jid}")
    left: list[str] = []
    report: dict[str, Any] = {"job": jid, "hosts_count": len(hosts), "memory": a.memory, "partitions_per_host": a.partitions}
    status = 0
    try:
        done = {s.series for s in repo.snapshots() if f"fleet-job:{jid}" in s.tags}
        todo = [v for v in good if v.name not in done]
        plan, report["predicted"] = rounds_for(todo, a.rounds, a.alpha)
        job.before_stage = leave_hook(cluster)
        report["index"] = {r["host"]: {k: r["report"][k] for k in ("rebuilt", "index_entries", "dropped")} for r in job.validate()}
        rounds = []
        i = 0
        while i < len(plan):
            vms_i = [v for v in plan[i] if v.host not in left]
            try:
                rounds.append(job.run_round(i, vms_i))
                # A VM whose image could not be read fails alone.
                for f in rounds[-1]["failed"]:
                    v = next(v for v in vms_i if v.name == f["name"])
                    v.problem = f["error"]
                    bad.append(v)
                i += 1
            except HostLeft as e:
                # Its VMs fail; another host adopts its index partitions
                # (empty: what they held is stored again) and the round
                # runs again for the others.
                alive = [h for h in hosts if h not in left and h not in e.hosts]
                if not alive or not e.hosts:
                    raise
                for h in e.hosts:
                    left.append(h)
                    idx = hosts.index(h)
                    sur = hosts.index(alive[idx % len(alive)])
                    job.agents[idx] = Agent.options(
                        num_cpus=0, resources={f"strata_host_{sur}": 0.01}, max_concurrency=4
                    ).remote(h, idx, str(work / "hosts" / f"{h}@{hosts[sur]}"), repo_cfg)
                    job.work[idx] = str(work / "hosts" / f"{h}@{hosts[sur]}")
                    agents[idx] = job.agents[idx]
                    for v in (v for r in plan[i:] for v in r if v.host == h):
                        v.problem = f"VM {v.name}: its host {h} left the cluster ({e})"
                        bad.append(v)
                job.ex.get([job.ex.call(a, "clean_round", f"{jid}-r{i}") for n, a in zip(hosts, job.agents) if n not in left])
        report["rounds"] = rounds
        report["resumed_vms"] = sorted(done)
        (work / "job.json").write_text(json.dumps({"id": jid, "finished": True}))
    except Exception as e:  # a stage failed: report it, nothing half-committed
        msg = failed_stage(e) or f"{type(e).__name__}: {e}"
        report["error"] = msg
        status = 1
    finally:
        lock.release()
    report["failed_vms"] = [{"name": v.name, "error": v.problem} for v in bad]
    report["hosts_left"] = left
    if bad and status == 0:
        status = 3
    report["hosts"] = job.host_report()
    report["agent_rss_bytes"] = {}
    for h, x in zip(hosts, agents):
        try:
            report["agent_rss_bytes"][h] = ray.get(x.rss.remote(), timeout=30)
        except Exception:  # a host that left
            report["agent_rss_bytes"][h] = None
    report["stages"] = job.stage_totals
    report["seconds"] = time.monotonic() - t0
    st = repo.stats()
    report["unique_bytes"] = st["unique_bytes"]
    report["logical_bytes"] = st["logical_bytes"]
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    if a.json:
        print(json.dumps(report, indent=1), file=out)
        out.flush()
    else:
        print_report(report)
    for v in bad:
        print(f"strata-fleet: {v.problem} (nothing committed for it)", file=sys.stderr)
    if "error" in report:
        print(f"strata-fleet: {report['error']}; nothing of the unfinished round was committed: run the same command again to resume", file=sys.stderr)
    return status


def print_report(r: dict[str, Any]) -> None:
    mb = lambda b: f"{b / 1e6:.1f} MB"  # noqa: E731
    for rd in r.get("rounds", []):
        print(f"round {rd['round']}: {len(rd['vms'])} VMs, {rd['seconds']:.1f}s, {rd['duplicates']} duplicate / {rd['new']} new / {rd['dup_with_new']} dup-with-new blocks")
    print(f"unique data: {mb(r['unique_bytes'])} of {mb(r['logical_bytes'])} logical, {r['seconds']:.1f}s")
    for h in r["hosts"]:
        print(f"  {h['name']}: peak {mb(h['peak_rss_bytes'])} (cap {mb(r['memory'])}), cpu {h['cpu_seconds']:.1f}s, sent {mb(h['bytes_sent'])}, received {mb(h['bytes_received'])}")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        return run(rest)
    if cmd == "forget":
        return forget(rest)
    if cmd == "plan":
        from .plan import main as plan_main

        return plan_main(rest)
    print(f"strata-fleet: unknown command {cmd!r} (run, forget, plan)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
