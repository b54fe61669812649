"""The agent of one host: runs each stage in a worker process (and
measures its peak memory and CPU), and moves the stages' exchange files
between hosts. On Ray it is an actor pinned to its host's node; tests
may also use it directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

PIECE = 4 << 20


class StageFailed(RuntimeError):
    """A stage's worker failed (its message names the host and stage)."""


class HostAgent:
    def __init__(self, name: str, index: int, work: str, repo: dict[str, Any]) -> None:
        self.name = name
        self.index = index
        self.work = Path(work)
        self.repo = repo
        self.sent: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self.work.mkdir(parents=True, exist_ok=True)

    def ping(self) -> str:
        return self.name

    def node(self) -> str:
        return os.uname().nodename

    def run_stage(self, stage: str, args: dict[str, Any], retries: int = 1) -> dict[str, Any]:
        """Runs `stage` in a worker process; a worker that dies (killed,
        out of memory) is run once more (stages can be run again)."""
        last = ""
        for attempt in range(retries + 1):
            t0 = time.monotonic()
            p = subprocess.Popen(
                # The stage in argv too: `ps` shows what each worker does.
                [sys.executable, "-m", "strata_fleet.worker", stage, self.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(os.environ, PYTHONNOUSERSITE="1", MALLOC_ARENA_MAX=os.environ.get("MALLOC_ARENA_MAX", "2")),
            )
            payload = json.dumps({"stage": stage, "host": self.name, "args": args, "repo": self.repo}).encode()
            # communicate: a worker's large stderr cannot block it.
            out, err = p.communicate(payload)
            wall = time.monotonic() - t0
            if p.returncode == 0:
                report = json.loads(out)
                # The worker's own VmHWM and CPU time (its rusage): a
                # child's ru_maxrss counts the forked parent's pages from
                # before exec.
                return {
                    "stage": stage,
                    "host": self.name,
                    "report": report,
                    "peak_rss_bytes": int(report.get("peak_rss", 0)),
                    "cpu_seconds": float(report.get("cpu_seconds", 0.0)),
                    "seconds": wall,
                    "attempts": attempt + 1,
                }
            try:
                msg = json.loads(out).get("error", "")
            except ValueError:
                msg = ""
            last = msg or err.decode(errors="replace").strip()[-2000:] or f"exit status {p.returncode}"
            if msg:
                break  # a reported error: running it again would not help
        raise StageFailed(f"host {self.name}: stage {stage} failed: {last}")

    # --- exchanges -------------------------------------------------------

    def _send(self, round_: str, kind: str, dest: int) -> Path:
        return self.work / "rounds" / round_ / "send" / f"{kind}-to-{dest}"

    def _recv(self, round_: str, kind: str, src: int) -> Path:
        return self.work / "rounds" / round_ / "recv" / f"{kind}-from-{src}"

    def outgoing(self, round_: str, kind: str, hosts: int) -> list[int]:
        """Sizes of this host's outgoing files of `kind`; the one to
        itself is moved into place at once (no network)."""
        sizes = []
        for d in range(hosts):
            p = self._send(round_, kind, d)
            sizes.append(p.stat().st_size if p.exists() else 0)
        own = self._send(round_, kind, self.index)
        dst = self._recv(round_, kind, self.index)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if own.exists():
            os.replace(own, dst)
        else:
            dst.write_bytes(b"")
        return sizes

    def read_piece(self, round_: str, kind: str, dest: int, offset: int, stage: str) -> bytes:
        with open(self._send(round_, kind, dest), "rb") as f:
            f.seek(offset)
            data = f.read(PIECE)
        self.sent[stage] = self.sent.get(stage, 0) + len(data)
        return data

    def begin_receive(self, round_: str, kind: str, src: int) -> None:
        p = self._recv(round_, kind, src)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")

    def write_piece(self, round_: str, kind: str, src: int, offset: int, data: bytes, stage: str) -> int:
        p = self._recv(round_, kind, src)
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.received[stage] = self.received.get(stage, 0) + len(data)
        return len(data)

    def traffic(self) -> dict[str, dict[str, int]]:
        return {"sent": dict(self.sent), "received": dict(self.received)}

    def rss(self) -> int:
        """This agent's own resident memory (the Ray worker, not a stage)."""
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def clean_round(self, round_: str) -> None:
        import shutil

        shutil.rmtree(self.work / "rounds" / round_, ignore_errors=True)
