"""One fleet stage in a process of its own: ``python -m strata_fleet.worker``
reads ``{"stage", "args", "repo"}`` as JSON on standard input, runs the
stage (strata._native.fleet_stage) and prints its report as JSON. The
stage's memory is this process's, which the host agent measures."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading


def fault(stage: str, host: str) -> None:
    """Test hook (the fleet's fault tests): ``STRATA_FLEET_FAULT=STAGE:HOST[:once]``
    kills this worker with SIGKILL 20 ms into that stage on that host —
    every time, or with ``once`` only the first time (a marker file in the
    host's work directory remembers)."""
    spec = os.environ.get("STRATA_FLEET_FAULT", "")
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] != stage or parts[1] != host:
        return
    if len(parts) > 2 and parts[2] == "once":
        marker = os.path.join(os.environ.get("STRATA_FLEET_FAULT_DIR", "/tmp"), f"fault-{stage}-{host}")
        if os.path.exists(marker):
            return
        open(marker, "w").close()
    threading.Timer(0.02, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()


def main() -> int:
    req = json.load(sys.stdin)
    fault(req["stage"], req.get("host", ""))
    from strata import _native  # only the native module: a small process

    repo = None
    r = req.get("repo")
    if r and req["stage"] in ("validate", "scan", "store", "finish", "mark"):
        from .secrets import load

        pw, s3 = load(r)
        repo = _native.Repository.open(
            r["url"],
            pw.encode() if isinstance(pw, str) else None,
            r.get("cache_dir"),
            s3,
        )
    try:
        out = _native.fleet_stage(req["stage"], json.dumps(req["args"]), repo)
    except _native.StrataError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    report = json.loads(out)
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    report["cpu_seconds"] = ru.ru_utime + ru.ru_stime
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
