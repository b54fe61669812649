"""``strata-fleet plan``: the round schedule of a fleet job, predicted
before anything runs (Parallel VM batch dedup §4; model and heuristics:
`strata_fleet.schedule`).

    strata-fleet plan --manifest vms.toml [--hosts N] [--alpha 0.5] [--rounds auto|K]
                      [--memory 35M] [--heuristic best|RS2|…] [--json]
    strata-fleet plan --vmfleet 200 [--seed 1] [--hosts 4] [--dirty 0.03] …

Prints each round's VMs (name@host), its predicted time and end, the job
span J and the average VM backup time T, the same for every heuristic and
for one round, and §4.3's RS2 bound. ``--heuristic best`` (default) shows
the schedule with the smallest ``alpha*T + (1-alpha)*J``. ``--vmfleet N``
plans a synthetic fleet of the harness's ``vmfleet`` sizes instead.

Manifest (TOML; the file ``strata-fleet run --manifest`` reads, plus
optional keys)::

    [[vm]]
    name = "web-1"                 # required, unique
    host = "host-a"                # optional with --hosts N: VMs without one
                                   #   go to host-0 … host-(N-1) in turn
    image = "/var/lib/vms/web-1.img"   # relative paths: to the manifest's directory
    size = "40G"                   # bytes, or K/M/G/T (×1024); optional when
                                   #   the image exists (its size)
    dirty = 0.03                   # ratio of the image in dirty 2 MiB segments
    # changed_blocks = "web-1.dirty"   # or the changed extents (the format of
                                   #   strata_fleet.manifest): the 2 MiB segments
                                   #   they touch are dirty
    unique = 0.255                 # optional: predicted unique fraction of dirty bytes

    [hosts]                        # optional: every host's defaults, and the round model
    scan_mbps = 50                 # MB/s reading dirty segments (twice)
    write_mbps = 50                # MB/s writing unique blocks
    detect_us = 2.0                # µs per detection request at its partition owner
    update_us = 2.0                # µs per new block in the index update
    round_overhead_s = 10          # fixed seconds per round
    index_bytes = "8G"             # global index per host (default: index_ratio
    index_ratio = 0.008            #   × the fleet's bytes / hosts)
    seek_ms = 10
    request_bytes = 40

    [hosts.host-a]                 # one host's own throughput
    scan_mbps = 120

Without ``dirty`` or ``changed_blocks`` a VM is 3 % dirty. A ``.json``
manifest is a list of VM objects with the keys of ``[[vm]]``, or an object
``{"vm": [...], "hosts": {...}}``. Unknown keys are errors. A manifest that
cannot be read or used exits with status 2 and one line naming the file
and the problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import tomllib
from typing import Any, Optional

from .manifest import ManifestError, read_changed
from .schedule import (
    HEURISTICS,
    HOST_KEYS,
    MODEL_KEYS,
    SEGMENT,
    CostModel,
    Fleet,
    HostCosts,
    Schedule,
    VmTask,
    best_plan,
    one_round,
    plan,
    rs2_bound,
    vmfleet,
)

VM_KEYS = ("name", "host", "image", "size", "dirty", "changed_blocks", "unique")


def parse_size(s: Any) -> int:
    """Bytes from an int or a string like ``35M``, ``40G``, ``1.5TiB``
    (K/M/G/T are powers of 1024, as ``--memory`` in ``strata-fleet run``)."""
    if isinstance(s, bool):
        raise ValueError(f"not a size: {s!r}")
    if isinstance(s, (int, float)):
        if s < 0:
            raise ValueError(f"not a size: {s!r}")
        return int(s)
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = str(s).strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        v = float(num)
    except ValueError:
        raise ValueError(f"not a size: {s!r} (e.g. 40G)") from None
    if v < 0:
        raise ValueError(f"not a size: {s!r}")
    return int(v * units[unit])


def dirty_segment_bytes(extents: list[tuple[int, int]]) -> int:
    """Bytes of the 2 MiB segments these extents touch (level-1 dirty)."""
    spans = sorted((o // SEGMENT, (o + n - 1) // SEGMENT) for o, n in extents if n > 0)
    total, end = 0, -1
    for a, b in spans:
        if b <= end:
            continue
        total += b - max(a, end + 1) + 1
        end = b
    return total * SEGMENT


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} must be a number, not {v!r}")
    return float(v)


def _host_costs(table: dict[str, Any], base: HostCosts, where: str) -> HostCosts:
    vals = {k: getattr(base, k) for k in HOST_KEYS}
    for k, v in table.items():
        if k not in HOST_KEYS:
            raise ValueError(f"{where}: unknown key {k!r} (known: {', '.join(HOST_KEYS)})")
        vals[k] = _number(v, f"{where}.{k}")
    return HostCosts(**vals)


def read_manifest(path: str, hosts: Optional[int] = None, memory: Optional[int] = None) -> tuple[list[VmTask], CostModel]:
    """The VMs and the cost model of a manifest (module doc). Raises
    ManifestError with a one-line message naming `path`."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ManifestError(f"cannot read the manifest {path}: {e.strerror}") from e
    try:
        if path.endswith(".json"):
            data = json.loads(raw)
            if isinstance(data, list):
                data = {"vm": data}
        else:
            data = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        kind = "JSON" if path.endswith(".json") else "TOML"
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ManifestError(f"the manifest {path} is not valid {kind}: {msg}") from e
    try:
        return _from_data(data, path, hosts, memory)
    except ValueError as e:
        if isinstance(e, ManifestError):
            raise
        raise ManifestError(f"{path}: {e}") from e


