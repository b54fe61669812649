"""The repository's secrets (its password, S3 credentials) for a job's
stages, kept out of Ray: host agents are Ray actors, and what an actor is
given travels in its creation task, which the cluster keeps and shows. So
the agents get the path of a file only the job's user can read (0600, in
the job's work directory, deleted when the job's process exits), and each
stage's worker process reads the secrets from it."""

from __future__ import annotations

import atexit
import json
import os
import secrets as _random
from pathlib import Path
from typing import Any, Optional


def repo_config(url: str, password: Optional[str], work: Path) -> dict[str, Any]:
    """What the host agents are given to open the repository: its URL,
    the cache directory, and the path of the secrets file written here."""
    import strata

    work.mkdir(parents=True, exist_ok=True)
    path = work / f"secrets-{_random.token_hex(8)}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"password": password, "s3": strata._s3_settings(None)}, f)
    atexit.register(lambda: path.unlink(missing_ok=True))
    return {"url": url, "cache_dir": strata._cache_dir(None), "secrets": str(path)}


def load(repo: dict[str, Any]) -> tuple[Optional[str], list[tuple[str, str]]]:
    """The password and S3 settings of a repository config: from its
    secrets file, or (tests that build a config by hand) from the config."""
    path = repo.get("secrets")
    if path:
        with open(path) as f:
            s = json.load(f)
        return s.get("password"), [tuple(x) for x in s.get("s3", [])]
    return repo.get("password"), [tuple(x) for x in repo.get("s3", [])]
