#!/usr/bin/env python3
"""Fleet figures (issue 12): `strata-fleet run` on N simulated hosts (a
real multi-node Ray cluster on this machine) against single-host `exact`
with fixed 4 KiB blocks (`strata backup --chunker fixed`), day by day of
the harness's `vmfleet` workload.

  scripts/bench-fleet.py WORK [--scale 0.01] [--vms 8] [--days 3] [--hosts 4] [--memory 35M] [--one-image]

Per day: unique bytes of both repositories (they must be equal), the
fleet job's wall time, each host's peak stage memory (the worker's VmHWM),
CPU seconds and bytes sent/received, the bytes exchanged per stage, and
the single-host backup time. Needs the release build (`cargo build
--release`) and the Python package in the interpreter running this
(`scripts/python-env` or `pip install '.[fleet]'`). Results: WORK/fleet-results.json
and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def strata(repo: str, *args: str) -> subprocess.CompletedProcess:
    return run([os.path.join(BIN, "strata"), "--repo", repo, *args])


def join_images(images: str) -> None:
    """Replaces the VM directories of `images` by one, vm-all, whose
    disk.img is their images one after the other (kept sparse)."""
    out_dir = os.path.join(images, "vm-all")
    os.makedirs(out_dir)
    zero = bytes(1 << 20)
    with open(os.path.join(out_dir, "disk.img"), "wb") as out:
        for vm in sorted(v for v in os.listdir(images) if v != "vm-all"):
            src = os.path.join(images, vm, "disk.img")
            with open(src, "rb") as f:
                while chunk := f.read(1 << 20):
                    if chunk == zero[: len(chunk)]:
                        out.seek(len(chunk), os.SEEK_CUR)
                    else:
                        out.write(chunk)
            shutil.rmtree(os.path.join(images, vm))
        out.truncate(out.tell())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--scale", default="0.01")
    ap.add_argument("--vms", type=int, default=8)
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--memory", default="35M")
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--one-image", action="store_true",
                    help="join each day's VM images into one image (vm-all): a large image's stage memory")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    images, fleet_repo, exact_repo = (os.path.join(work, x) for x in ("images", "fleet-repo", "exact-repo"))
    for r in (fleet_repo, exact_repo):
        shutil.rmtree(r, ignore_errors=True)
        strata(r, "init", "--index", "exact")
    shutil.rmtree(os.path.join(work, "fleet-work"), ignore_errors=True)
    env = dict(os.environ, STRATA_CACHE_DIR=os.path.join(work, "cache"))
    days = []
    for day in range(1, a.days + 1):
        shutil.rmtree(images, ignore_errors=True)
        run([os.path.join(BIN, "strata-bench"), "gen", "vmfleet", "--scale", a.scale, "--streams", str(a.vms),
             "--out", images, "--version", str(day)])
        if a.one_image:
            join_images(images)
        logical = sum(os.path.getsize(os.path.join(images, v, f)) for v in os.listdir(images) for f in os.listdir(os.path.join(images, v)))
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "strata_fleet", "run", "--cluster", f"local:{a.hosts}", "--repo", fleet_repo,
                            "--images", images, "--memory", a.memory, "--partitions", str(a.partitions),
                            "--work", os.path.join(work, "fleet-work"), "--json"], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        fleet = json.loads(p.stdout)
        fleet_wall = time.monotonic() - t0
        t0 = time.monotonic()
        for vm in sorted(os.listdir(images)):
            strata(exact_repo, "backup", "--chunker", "fixed", "--no-lifecycle", "--series", vm,
                   os.path.join(images, vm, "disk.img"))
        exact_secs = time.monotonic() - t0
        exact_unique = json.loads(strata(exact_repo, "--json", "stats").stdout)["unique_bytes"]
        days.append({"day": day, "logical_bytes": logical, "fleet": fleet, "fleet_wall_seconds": fleet_wall,
                     "exact_unique_bytes": exact_unique, "exact_seconds": exact_secs})
        print(f"day {day}: fleet unique {fleet['unique_bytes']} exact unique {exact_unique} "
              f"({'equal' if fleet['unique_bytes'] == exact_unique else 'DIFFERENT'}), fleet job {fleet['seconds']:.1f}s, exact {exact_secs:.1f}s",
              file=sys.stderr)
    with open(os.path.join(work, "fleet-results.json"), "w") as f:
        json.dump({"args": vars(a), "days": days}, f, indent=1)
    mb = lambda b: f"{b / 1e6:.1f}"  # noqa: E731
    print("| day | logical MB | fleet unique MB | exact unique MB | equal | fleet job s (of it Ray start) | exact s | max host peak MB | max host CPU s | exchanged MB (scan/compare/store/update) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in days:
        f = d["fleet"]
        st = f["stages"]
        ex = "/".join(mb(st.get(s, {}).get("bytes_exchanged", 0)) for s in ("scan", "compare", "store", "update"))
        rounds = sum(r["seconds"] for r in f["rounds"])
        print(f"| {d['day']} | {mb(d['logical_bytes'])} | {mb(f['unique_bytes'])} | {mb(d['exact_unique_bytes'])} | "
              f"{'yes' if f['unique_bytes'] == d['exact_unique_bytes'] else 'NO'} | {f['seconds']:.1f} ({f['seconds'] - rounds:.1f}) | "
              f"{d['exact_seconds']:.1f} | {mb(max(h['peak_rss_bytes'] for h in f['hosts']))} | "
              f"{max(h['cpu_seconds'] for h in f['hosts']):.1f} | {ex} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
