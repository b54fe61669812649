"""The `strata` Python API against real repositories (a directory, and
the S3 server scripts/test starts when STRATA_TEST_S3 is set)."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import strata


def same_tree(a: Path, b: Path) -> None:
    names_a = sorted(p.relative_to(a) for p in a.rglob("*"))
    names_b = sorted(p.relative_to(b) for p in b.rglob("*"))
    assert names_a == names_b
    for rel in names_a:
        pa, pb = a / rel, b / rel
        assert pa.is_symlink() == pb.is_symlink(), rel
        if pa.is_symlink():
            assert os.readlink(pa) == os.readlink(pb)
        elif pa.is_file():
            assert pa.read_bytes() == pb.read_bytes(), rel


def test_backup_list_restore_read(tmp_path: Path, tree: Path) -> None:
    repo = strata.init(tmp_path / "repo", cache_dir=tmp_path / "cache")
    b = repo.backup(tree, tags=["nightly"])
    assert b.snapshot.version == 1 and b.snapshot.files == 3  # a.txt, big.bin, b.txt (and a link)
    assert b.snapshot.tags == ["nightly"]
    assert b.snapshot.logical_bytes >= 3 << 20
    # A second backup of the unchanged tree stores (almost) nothing.
    b2 = repo.backup(tree)
    assert b2.snapshot.version == 2 and b2.snapshot.parent == b.id
    assert b2.snapshot.new_raw_bytes == 0
    assert [s.version for s in repo.snapshots()] == [1, 2]
    assert repo.snapshot("latest").id == b2.id
    assert repo.snapshot(b.id[:10]).id == b.id

    out = tmp_path / "out"
    r = repo.restore(b.id, out)
    assert r.files == 3 and r.bytes == b.snapshot.logical_bytes
    same_tree(tree, out / str(tree).lstrip("/"))

    # Random access into a file of the snapshot.
    rel = str(tree / "big.bin").lstrip("/")
    want = (tree / "big.bin").read_bytes()
    with repo.open_file("latest", rel) as f:
        assert f.seek(1_000_003) == 1_000_003
        assert f.read(5000) == want[1_000_003:1_005_003]
        f.seek(-10, io.SEEK_END)
        assert f.read() == want[-10:]
        assert f.read() == b""
    assert repo.read_file(b.id, rel) == want


def test_stream_backup_and_stats(tmp_path: Path) -> None:
    repo = strata.init(tmp_path / "repo", cache_dir=tmp_path / "cache")
    blob = os.urandom(1 << 20) * 4  # 4 MiB, one MiB repeated
    b = repo.backup(stream=io.BytesIO(blob), stream_name="disk.img", series="vm1", chunker="fixed")
    assert b.snapshot.series == "vm1" and b.snapshot.logical_bytes == len(blob)
    assert repo.read_file("vm1@latest", "disk.img") == blob
    st = repo.stats()
    # Fixed 4 KiB blocks: the repeated MiB is stored once.
    assert st["unique_bytes"] == 1 << 20
    assert st["unique_bytes"] == st["unique_raw_bytes"]
    # bytes work as a stream too.
    b2 = repo.backup(stream=b"abc" * 1000, stream_name="small", series="s")
    assert repo.read_file(b2.id, "small") == b"abc" * 1000


def test_interoperates_with_the_cli(tmp_path: Path, tree: Path, cli) -> None:
    """What Python stores the CLI restores, and the other way round."""
    repo_dir = tmp_path / "repo"
    repo = strata.init(repo_dir, cache_dir=tmp_path / "cache")
    b = repo.backup(tree)
    cli(repo_dir, "restore", b.id, "--target", str(tmp_path / "by-cli"))
    same_tree(tree, tmp_path / "by-cli" / str(tree).lstrip("/"))
    cli(repo_dir, "backup", "--series", "from-cli", str(tree / "sub"))
    s = repo.snapshot("from-cli@latest")
    assert s.files == 1
    assert repo.read_file(s.id, str(tree / "sub" / "b.txt").lstrip("/")) == b"below\n" * 1000
    cli(repo_dir, "check", "--read-data")
    st = json.loads(cli(repo_dir, "--json", "stats").stdout)
    assert st["unique_bytes"] == repo.stats()["unique_bytes"]


def test_encrypted_repository(tmp_path: Path, tree: Path, cli, monkeypatch) -> None:
    monkeypatch.delenv("STRATA_PASSWORD", raising=False)
    url = tmp_path / "repo"
    fast = dict(kdf_memory_kib=1024, kdf_iterations=1)
    repo = strata.init(url, "correct horse", cache_dir=tmp_path / "c", **fast)
    b = repo.backup(tree / "a.txt")
    with pytest.raises(strata.WrongPassword):
        strata.open(url, "wrong", cache_dir=tmp_path / "c")
    with pytest.raises(strata.StrataError, match="encrypted"):
        strata.open(url, cache_dir=tmp_path / "c")
    again = strata.open(url, b"correct horse", cache_dir=tmp_path / "c")
    assert again.read_file(b.id, str(tree / "a.txt").lstrip("/")) == b"hello\n"
    # The password from the environment, as the CLI.
    monkeypatch.setenv("STRATA_PASSWORD", "correct horse")
    assert strata.open(url, cache_dir=tmp_path / "c").snapshot().id == b.id
    cli(url, "check", env={"STRATA_PASSWORD": "correct horse"})


def test_errors_are_typed_and_clear(tmp_path: Path, tree: Path) -> None:
    with pytest.raises(strata.RepositoryNotFound, match="strata init"):
        strata.open(tmp_path / "none")
    repo = strata.init(tmp_path / "repo", cache_dir=tmp_path / "c")
    with pytest.raises(strata.AlreadyExists):
        strata.init(tmp_path / "repo")
    with pytest.raises(strata.SnapshotNotFound):
        repo.snapshot("latest")
    repo.backup(tree)
    with pytest.raises(strata.SnapshotNotFound):
        repo.snapshot("ffffffff")
    with pytest.raises(strata.SnapshotNotFound, match="no file"):
        repo.open_file("latest", "not/there")
    with pytest.raises(strata.StrataError, match="not a file"):
        repo.open_file("latest", str(tree / "sub").lstrip("/"))
    with pytest.raises(strata.StrataError, match="chunker"):
        repo.backup(tree, chunker="bogus")
    with pytest.raises(strata.StrataError, match="nothing to back up"):
        repo.backup([])
    with pytest.raises(strata.StrataError, match="overwrite"):
        repo.restore("latest", tmp_path / "o", overwrite="sometimes")

    class NotBytes:
        def read(self, n: int) -> str:
            return "text"

    before = len(repo.snapshots())
    with pytest.raises(strata.StrataError, match="must return bytes"):
        repo.backup(stream=NotBytes(), series="bad")
    assert len(repo.snapshots()) == before  # nothing committed


def test_long_calls_release_the_gil(tmp_path: Path) -> None:
    """Another Python thread runs while a backup reads a large stream."""
    repo = strata.init(tmp_path / "repo", cache_dir=tmp_path / "c")
    ticks = 0
    stop = threading.Event()

    def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        data = os.urandom(1 << 20) * 48
        t0 = time.monotonic()
        repo.backup(stream=data, series="big", stream_name="x")
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    # The ticker sleeps 1 ms a tick: with the GIL held for the whole
    # backup it could not have ticked more than a handful of times.
    assert ticks > min(20, took * 100), (ticks, took)


def test_ctrl_c_cancels_a_backup_and_commits_nothing(tmp_path: Path) -> None:
    repo = strata.init(tmp_path / "repo", cache_dir=tmp_path / "c")
    repo.backup(stream=b"first", series="s", stream_name="f")

    class Slow:
        """A long stream (~2000 reads, 10 s) that sends SIGINT to this
        process after 20 reads."""

        def __init__(self) -> None:
            self.reads = 0

        def read(self, n: int) -> bytes:
            self.reads += 1
            if self.reads == 20:
                signal.raise_signal(signal.SIGINT)
            if self.reads > 2000:
                return b""
            time.sleep(0.005)
            return os.urandom(min(n, 65536))

    src = Slow()
    t0 = time.monotonic()
    # A shell's background job starts with SIGINT ignored, and Python then
    # installs no handler of its own: install it for the test.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            repo.backup(stream=src, series="s", stream_name="f")
    finally:
        signal.signal(signal.SIGINT, old)
    assert src.reads < 2000, "the backup read the whole stream: the interrupt did not stop it"
    assert time.monotonic() - t0 < 30
    # The interrupted version was not committed; the repository works on.
    assert [s.version for s in repo.snapshots()] == [1]
    b = repo.backup(stream=b"second", series="s", stream_name="f")
    assert b.snapshot.version == 2
    assert repo.read_file("s@1", "f") == b"first"


@pytest.mark.skipif(not os.environ.get("STRATA_TEST_S3"), reason="no S3 server (scripts/test starts one)")
def test_s3_repository(tmp_path: Path, tree: Path) -> None:
    s3 = {
        "endpoint": os.environ["STRATA_TEST_S3"],
        "access_key_id": os.environ.get("STRATA_TEST_S3_KEY", "strata"),
        "secret_access_key": os.environ.get("STRATA_TEST_S3_SECRET", "strata-secret"),
        "region": "us-east-1",
    }
    url = f"s3://strata-py/{os.getpid()}-{time.time_ns()}"
    repo = strata.init(url, "pw", s3=s3, cache_dir=tmp_path / "c", kdf_memory_kib=1024, kdf_iterations=1)
    b = repo.backup(tree)
    again = strata.open(url, "pw", s3=s3, cache_dir=tmp_path / "c2")
    out = tmp_path / "out"
    again.restore(b.id, out)
    same_tree(tree, out / str(tree).lstrip("/"))
    assert again.stats()["unique_bytes"] == repo.stats()["unique_bytes"]