def _from_data(data: Any, path: str, hosts: Optional[int], memory: Optional[int]) -> tuple[list[VmTask], CostModel]:
    if not isinstance(data, dict):
        raise ValueError("expected [[vm]] entries (or a JSON list of VMs)")
    extra = sorted(set(data) - {"vm", "hosts"})
    if extra:
        raise ValueError(f"unknown section {extra[0]!r} (known: vm, hosts)")
    entries = data.get("vm", [])
    if not isinstance(entries, list) or not entries:
        raise ValueError("no [[vm]] entries")
    base = os.path.dirname(path) or "."
    vms: list[VmTask] = []
    seen: set[str] = set()
    unhosted = 0
    for i, v in enumerate(entries, 1):
        if not isinstance(v, dict):
            raise ValueError(f"vm #{i} is not a table")
        unknown = sorted(set(v) - set(VM_KEYS))
        if unknown:
            raise ValueError(f"vm #{i}: unknown key {unknown[0]!r} (known: {', '.join(VM_KEYS)})")
        name = v.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"vm #{i} has no name")
        if name in seen:
            raise ValueError(f"two VMs named {name!r}")
        seen.add(name)
        host = v.get("host")
        if host is None:
            if not hosts:
                raise ValueError(f"VM {name} has no host (give host = … or --hosts N)")
            host = f"host-{unhosted % hosts}"
            unhosted += 1
        elif not isinstance(host, str) or not host:
            raise ValueError(f"VM {name}: host must be a name, not {host!r}")
        image = v.get("image")
        if image is not None:
            if not isinstance(image, str) or not image:
                raise ValueError(f"VM {name}: image must be a path, not {image!r}")
            image = image if os.path.isabs(image) else os.path.join(base, image)
        if "size" in v:
            try:
                size = parse_size(v["size"])
            except ValueError as e:
                raise ValueError(f"VM {name}: {e}") from None
        elif image is not None:
            try:
                size = os.stat(image).st_size
            except OSError as e:
                raise ValueError(f"VM {name}: no size given and its image {image} cannot be read ({e.strerror})") from None
        else:
            raise ValueError(f"VM {name}: give its size or an image")
        if "dirty" in v and "changed_blocks" in v:
            raise ValueError(f"VM {name}: give dirty or changed_blocks, not both")
        dirty_bytes = None
        kw: dict[str, Any] = {}
        if "changed_blocks" in v:
            cb = v["changed_blocks"]
            if not isinstance(cb, str):
                raise ValueError(f"VM {name}: changed_blocks must be a path")
            cb = cb if os.path.isabs(cb) else os.path.join(base, cb)
            dirty_bytes = min(dirty_segment_bytes(read_changed(cb)), size)
        if "dirty" in v:
            kw["dirty"] = _number(v["dirty"], f"VM {name}: dirty")
        if "unique" in v:
            kw["unique"] = _number(v["unique"], f"VM {name}: unique")
        vms.append(VmTask(name=name, host=host, size=size, dirty_bytes=dirty_bytes, **kw))
    model = _model(data.get("hosts", {}), vms, hosts, memory)
    return vms, model


