"""`strata-fleet run` on a real multi-node Ray cluster on this machine
(one Ray node per simulated host): dedup identical to single-host `exact`
with fixed 4 KiB blocks, per-host memory under the cap, worker kills,
bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import strata_bin

pytest.importorskip("ray")

MIB = 1 << 20


def bench_bin() -> str:
    b = os.path.join(os.path.dirname(strata_bin()), "strata-bench")
    if not os.path.exists(b):
        pytest.skip("no strata-bench next to the strata binary (cargo test --workspace builds it)")
    return b


def gen_fleet(out: Path, version: int, vms: int = 6, runs: int = 24) -> None:
    """Day `version` of a small fleet: day 1 of the harness's `vmfleet`
    (made afresh: the generator is seeded), then for each later day, in
    every image, runs of new random blocks, blocks copied from another
    VM's image (duplicates first met in the same job: dup-with-new) and
    zeroed blocks. (At this scale the generator's 3 % of dirty segments a
    day would round to none.)"""
    import random
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [bench_bin(), "gen", "vmfleet", "--scale", "0.0006", "--streams", str(vms), "--out", str(out), "--version", "1"],
        check=True,
        capture_output=True,
    )
    images = sorted(out.glob("*/disk.img"))
    for day in range(2, version + 1):
        rng = random.Random(day)
        shared = [rng.randbytes(4096) for _ in range(64)]
        for img in images:
            blocks = img.stat().st_size // 4096
            with open(img, "r+b") as f:
                for _ in range(runs):
                    start = rng.randrange(blocks - 16)
                    kind = rng.random()
                    for b in range(start, start + rng.randrange(1, 16)):
                        f.seek(b * 4096)
                        if kind < 0.5:
                            f.write(rng.randbytes(4096))
                        elif kind < 0.85:
                            f.write(shared[b % len(shared)])
                        else:
                            f.write(bytes(4096))


def fleet(tmp: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, STRATA_CACHE_DIR=str(tmp / "cache"), STRATA_FLEET_FAULT_DIR=str(tmp))
    e.pop("STRATA_FLEET_FAULT", None)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "strata_fleet", "run", "--work", str(tmp / "work"), *args],
        capture_output=True,
        text=True,
        env=e,
        timeout=600,
    )


def exact_unique(cli, tmp: Path, images: Path, repo: Path) -> int:
    """Single-host `exact` with fixed 4 KiB blocks of the same images."""
    if not repo.exists():
        cli(repo, "init", "--index", "exact")
    for vm in sorted(images.iterdir()):
        cli(repo, "backup", "--chunker", "fixed", "--no-lifecycle", "--series", vm.name, str(vm / "disk.img"))
    return json.loads(cli(repo, "--json", "stats").stdout)["unique_bytes"]


def test_fleet_dedup_equals_single_host_exact(tmp_path: Path, cli) -> None:
    images, repo, ref = tmp_path / "images", tmp_path / "repo", tmp_path / "exact"
    cli(repo, "init", "--index", "exact")
    for week in (1, 2):
        gen_fleet(images, week)
        # Day 2 in two rounds: blocks first met in round 1 are duplicates in round 2.
        p = fleet(tmp_path, "--cluster", "local:4", "--repo", str(repo), "--images", str(images), "--json",
                  "--rounds", str(week))
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)
        assert r["unique_bytes"] == exact_unique(cli, tmp_path, images, ref), f"week {week}"
        assert len(r["hosts"]) == 4
        for h in r["hosts"]:
            assert set(h) >= {"name", "peak_rss_bytes", "cpu_seconds", "bytes_sent", "bytes_received"}
            assert 0 < h["peak_rss_bytes"] <= 35 * 1000 * 1000, h
            # Single-threaded stages: never more than one core on a host.
            assert h["cpu_seconds"] <= h["stage_seconds"] * 1.05 + 0.5, h
        # Requests, answers, references and dup-with-new results crossed hosts.
        assert all(r["stages"][s]["bytes_exchanged"] > 0 for s in ("scan", "compare")), r["stages"]
        snaps = [s for rd in r["rounds"] for s in rd["snapshots"]]
        assert len(snaps) == 6 and all(s["version"] == week for s in snaps)
        assert len(r["rounds"]) == week
        if week == 2:
            assert sum(rd["dup_with_new"] for rd in r["rounds"]) > 0
            assert 0 < sum(rd["dirty_segments"] for rd in r["rounds"])
    cli(repo, "check", "--read-data")
    # A snapshot restores with the plain CLI, byte-exact.
    vm = sorted(images.iterdir())[2]
    cli(repo, "restore", f"{vm.name}@latest", "--target", str(tmp_path / "out"))
    assert (tmp_path / "out" / "disk.img").read_bytes() == (vm / "disk.img").read_bytes()


def test_worker_killed_mid_stage_is_run_again(tmp_path: Path, cli) -> None:
    images, repo = tmp_path / "images", tmp_path / "repo"
    gen_fleet(images, 1, vms=4)
    cli(repo, "init", "--index", "exact")
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(images), "--json",
              env={"STRATA_FLEET_FAULT": "store:host-1:once"})
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "fault-store-host-1").exists()  # the kill happened
    r = json.loads(p.stdout)
    assert sum(len(rd["snapshots"]) for rd in r["rounds"]) == 4
    # What the killed attempt stored is garbage gc removes; then the
    # dedup is exact's.
    cli(repo, "gc")
    got = json.loads(cli(repo, "--json", "stats").stdout)["unique_bytes"]
    assert got == exact_unique(cli, tmp_path, images, tmp_path / "exact")
    cli(repo, "check", "--read-data")


def test_failed_job_commits_nothing_and_a_rerun_finishes(tmp_path: Path, cli) -> None:
    images, repo = tmp_path / "images", tmp_path / "repo"
    gen_fleet(images, 1, vms=4)
    cli(repo, "init", "--index", "exact")
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(images), "--json",
              env={"STRATA_FLEET_FAULT": "store:host-0"})
    assert p.returncode == 1
    assert "host-0" in p.stderr and "store" in p.stderr and "run the same command again" in p.stderr
    assert json.loads(cli(repo, "--json", "snapshots").stdout) == []
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(images), "--json")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(cli(repo, "--json", "snapshots").stdout)) == 4
    cli(repo, "gc")
    got = json.loads(cli(repo, "--json", "stats").stdout)["unique_bytes"]
    assert got == exact_unique(cli, tmp_path, images, tmp_path / "exact")


def test_bad_input(tmp_path: Path, cli) -> None:
    images, repo = tmp_path / "images", tmp_path / "repo"
    gen_fleet(images, 1, vms=3)
    cli(repo, "init", "--index", "exact")
    vms = sorted(images.iterdir())
    manifest = tmp_path / "vms.toml"
    lines = [f'[[vm]]\nname = "{v.name}"\nhost = "h{i % 2}"\nimage = "{v / "disk.img"}"\n' for i, v in enumerate(vms)]
    lines.append('[[vm]]\nname = "ghost"\nhost = "h0"\nimage = "/nonexistent/ghost.img"\n')
    manifest.write_text("\n".join(lines))
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--manifest", str(manifest), "--json")
    assert p.returncode == 3, p.stderr
    assert "ghost" in p.stderr and "nothing committed for it" in p.stderr
    r = json.loads(p.stdout)
    assert [f["name"] for f in r["failed_vms"]] == ["ghost"]
    series = sorted(s["series"] for s in json.loads(cli(repo, "--json", "snapshots").stdout))
    assert series == sorted(v.name for v in vms)
    # An unreadable or malformed manifest: one clear line, exit 2.
    p = fleet(tmp_path, "--repo", str(repo), "--manifest", str(tmp_path / "missing.toml"))
    assert p.returncode == 2 and "cannot read the manifest" in p.stderr
    manifest.write_text('[[vm]]\nname = "a"\nhost = "h"\nimage = "x"\n[[vm]]\nname = "a"\nhost = "h"\nimage = "y"\n')
    p = fleet(tmp_path, "--repo", str(repo), "--manifest", str(manifest))
    assert p.returncode == 2 and "two VMs named 'a'" in p.stderr
    manifest.write_text("[[vm]\n")
    p = fleet(tmp_path, "--repo", str(repo), "--manifest", str(manifest))
    assert p.returncode == 2 and "not valid TOML" in p.stderr


def test_a_host_leaving_fails_only_its_vms(tmp_path: Path, cli) -> None:
    images, repo = tmp_path / "images", tmp_path / "repo"
    gen_fleet(images, 1, vms=6)
    cli(repo, "init", "--index", "exact")
    p = fleet(tmp_path, "--cluster", "local:3", "--repo", str(repo), "--images", str(images), "--json",
              env={"STRATA_FLEET_FAULT": "leave:host-1:compare"})
    assert p.returncode == 3, p.stderr
    r = json.loads(p.stdout)
    assert r["hosts_left"] == ["host-1"]
    # --images puts VMs on the hosts in turn: vm-001 and vm-004 on host-1.
    failed = sorted(f["name"] for f in r["failed_vms"])
    assert failed == ["vm-001", "vm-004"], r["failed_vms"]
    assert all("host-1 left the cluster" in f["error"] for f in r["failed_vms"])
    assert "host-1" in p.stderr and "nothing committed for it" in p.stderr
    series = sorted(s["series"] for s in json.loads(cli(repo, "--json", "snapshots").stdout))
    assert series == ["vm-000", "vm-002", "vm-003", "vm-005"]
    cli(repo, "check", "--read-data")
    for vm in ("vm-000", "vm-005"):
        cli(repo, "restore", f"{vm}@latest", "--target", str(tmp_path / vm))
        assert (tmp_path / vm / "disk.img").read_bytes() == (images / vm / "disk.img").read_bytes()


def test_changed_block_lists_skip_clean_segments(tmp_path: Path, cli) -> None:
    """With a changed-block list per VM, only the segments it names are
    read; the dedup is still exact's."""
    import shutil

    day1, day2, repo = tmp_path / "day1", tmp_path / "day2", tmp_path / "repo"
    gen_fleet(day1, 1, vms=3)
    gen_fleet(day2, 2, vms=3, runs=2)
    cli(repo, "init", "--index", "exact")
    work = tmp_path / "images"
    shutil.copytree(day1, work)
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(work), "--json")
    assert p.returncode == 0, p.stderr
    # Day 2 over day 1 in place, and each VM's changed 4 KiB blocks listed.
    lines, total = [], 0
    for i, vm in enumerate(sorted(day2.iterdir())):
        old, new = (work / vm.name / "disk.img").read_bytes(), (vm / "disk.img").read_bytes()
        total += len(new)
        extents = [(o, 4096) for o in range(0, max(len(old), len(new)), 4096) if old[o:o + 4096] != new[o:o + 4096]]
        (work / vm.name / "disk.img").write_bytes(new)
        cb = tmp_path / f"{vm.name}.dirty"
        cb.write_text("# offset length\n" + "".join(f"{o} {n}\n" for o, n in extents))
        lines.append(f'[[vm]]\nname = "{vm.name}"\nhost = "h{i % 2}"\nimage = "{work / vm.name / "disk.img"}"\nchanged_blocks = "{cb}"\n')
    manifest = tmp_path / "vms.toml"
    manifest.write_text("\n".join(lines))
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--manifest", str(manifest), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    # The manifest names the hosts h0, h1 (the first job's were host-0,
    # host-1): their index partitions were rebuilt from the repository.
    assert all(i["rebuilt"] and i["index_entries"] > 0 for i in r["index"].values()), r["index"]
    read = sum(rd["scan_bytes_read"] for rd in r["rounds"])
    assert 0 < read < total / 2, (read, total)
    ref = tmp_path / "exact2"
    exact_unique(cli, tmp_path, day1, ref)
    assert r["unique_bytes"] == exact_unique(cli, tmp_path, day2, ref)
    cli(repo, "check", "--read-data")
    cli(repo, "restore", "vm-002@latest", "--target", str(tmp_path / "out"))
    assert (tmp_path / "out" / "disk.img").read_bytes() == (day2 / "vm-002" / "disk.img").read_bytes()


