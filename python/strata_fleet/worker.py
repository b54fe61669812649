"""One fleet stage in a process of its own: ``python -m strata_fleet.worker``
reads ``{"stage", "args", "repo"}`` as JSON on standard input, runs the
stage (strata._native.fleet_stage) and prints its report as JSON. The
stage's memory is this process's, which the host agent measures."""

from __future__ import annotations

import json
import sys


def main() -> int:
    req = json.load(sys.stdin)
    from strata import _native  # only the native module: a small process

    repo = None
    r = req.get("repo")
    if r and req["stage"] in ("validate", "scan", "store", "finish"):
        pw = r.get("password")
        repo = _native.Repository.open(
            r["url"],
            pw.encode() if isinstance(pw, str) else None,
            r.get("cache_dir"),
            [tuple(x) for x in r.get("s3", [])],
        )
    try:
        out = _native.fleet_stage(req["stage"], json.dumps(req["args"]), repo)
    except _native.StrataError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
