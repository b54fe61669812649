"""The fleet's stages driven in-process (no Ray: `Direct` executor, host
agents as plain objects): what happens between the two reads of an image."""

from __future__ import annotations

import os
from pathlib import Path

import strata
from strata_fleet.host import HostAgent
from strata_fleet.job import Direct, Job
from strata_fleet.manifest import Vm


def test_a_block_changed_between_the_reads_is_stored_as_read_then(tmp_path: Path, cli) -> None:
    """Blocks 0 and 2 hold X at the scan; the guest writes Y to block 2
    before the second read (no reflink on this file system). The
    dup-with-new answer for block 2 (X) must not replace the Y it was
    stored as: the version restores as the image was at the second read,
    and the next job, with the image unchanged, still restores Y."""
    repo_dir = tmp_path / "repo"
    repo = strata.init(repo_dir, cache_dir=tmp_path / "c")
    img = tmp_path / "vm0.img"
    X, Y = os.urandom(4096), os.urandom(4096)
    data = bytearray(os.urandom(4 << 20))
    data[0:4096] = X
    data[8192:12288] = X
    img.write_bytes(bytes(data))
    cfg = {"url": str(repo_dir), "password": None, "cache_dir": str(tmp_path / "c"), "s3": []}
    agent = HostAgent("h0", 0, str(tmp_path / "work"), cfg)
    vm = Vm(name="vm0", host="h0", image=str(img), size=len(data), index=0)

    def guest_writes(stage: str) -> None:
        if stage == "store":
            with open(img, "r+b") as f:
                f.seek(8192)
                f.write(Y)

    for k, hook in enumerate((guest_writes, lambda s: None)):
        job = Job([agent], ["h0"], [str(tmp_path / "work")], 35 << 20, 4, f"j{k}", Direct(), before_stage=hook)
        job.validate()
        out = job.run_round(0, [vm])
        assert len(out["snapshots"]) == 1, out
        cli(repo_dir, "restore", "vm0@latest", "--target", str(tmp_path / f"out{k}"))
        assert (tmp_path / f"out{k}" / "vm0.img").read_bytes() == img.read_bytes(), f"job {k}"
    assert [s.version for s in repo.snapshots()] == [1, 2]
    cli(repo_dir, "check", "--read-data")


def test_an_image_larger_than_a_recipe_piece(tmp_path: Path, cli) -> None:
    """A 72 MiB image (18 432 blocks: its recipe node is stored in two
    pieces, which scan and finish read and write a piece at a time):
    restores whole, and the next day, with blocks changed in both pieces,
    takes the clean segments of both pieces from the previous version."""
    repo_dir = tmp_path / "repo"
    repo = strata.init(repo_dir, cache_dir=tmp_path / "c")
    img = tmp_path / "vm0.img"
    blocks = 18432
    data = bytearray(blocks * 4096)
    for b in range(0, blocks, 7):
        data[b * 4096 : b * 4096 + 16] = b.to_bytes(16, "little")
    img.write_bytes(bytes(data))
    cfg = {"url": str(repo_dir), "password": None, "cache_dir": str(tmp_path / "c"), "s3": []}
    agent = HostAgent("h0", 0, str(tmp_path / "work"), cfg)
    for day in range(2):
        if day == 1:
            with open(img, "r+b") as f:
                for b in (5, 9000, 17000, 18431):
                    f.seek(b * 4096)
                    f.write(os.urandom(4096))
        vm = Vm(name="vm0", host="h0", image=str(img), size=img.stat().st_size, index=0)
        job = Job([agent], ["h0"], [str(tmp_path / "work")], 35 << 20, 4, f"j{day}", Direct())
        job.validate()
        out = job.run_round(0, [vm])
        assert len(out["snapshots"]) == 1, out
        if day == 1:
            assert out["dirty_segments"] == 4, out
        cli(repo_dir, "restore", "vm0@latest", "--target", str(tmp_path / f"out{day}"))
        assert (tmp_path / f"out{day}" / "vm0.img").read_bytes() == img.read_bytes(), f"day {day}"
    assert [s.version for s in repo.snapshots()] == [1, 2]
    cli(repo_dir, "check", "--read-data")
