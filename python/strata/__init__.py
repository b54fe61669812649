"""Strata from Python: open a repository, back up paths or byte streams,
list and restore snapshots, read a file of a snapshot as a stream.

    import strata
    repo = strata.init("/srv/backups")            # or strata.open(...)
    snap = repo.backup(["/etc"], tags=["nightly"])
    repo.backup(stream=open("/dev/vda", "rb"), stream_name="vda", series="vm1", chunker="fixed")
    for s in repo.snapshots():
        print(s.short_id, s.series, s.version, s.logical_bytes)
    repo.restore("latest", "/tmp/out", include=["etc/hosts"])
    with repo.open_file(snap.id, "etc/hosts") as f:
        print(f.read().decode())

Locations are directories or ``s3://BUCKET/PREFIX`` URLs. As the ``strata``
CLI does, this layer reads the environment (``STRATA_PASSWORD``,
``STRATA_CACHE_DIR``/``STRATA_NO_CACHE``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``,
``AWS_REGION``) when an argument is not given, and passes everything down:
the native library reads no environment. Long calls release the GIL and
stop on Ctrl-C (KeyboardInterrupt), committing nothing further.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Optional, Sequence, Union

from . import _native
from ._native import (
    AlreadyExists,
    CorruptObject,
    DiskFull,
    RepositoryLocked,
    RepositoryNotFound,
    SnapshotNotFound,
    StrataError,
    UnsafePath,
    WrongPassword,
)

__all__ = [
    "open",
    "init",
    "Repository",
    "Snapshot",
    "BackupResult",
    "RestoreResult",
    "SnapshotFile",
    "StrataError",
    "RepositoryNotFound",
    "AlreadyExists",
    "WrongPassword",
    "SnapshotNotFound",
    "CorruptObject",
    "RepositoryLocked",
    "DiskFull",
    "UnsafePath",
]

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Snapshot:
    """One version of a series."""

    id: str
    series: str
    version: int
    time_ns: int
    host: str
    paths: list[str]
    tags: list[str]
    parent: Optional[str]
    tier: str
    archival: bool
    files: int
    dirs: int
    logical_bytes: int
    new_raw_bytes: int
    new_stored_bytes: int

    @property
    def short_id(self) -> str:
        """The first 8 hex digits of the id (what the CLI shows)."""
        return self.id[:8]

    @classmethod
    def _from(cls, d: dict[str, Any]) -> "Snapshot":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class BackupResult:
    """What a backup stored: the new snapshot and its figures."""

    snapshot: Snapshot
    read_bytes: int
    new_chunks: int
    seconds: float
    reused_files: int
    warnings: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.snapshot.id


@dataclass(frozen=True)
class RestoreResult:
    """What a restore wrote."""

    snapshot: str
    target: str
    files: int
    dirs: int
    bytes: int
    containers_read: int
    regions_read: int
    bytes_read: int
    skipped: int
    warnings: list[str] = field(default_factory=list)


class SnapshotFile(io.RawIOBase):
    """A file of a snapshot, readable and seekable (wrap it in
    ``io.BufferedReader`` for small reads; ``Repository.open_file`` does)."""

    def __init__(self, reader: "_native.FileReader") -> None:
        super().__init__()
        self._r = reader
        self._pos = 0

    @property
    def size(self) -> int:
        return self._r.size

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._r.path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._r.size}[whence]
        pos = base + offset
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self._r.read_at(self._pos, len(view))
        n = len(data)
        view[:n] = data
        self._pos += n
        return n

    def readall(self) -> bytes:
        data = self._r.read_at(self._pos, max(0, self._r.size - self._pos))
        self._pos += len(data)
        return data


def _s3_settings(s3: Optional[dict[str, str]]) -> list[tuple[str, str]]:
    env = os.environ
    merged = {
        "endpoint": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL", ""),
        "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION", ""),
        "access_key_id": env.get("AWS_ACCESS_KEY_ID", ""),
        "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY", ""),
        "session_token": env.get("AWS_SESSION_TOKEN", ""),
    }
    merged.update(s3 or {})
    return [(k, v) for k, v in merged.items() if v]


def _password(password: Union[str, bytes, None]) -> Optional[bytes]:
    if password is None:
        password = os.environ.get("STRATA_PASSWORD")
    if isinstance(password, str):
        return password.encode()
    return password


def _cache_dir(cache_dir: Optional[PathLike]) -> Optional[str]:
    if cache_dir is not None:
        return os.fspath(cache_dir)
    if os.environ.get("STRATA_NO_CACHE", "") not in ("", "0"):
        return None
    if os.environ.get("STRATA_CACHE_DIR"):
        return os.environ["STRATA_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "strata")


def _default_repo() -> str:
    if os.environ.get("STRATA_REPO"):
        return os.environ["STRATA_REPO"]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "strata", "repo")


class Repository:
    """An open repository. Thread-safe: share one between threads."""

    def __init__(self, native: "_native.Repository", url: str) -> None:
        self._n = native
        self.url = url

    def __repr__(self) -> str:
        return f"strata.Repository({self.url!r})"

    @property
    def id(self) -> str:
        """The repository's id."""
        return self._n.id

    def backup(
        self,
        paths: Union[PathLike, Sequence[PathLike], None] = None,
        *,
        stream: Union[BinaryIO, bytes, bytearray, memoryview, None] = None,
        stream_name: str = "stdin",
        series: Optional[str] = None,
        tags: Iterable[str] = (),
        chunker: Optional[str] = None,
        threads: Optional[int] = None,
        excludes: Iterable[str] = (),
        lifecycle: bool = True,
    ) -> BackupResult:
        """Stores a new version of a series: files and directories
        ``paths``, or one file read from ``stream`` (a binary file object
        or bytes) named ``stream_name``. ``series`` defaults to the host
        and the absolute paths, as the CLI; ``chunker="fixed"`` cuts 4 KiB
        blocks (disk images). Runs the incremental lifecycle afterwards
        unless ``lifecycle=False``."""
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        plist = [os.path.abspath(os.fspath(p)) for p in (paths or [])]
        if isinstance(stream, (bytes, bytearray, memoryview)):
            stream = io.BytesIO(bytes(stream))
        raw = self._n.backup(
            plist,
            series=series,
            tags=list(tags),
            chunker=chunker,
            threads=threads,
            excludes=list(excludes),
            stream=stream,
            stream_name=stream_name,
            lifecycle=lifecycle,
        )
        d = json.loads(raw)
        return BackupResult(
            snapshot=Snapshot._from(d),
            read_bytes=d["read_bytes"],
            new_chunks=d["new_chunks"],
            seconds=d["seconds"],
            reused_files=d["reused_files"],
            warnings=d["warnings"],
        )

    def snapshots(self, series: Optional[str] = None) -> list[Snapshot]:
        """Every snapshot (of ``series``, if given), oldest first."""
        out = [Snapshot._from(d) for d in json.loads(self._n.snapshots())]
        return [s for s in out if series is None or s.series == series]

    def snapshot(self, spec: str = "latest") -> Snapshot:
        """The snapshot ``spec`` names: an id or unique prefix, ``latest``,
        ``SERIES@VERSION`` or ``SERIES@latest``."""
        return Snapshot._from(json.loads(self._n.snapshot(spec)))

    def restore(
        self,
        spec: str,
        target: PathLike,
        *,
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        overwrite: str = "always",
    ) -> RestoreResult:
        """Restores snapshot ``spec`` into ``target`` (only the ``include``
        paths and what is below them, if given). ``overwrite``: "always",
        "if-changed", "if-newer" or "never"."""
        d = json.loads(
            self._n.restore(
                spec, os.fspath(target), include=list(include), exclude=list(exclude), overwrite=overwrite
            )
        )
        return RestoreResult(**{k: d[k] for k in RestoreResult.__dataclass_fields__})

    def open_file(self, spec: str, path: str) -> io.BufferedReader:
        """The file ``path`` of snapshot ``spec`` as a binary stream."""
        return io.BufferedReader(SnapshotFile(self._n.open_file(spec, path)), buffer_size=1 << 20)

    def read_file(self, spec: str, path: str) -> bytes:
        """The whole content of file ``path`` of snapshot ``spec``."""
        with self.open_file(spec, path) as f:
            return f.read()

    def forget(self, specs: Iterable[str]) -> dict[str, Any]:
        """Removes the snapshots ``specs`` names (ids, prefixes,
        ``SERIES@VERSION``); ``gc()`` frees what only they held."""
        return json.loads(self._n.forget(list(specs)))

    def gc(self, threshold: float = 0.2) -> dict[str, Any]:
        """Mark-and-sweep garbage collection (as ``strata gc``): dead
        containers deleted, those with more than ``threshold`` dead bytes
        rewritten."""
        return json.loads(self._n.gc(threshold))

    def stats(self) -> dict[str, Any]:
        """The repository's figures, as ``strata stats --json`` gives them
        (``unique_bytes``: plaintext bytes stored once)."""
        return json.loads(self._n.stats())