def _model(table: Any, vms: list[VmTask], hosts: Optional[int], memory: Optional[int]) -> CostModel:
    if not isinstance(table, dict):
        raise ValueError("[hosts] must be a table")
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    per = {k: v for k, v in table.items() if isinstance(v, dict)}
    model_kw: dict[str, Any] = {}
    for k in list(scalars):
        if k in MODEL_KEYS:
            v = scalars.pop(k)
            if k == "index_bytes":
                model_kw[k] = parse_size(v)
            elif k == "request_bytes":
                model_kw[k] = int(_number(v, f"hosts.{k}"))
            else:
                model_kw[k] = _number(v, f"hosts.{k}")
                if model_kw[k] < 0:
                    raise ValueError(f"hosts.{k} must be >= 0")
    unknown = sorted(set(scalars) - set(HOST_KEYS))
    if unknown:
        raise ValueError(f"[hosts]: unknown key {unknown[0]!r} (known: {', '.join(HOST_KEYS + MODEL_KEYS)}, or a [hosts.NAME] table)")
    default = _host_costs(scalars, HostCosts(), "hosts")
    per_host = {h: _host_costs(t, default, f"hosts.{h}") for h, t in per.items()}
    vm_hosts = sorted({v.host for v in vms})
    cluster = list(vm_hosts)
    if hosts:
        if len(vm_hosts) > hosts:
            raise ValueError(f"the VMs live on {len(vm_hosts)} hosts but --hosts is {hosts}")
        j = 0
        while len(cluster) < hosts:
            if f"spare-{j}" not in cluster:
                cluster.append(f"spare-{j}")
            j += 1
    for h in per_host:
        if h not in cluster:
            raise ValueError(f"[hosts.{h}]: no VM lives on host {h!r}")
    if memory is not None:
        model_kw["memory"] = memory
    return CostModel(hosts=tuple(cluster), costs=default, per_host=per_host, **model_kw)


# --- output -------------------------------------------------------------