def test_an_unreadable_image_fails_alone(tmp_path: Path, cli) -> None:
    """An image that exists but cannot be read (here: a directory) fails
    its VM in the scan; the others are backed up."""
    images, repo = tmp_path / "images", tmp_path / "repo"
    gen_fleet(images, 1, vms=3)
    cli(repo, "init", "--index", "exact")
    (tmp_path / "odd.img").mkdir()
    vms = sorted(images.iterdir())
    lines = [f'[[vm]]\nname = "{v.name}"\nhost = "h{i % 2}"\nimage = "{v / "disk.img"}"\n' for i, v in enumerate(vms)]
    lines.append('[[vm]]\nname = "odd"\nhost = "h1"\nimage = "odd.img"\n')  # relative to the manifest
    manifest = tmp_path / "vms.toml"
    manifest.write_text("\n".join(lines))
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--manifest", str(manifest), "--json")
    assert p.returncode == 3, p.stderr
    r = json.loads(p.stdout)
    assert [f["name"] for f in r["failed_vms"]] == ["odd"], r["failed_vms"]
    assert "odd" in p.stderr
    series = sorted(s["series"] for s in json.loads(cli(repo, "--json", "snapshots").stdout))
    assert series == sorted(v.name for v in vms)
    cli(repo, "check", "--read-data")
    # A host name that is not one (it names a work directory).
    manifest.write_text('[[vm]]\nname = "a"\nhost = "../x"\nimage = "y"\n')
    p = fleet(tmp_path, "--repo", str(repo), "--manifest", str(manifest))
    assert p.returncode == 2 and "is not a host name" in p.stderr