def open(
    url: Optional[PathLike] = None,
    password: Union[str, bytes, None] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    s3: Optional[dict[str, str]] = None,
) -> Repository:
    """Opens the repository at ``url`` (default: ``$STRATA_REPO`` or the
    CLI's default directory). ``s3`` may set ``endpoint``, ``region``,
    ``access_key_id``, ``secret_access_key``, ``session_token``."""
    u = os.fspath(url) if url is not None else _default_repo()
    n = _native.Repository.open(u, _password(password), _cache_dir(cache_dir), _s3_settings(s3))
    return Repository(n, u)


def init(
    url: Optional[PathLike] = None,
    password: Union[str, bytes, None] = None,
    *,
    index: str = "segment",
    chunk_size: int = 8192,
    kdf_memory_kib: Optional[int] = None,
    kdf_iterations: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
    s3: Optional[dict[str, str]] = None,
) -> Repository:
    """Creates a repository at ``url`` (encrypted when a password is given)
    and opens it. ``index``: "segment" (default), "exact", "silo",
    "binning", with options as ``strata init --index``."""
    u = os.fspath(url) if url is not None else _default_repo()
    n = _native.Repository.init(
        u,
        _password(password),
        index,
        chunk_size,
        kdf_memory_kib,
        kdf_iterations,
        _cache_dir(cache_dir),
        _s3_settings(s3),
    )
    return Repository(n, u)
