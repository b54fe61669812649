"""Shared fixtures of the Python tests (run by scripts/test after
`maturin develop` into the test virtualenv)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def strata_bin() -> str:
    """The `strata` CLI the Rust build made (scripts/test sets
    STRATA_TEST_BIN), else one on PATH."""
    b = os.environ.get("STRATA_TEST_BIN") or shutil.which("strata")
    if not b or not os.path.exists(b):
        pytest.skip("no strata binary: set STRATA_TEST_BIN (scripts/test does)")
    return b


@pytest.fixture
def cli(tmp_path: Path):
    """Runs the strata CLI against a repository; returns the completed
    process (raises on a non-zero exit unless check=False)."""

    def run(repo: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        e = dict(os.environ, STRATA_CACHE_DIR=str(tmp_path / "cli-cache"))
        e.update(env or {})
        p = subprocess.run(
            [strata_bin(), "--repo", str(repo), *args], capture_output=True, text=True, env=e
        )
        if check and p.returncode != 0:
            raise AssertionError(f"strata {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    return run


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree: text, a 3 MB random file, a subdirectory, a symlink."""
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("hello\n")
    (root / "big.bin").write_bytes(os.urandom(3 << 20))
    (root / "sub" / "b.txt").write_text("below\n" * 1000)
    os.symlink("a.txt", root / "link")
    return root