def fmt_time(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def schedule_json(s: Schedule, alpha: float) -> dict[str, Any]:
    f = s.fleet
    return {
        "heuristic": s.heuristic,
        "rounds": [
            {
                "round": j + 1,
                "seconds": t,
                "ends_at_s": e,
                "vms": [
                    {"name": f.vms[i].name, "host": f.vms[i].host, "size": f.vms[i].size, "dirty_bytes": f.vms[i].dirty_size, "load_s": f.load[i]}
                    for i in r
                ],
            }
            for j, (r, t, e) in enumerate(zip(s.rounds, s.round_times, s.ends))
        ],
        "job_span_s": s.J,
        "avg_backup_time_s": s.T,
        "objective_s": s.objective(alpha),
    }


def report(fleet: Fleet, alpha: float, rounds: Any, heuristic: str) -> dict[str, Any]:
    """Everything ``plan`` prints, as the ``--json`` object."""
    others = {h: plan(fleet, h, alpha, rounds) for h in HEURISTICS}
    one = one_round(fleet)
    if heuristic == "best":
        chosen = min([*others.values(), one], key=lambda s: s.objective(alpha))
    elif heuristic == "one-round":
        chosen = one
    else:
        chosen = others[heuristic]
    rs2 = others["RS2"] if alpha == 1.0 and rounds == "auto" else None
    b = rs2_bound(fleet, rs2=rs2)
    return {
        "vms": fleet.n,
        "hosts": fleet.hosts,
        "alpha": alpha,
        "rounds_requested": rounds,
        "memory": fleet.model.memory,
        "model": {
            "round_fixed_s": fleet.lb_setup,
            "index_bytes_per_host": fleet.index_bytes,
            "partitions_per_host_min": fleet.q_min,
            "hosts": {h: vars(fleet.model.host_costs(h)) for h in fleet.hosts},
        },
        "heuristic": chosen.heuristic,
        "schedule": schedule_json(chosen, alpha),
        "one_round": schedule_json(one, alpha),
        "heuristics": {
            name: {"rounds": len(s.rounds), "job_span_s": s.J, "avg_backup_time_s": s.T, "objective_s": s.objective(alpha)}
            for name, s in [*others.items(), ("one-round", one)]
        },
        "rs2_bound": {"value_s": b.value, "bound_s": b.bound, "holds": b.holds, "exact": b.exact, "t_opt_s": b.t_opt, "rounds": b.rounds},
    }


def print_report(r: dict[str, Any]) -> None:
    s = r["schedule"]
    print(
        f"{r['vms']} VMs on {len(r['hosts'])} hosts, alpha {r['alpha']}, M {r['memory'] / (1 << 20):.1f} MiB, "
        f"rounds {r['rounds_requested']}: {r['heuristic']}, {len(s['rounds'])} round(s)"
    )
    for rd in s["rounds"]:
        print(f"round {rd['round']}: {len(rd['vms'])} VM{'' if len(rd['vms']) == 1 else 's'}, {fmt_time(rd['seconds'])}, ends at {fmt_time(rd['ends_at_s'])}")
        names = ", ".join(f"{v['name']}@{v['host']}" for v in rd["vms"])
        print(textwrap.fill(names, width=100, initial_indent="    ", subsequent_indent="    "))
    print(f"job span J {fmt_time(s['job_span_s'])}, average VM backup time T {fmt_time(s['avg_backup_time_s'])}")
    one = r["one_round"]
    print(f"one round: J {fmt_time(one['job_span_s'])}, T {fmt_time(one['avg_backup_time_s'])}")
    print()
    print(f"{'heuristic':<28}{'rounds':>7}{'job span J':>13}{'average T':>13}{'objective':>13}")
    for name, h in r["heuristics"].items():
        mark = " *" if name == r["heuristic"] else ""
        print(f"{name:<28}{h['rounds']:>7}{fmt_time(h['job_span_s']):>13}{fmt_time(h['avg_backup_time_s']):>13}{fmt_time(h['objective_s']):>13}{mark}")
    b = r["rs2_bound"]
    what = "2·T_opt" if b["exact"] else "2·(lower bound of T_opt)"
    verdict = {True: "holds", False: "FAILS", None: "not decided by the lower bound"}[b["holds"]]
    print(f"RS2 bound (§4.3, k for T alone): T {fmt_time(b['value_s'])} <= {what} {fmt_time(b['bound_s'])}: {verdict}")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="strata-fleet plan", description="Print the round schedule of a fleet job (§4) before it runs.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--manifest", help="a TOML manifest (or .json list of VMs); see strata_fleet.plan")
    src.add_argument("--vmfleet", type=int, metavar="N", help="plan N VMs of the vmfleet size distribution instead")
    ap.add_argument("--hosts", type=int, help="hosts in the cluster (default: the VMs' hosts; 4 with --vmfleet)")
    ap.add_argument("--alpha", type=float, default=0.5, help="weight of the average backup time T against the job span J (default 0.5)")
    ap.add_argument("--rounds", default="auto", help="auto (the best k) or K")
    ap.add_argument("--memory", default="35M", help="memory cap M per host and stage (default 35M)")
    ap.add_argument("--heuristic", default="best", choices=["best", "one-round", *HEURISTICS], help="schedule to show (default: the best objective)")
    ap.add_argument("--seed", type=int, default=1, help="--vmfleet: seed (default 1)")
    ap.add_argument("--dirty", type=float, default=None, help="--vmfleet: dirty ratio of every VM (default 0.03)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    a = ap.parse_args(argv)

    def fail(msg: str) -> int:
        print(f"strata-fleet plan: {msg}", file=sys.stderr)
        return 2

    if not 0.0 <= a.alpha <= 1.0:
        return fail(f"--alpha {a.alpha} is not within 0..1")
    rounds: Any = a.rounds
    if rounds != "auto":
        try:
            rounds = int(rounds)
        except ValueError:
            return fail(f"--rounds {a.rounds!r}: auto or a number")
        if rounds < 1:
            return fail("--rounds must be at least 1")
    if a.hosts is not None and a.hosts < 1:
        return fail("--hosts must be at least 1")
    try:
        memory = parse_size(a.memory)
    except ValueError as e:
        return fail(f"--memory: {e}")
    try:
        if a.manifest:
            vms, model = read_manifest(a.manifest, a.hosts, memory)
            fleet = Fleet(vms, model)
        else:
            if a.vmfleet < 1:
                return fail("--vmfleet needs at least 1 VM")
            kw = {"dirty": a.dirty} if a.dirty is not None else {}
            fleet = Fleet(vmfleet(a.vmfleet, a.hosts or 4, a.seed, **kw), CostModel(memory=memory))
    except ManifestError as e:
        return fail(str(e))
    except ValueError as e:
        return fail(f"{a.manifest}: {e}" if a.manifest else str(e))
    r = report(fleet, a.alpha, rounds, a.heuristic)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print_report(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