def test_forget_marks_and_sweeps_the_partitions(tmp_path: Path, cli) -> None:
    """Expired versions forgotten, then the parallel mark-and-sweep drops
    the index entries of blocks only they held, gc frees them, and the
    next day is still deduplicated and restorable."""
    images, repo = tmp_path / "images", tmp_path / "repo"
    cli(repo, "init", "--index", "exact")
    for day in (1, 2):
        gen_fleet(images, day, vms=4)
        p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(images), "--json")
        assert p.returncode == 0, p.stderr
    before = json.loads(cli(repo, "--json", "stats").stdout)["unique_bytes"]
    e = dict(os.environ, STRATA_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run(
        [sys.executable, "-m", "strata_fleet", "forget", "--cluster", "local:2", "--repo", str(repo), "--images", str(images),
         "--work", str(tmp_path / "work"), "--keep-last", "1", "--gc", "--gc-threshold", "0", "--json"],
        capture_output=True, text=True, env=e, timeout=600,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["forgotten"] == 4
    # Day 1's blocks that day 2 overwrote are no longer in the index.
    assert r["sweep"]["dead_entries"] > 0 and r["sweep"]["index_entries"] > 0, r["sweep"]
    after = json.loads(cli(repo, "--json", "stats").stdout)["unique_bytes"]
    assert after < before
    assert sorted(s["version"] for s in json.loads(cli(repo, "--json", "snapshots").stdout)) == [2, 2, 2, 2]
    cli(repo, "check", "--read-data")
    gen_fleet(images, 3, vms=4)
    p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(images), "--json")
    assert p.returncode == 0, p.stderr
    cli(repo, "check", "--read-data")
    for vm in sorted(images.iterdir()):
        cli(repo, "restore", f"{vm.name}@latest", "--target", str(tmp_path / "out" / vm.name))
        assert (tmp_path / "out" / vm.name / "disk.img").read_bytes() == (vm / "disk.img").read_bytes()


def test_the_password_reaches_no_actor_no_process_list_and_no_ray_log(tmp_path: Path, cli) -> None:
    """The repository password (and S3 keys) go to the stages through a
    0600 file, not through Ray: the agents' config holds only its path, no
    process's command line shows the password during the job, nothing Ray
    writes holds it, and the file is gone after the job."""
    import tempfile
    import threading

    from strata_fleet.secrets import repo_config

    secret = "fleet-" + os.urandom(12).hex()
    env = {"STRATA_PASSWORD": secret}
    # What agents are given.
    cfg = repo_config("/nowhere", secret, tmp_path / "w")
    assert secret not in json.dumps(cfg), cfg
    assert os.stat(cfg["secrets"]).st_mode & 0o777 == 0o600
    assert json.loads(Path(cfg["secrets"]).read_text())["password"] == secret

    images, repo = tmp_path / "images", tmp_path / "repo"
    cli(repo, "init", "--encrypt", "--index", "exact", "--kdf-memory-kib", "8192", env=env)
    gen_fleet(images, 1, vms=3)
    # Ray's files in a short directory of their own (its sockets' paths
    # have a length limit).
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for p in Path("/proc").iterdir():
                try:
                    cmd = (p / "cmdline").read_bytes()
                except OSError:
                    continue
                if secret.encode() in cmd:
                    seen.append(cmd.decode(errors="replace"))
            done.wait(0.05)

    t = threading.Thread(target=watch)
    t.start()
    try:
        p = fleet(tmp_path, "--cluster", "local:2", "--repo", str(repo), "--images", str(images), "--json",
                  env=dict(env, RAY_TMPDIR=str(ray_tmp)))
    finally:
        done.set()
        t.join()
    try:
        assert p.returncode == 0, p.stderr
        assert not seen, seen
        files = [f for f in ray_tmp.rglob("*") if f.is_file() and not f.is_symlink()]
        assert files, "Ray wrote nothing under RAY_TMPDIR"
        leaks = [str(f) for f in files if secret.encode() in f.read_bytes()]
        assert not leaks, leaks
        assert not list((tmp_path / "work").rglob("secrets-*.json")), "the secrets file outlived the job"
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
