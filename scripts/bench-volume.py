#!/usr/bin/python3
"""iDedup figures for Strata volumes (issue 11), through real NBD clients.

  scripts/bench-volume.py WORK [--size 256M] [--thresholds 1,2,4,8] [--caches 1,0.5,0.25] [--trace-runs 1]
  scripts/bench-volume.py WORK --fio [--fio-size 512M] [--runtime 10]
  scripts/bench-volume.py WORK --snapshots [--snapshot-size 1G] [--snapshot-written 64M] [--repeat 3]
  scripts/bench-volume.py WORK --fs-image [--tree DIR] [--changes DIR] [--image-size 1G]
  scripts/bench-volume.py WORK --served-link [--tree DIR] [--image-size 1G] [--repeat 3]
  scripts/bench-volume.py WORK --encryption [--enc-size 1G] [--repeat 3]
  scripts/bench-volume.py WORK --tls [--tls-size 1G] [--repeat 3]
  scripts/bench-volume.py WORK --serve-at [--at-size 1G] [--repeat 3]
  scripts/bench-volume.py WORK --mixed [--size 128M] [--phases seq,rand]
      [--settings off,1,2,4,8,auto,oracle] [--every 8] [--reads 4] [--seq-blocks 32]
      [--rand-reads 4] [--poll 64]

Trace mode: `strata-bench gen primary` writes a block-write trace (iDedup
§3.1/§5 locality model); this script replays it into a fresh volume per
setting with libnbd (python3-libnbd; consecutive blocks go as one write of
≤ 1 MiB), flushes, stops the server (SIGTERM: destaged, closed), drops the
page cache, serves again and reads the same requests back (then, cold
again, the same reads in a seeded random order). It reports the
dedup ratio by threshold and cache size (Fig. 7), the fragmentation CDF of
the reads (Fig. 8: physical runs per read) and client-side response-time
percentiles (Fig. 9), beside the same volume with dedup off; the server's
own figures and the disk's read I/Os of those reads; then, cold again, a
scan of the whole volume in 1 MiB reads (MB/s), and a check of every block.
With `--trace-runs N` every setting is run N times, in turn (run 1 of
each setting, then run 2, ...: the machine's noise falls on all alike);
the table and charts give medians (`volume-results-runs.json` has each
run), and a last table each setting's latency against the baseline's
with the range of the runs.

fio mode: the volume with dedup off against `nbdkit file` serving a plain
file on the same disk (the reference NBD server): 1 MiB sequential write
and read, 4 KiB random write and read (fio's nbd engine), page cache
dropped before reads.

Snapshot mode (`--snapshots [--snapshot-size 1G] [--snapshot-written N]
[--repeat 3]`): a volume of random data (its first N bytes only with
`--snapshot-written`, the rest never written: a mostly empty volume)
snapshotted once; then per round 3 × 64 KiB written into
three 2 MiB segments, a snapshot that reads only what changed, and — its
change set removed (unknown, as after a crash) — a snapshot of the same
image that reads everything (page cache dropped before each); seconds
and the snapshot process's peak RSS.

File-system mode (`--fs-image [--tree /usr/lib/python3] [--changes
/usr/share/doc] [--change-files 300] [--image-size 1G]`): real data. An
ext4 image of `--tree` (`mkfs.ext4 -d`), and a second one made from it
with debugfs (a directory of `--change-files` files of `--changes` added,
a file removed; `e2fsck` clean). The volume gets the first image's
non-zero blocks, a snapshot, then only the blocks that differ in the
second (what a VM writes), and a second snapshot; restic and borg back
up the image file, then the second image in its place. Page cache
dropped before each backup.

Served-link mode (`--served-link [--tree /usr/lib/python3] [--image-size
1G] [--repeat 3]`): linked snapshots of a served volume. An ext4 image of
`--tree` copied into a volume, served, snapshotted, 16 MiB written at 300
MiB through libnbd, snapshotted again; the volume in REPO/volumes (its
snapshots linked) against the same build with the volume under
`--volumes-dir` (not linked: copied), rounds alternating; restic backs up
the image, then the image with the same change. Page cache dropped
before each; seconds, the repository's bytes (volumes apart), the
volume's.

Encryption mode (`--encryption [--enc-size 1G] [--repeat 3]`): what a
volume in an encrypted repository (XTS-AES-256 per block) costs. One
image of random data copied into a fresh volume by nbdcopy and read back
by nbdcopy (page cache dropped, served again), for plain and encrypted
repositories, dedup on and off; MB/s, and the copy checked byte for byte.

Serve-at mode (`--serve-at [--at-size 1G] [--repeat 3]`): a volume made
from an image (half random, half repeated), snapshotted; the version
read back by `volume serve --at latest` + nbdcopy (time until it serves,
until the copy is done, the server's peak RSS), by `strata restore` and
by `strata dump`, page cache dropped before each.

TLS mode (`--tls [--tls-size 1G] [--repeat 3]`): what NBD over TLS
(`volume serve --tls-certificates`) costs. The same copy in and out over
TCP on loopback, plain and with TLS (a CA and a server certificate made
by `openssl`; nbdcopy with an nbds:// URL), dedup on and off.

Mixed mode (`--threshold auto`): the same trace, written with reads
interleaved, so that the server sees how the volume is read while it
writes. The write requests are split into equal phases (`--phases`, e.g.
`seq,rand`); after every `--every` write requests the client reads back
the region just written: in a `seq` phase `--reads` reads of
`--seq-blocks` blocks each, starting at the first block of one of those
requests (a client streaming what was just written); in a `rand` phase
`--rand-reads` reads of one 4 KiB block each, at random blocks among
those the requests wrote. The read schedule is fixed (seeded), the same
for every setting. Every read is checked against what was written. While
writing, `strata volume stats --json` is polled (every `--poll` requests)
for `threshold_used`, the threshold of the last destaged batch: for
`auto`, the thresholds it chose in each phase. `oracle` is the fixed
threshold that suits each phase (8 for seq, 1 for rand), set by stopping
the server at each phase boundary and rewriting the volume's
`volume.json` (a reference point, not a feature). After the writes the
server is stopped, the page cache dropped, and each phase's reads are
replayed on a freshly served volume (one serve per phase): those give
the fragmentation (reads touching 1 physical run) and read latencies per
phase; then every block of the final image is checked. The volume is
`--volume-size` (default 4 × --size, so that later phases overwrite
little of what earlier phases wrote).

Results: WORK/volume-results.json (trace), WORK/volume-fio.json (fio),
WORK/volume-snapshots.json (snapshots), WORK/volume-mixed.json (mixed),
WORK/volume-encryption.json (encryption) and a Markdown table on stdout.
"""

import argparse
import json
import shutil
import os
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# (`$STRATA_BENCH_BIN`: another build's directory, to compare two builds.)
BIN = os.environ.get("STRATA_BENCH_BIN") or os.path.join(ROOT, "target", "release")
BLOCK = 4096
NODE_BYTES = 96  # bytes of cache per block (strata_volume::idedup::NODE_BYTES)


def size_arg(s):
    """`512M`, `1G`, `64KiB`, `4096`: bytes (powers of 1024)."""
    t = s.strip().lower()
    for suffix in ("ib", "b"):
        if t.endswith(suffix) and t[:-len(suffix)][-1:] in "kmg":
            t = t[:-len(suffix)]
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:], 1)
    return int(float(t.rstrip("kmg")) * mult)


def drop_caches():
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def read_trace(path):
    """Requests (first block, data) of consecutive blocks, ≤ 1 MiB each."""
    with open(path, "rb") as f:
        head = f.read(40)
        magic, fmt, bs, vol_blocks, n, _seed = struct.unpack("<8sIIQQQ", head)
        assert magic == b"STRPRIM1" and fmt == 1 and bs == BLOCK, "not a primary trace"
        reqs = []
        cur_first, cur = None, []
        for _ in range(n):
            blk = struct.unpack("<Q", f.read(8))[0]
            data = f.read(BLOCK)
            if cur and blk == cur_first + len(cur) and len(cur) < 256:
                cur.append(data)
            else:
                if cur:
                    reqs.append((cur_first, b"".join(cur)))
                cur_first, cur = blk, [data]
        if cur:
            reqs.append((cur_first, b"".join(cur)))
    return vol_blocks, n, reqs


class Served:
    """`strata volume serve` on a Unix socket."""

    def __init__(self, repo, name, sock, listen=None, extra=()):
        self.sock = sock
        self.p = subprocess.Popen(
            [os.path.join(BIN, "strata"), "--repo", repo, "volume", "serve", name,
             "--listen", listen or "unix:" + sock, "--json", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        doc = ""
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit("serve ended: " + self.p.stderr.read())
            doc += line
            try:
                self.doc = json.loads(doc)
                break
            except ValueError:
                continue

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        if self.p.wait(timeout=600) != 0:
            raise SystemExit("serve failed: " + self.p.stderr.read())


def connect(sock, name):
    import nbd
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h


def serve_and_connect(repo, sock):
    """Serves volume `v` of `repo` on `sock` and connects to it."""
    s = Served(repo, "v", sock)
    return s, connect(sock, "v")


CDF_POINTS = [1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 98, 99, 99.5, 99.9]


def svg_chart(path, title, xlabel, ylabel, series, logx=False):
    """A small line chart: series = [(label, [(x, y), ...]), ...]."""
    import math
    W, H, L, B, T, R = 640, 400, 70, 50, 40, 170
    pts = [p for _, ps in series for p in ps if p[1] is not None]
    fx = (lambda v: math.log10(max(v, 1e-9))) if logx else (lambda v: v)
    xs = [fx(p[0]) for p in pts]
    ys = [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0, min(ys)), max(ys) * 1.05 or 1
    sx = lambda v: L + (fx(v) - x0) / ((x1 - x0) or 1) * (W - L - R)
    sy = lambda v: H - B - (v - y0) / ((y1 - y0) or 1) * (H - B - T)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>',
           f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" text-anchor="middle">{ylabel}</text>']
    for k in range(5):
        yv = y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{L - 6}" y="{sy(yv) + 4}" text-anchor="end">{yv:.3g}</text>')
        xv = x0 + (x1 - x0) * k / 4
        xv = 10 ** xv if logx else xv
        out.append(f'<text x="{sx(xv)}" y="{H - B + 16}" text-anchor="middle">{xv:.3g}</text>')
    for i, (label, ps) in enumerate(series):
        c = colors[i % len(colors)]
        ps = [p for p in ps if p[1] is not None]
        if ps:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{d}"/>')
        out.append(f'<text x="{W - R + 10}" y="{T + 16 * i + 10}" fill="{c}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def charts(rows, work):
    """Figs. 7-9 of the paper from the trace runs."""
    by_cache = {}
    for r in rows:
        if r["setting"] == "baseline":
            continue
        t, c = r["setting"].split("-")
        by_cache.setdefault(c, []).append((int(t[1:]), r["saved_fraction"] * 100))
    svg_chart(os.path.join(work, "volume-dedup-vs-threshold.svg"), "Blocks saved vs threshold (Fig. 7)",
              "threshold (blocks)", "saved %", [(c.replace("cache", "cache ") + " %", sorted(v))
                                                 for c, v in sorted(by_cache.items(), reverse=True)])
    keep = [r for r in rows if r["setting"] == "baseline" or r["setting"].endswith("cache100")]
    svg_chart(os.path.join(work, "volume-fragmentation-cdf.svg"),
              "Reads by physical runs touched (Fig. 8)", "runs per read", "cumulative %",
              [(r["setting"], [(x, y * 100) for x, y in r["fragmentation_cdf"]]) for r in keep])
    svg_chart(os.path.join(work, "volume-read-latency-cdf.svg"), "Client read response time (Fig. 9)",
              "µs (log)", "cumulative %", [(r["setting"], [(us, p) for p, us in r["client_read_cdf_us"]])
                                          for r in keep], logx=True)


def disk_reads(path):
    """(read I/Os completed, sectors read) of the block device holding
    `path` (/sys/dev/block/M:m/stat), or None where there is none."""
    st = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(st)}:{os.minor(st)}/stat") as f:
            v = f.read().split()
        return int(v[0]), int(v[2])
    except (OSError, IndexError, ValueError):
        return None


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def median(xs):
    """The middle of `xs` (the upper one of two)."""
    xs = sorted(xs)
    return xs[len(xs) // 2]


def strata(repo, *args):
    out = subprocess.run([os.path.join(BIN, "strata"), "--repo", repo, *args, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def timed(reqs, op):
    """Runs op(first, data) for every request: latencies and total seconds."""
    lat = []
    t0 = time.perf_counter()
    for first, data in reqs:
        t = time.perf_counter()
        op(first, data)
        lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - t0


def one_setting(work, label, reqs, vol_blocks, create_args):
    repo = os.path.join(work, "repo-" + label)
    subprocess.run(["rm", "-rf", repo], check=True)
    strata(repo, "init")
    strata(repo, "volume", "create", "v", "--size", str(vol_blocks * BLOCK), *create_args)
    sock = os.path.join(work, label + ".sock")
    s, h = serve_and_connect(repo, sock)
    wlat, write_s = timed(reqs, lambda first, data: h.pwrite(data, first * BLOCK))
    h.flush()
    h.shutdown()
    s.stop()
    st_w = strata(repo, "volume", "stats", "v")
    drop_caches()
    s, h = serve_and_connect(repo, sock)
    io0 = disk_reads(work)
    rlat, read_s = timed(reqs, lambda first, data: h.pread(len(data), first * BLOCK))
    io1 = disk_reads(work)
    h.shutdown()
    s.stop()
    # The server's figures of the replayed reads only (not of the check).
    st_r = strata(repo, "volume", "stats", "v")
    # The same reads again, cold, in a random order (seeded: the same for
    # every setting): the written order favours a layout that keeps each
    # block where it was first written (in place), a random one neither.
    import random
    shuffled = list(reqs)
    random.Random(11).shuffle(shuffled)
    drop_caches()
    s, h = serve_and_connect(repo, sock)
    rlat_rand, _ = timed(shuffled, lambda first, data: h.pread(len(data), first * BLOCK))
    h.shutdown()
    s.stop()
    # The whole volume read from start to end, cold, 1 MiB at a time (a
    # copy or a scan: what readahead in the volume's order is for).
    drop_caches()
    s, h = serve_and_connect(repo, sock)
    size = vol_blocks * BLOCK
    t = time.perf_counter()
    for off in range(0, size, 1 << 20):
        h.pread(min(1 << 20, size - off), off)
    scan_s = time.perf_counter() - t
    # The last write of each block wins: check the final image.
    final = {}
    for first, data in reqs:
        for i in range(len(data) // BLOCK):
            final[first + i] = data[i * BLOCK:(i + 1) * BLOCK]
    bad = sum(1 for b, d in final.items() if h.pread(BLOCK, b * BLOCK) != d)
    h.shutdown()
    s.stop()
    subprocess.run(["rm", "-rf", repo], check=True)
    us = lambda x: None if x is None else round(x * 1e6, 1)
    return {
        "setting": label,
        "dedup_ratio": st_w["dedup_ratio"],
        "saved_fraction": 1 - st_w["physical_blocks_written"] / max(1, st_w["logical_blocks_written"]),
        "deduplicated_blocks": st_w["deduplicated_blocks"],
        "duplicates_below_threshold": st_w["duplicates_below_threshold"],
        "sequence_lengths": st_w["sequence_lengths"],
        "logical_blocks_written": st_w["logical_blocks_written"],
        "cache_capacity_blocks": st_w["cache_capacity_blocks"],
        "cache_hit_rate": st_w["cache_hit_rate"],
        "write_mb_s": sum(len(d) for _, d in reqs) / write_s / 1e6,
        "read_mb_s": sum(len(d) for _, d in reqs) / read_s / 1e6,
        "scan_mb_s": size / scan_s / 1e6,
        "client_write_p50_us": us(pct(wlat, 50)), "client_write_p99_us": us(pct(wlat, 99)),
        "client_read_p50_us": us(pct(rlat, 50)), "client_read_p99_us": us(pct(rlat, 99)),
        "client_random_read_p50_us": us(pct(rlat_rand, 50)),
        "client_random_read_p99_us": us(pct(rlat_rand, 99)),
        "server_write_p50_us": st_w["write_p50_us"], "server_write_p99_us": st_w["write_p99_us"],
        "server_read_p50_us": st_r["read_p50_us"], "server_read_p99_us": st_r["read_p99_us"],
        "fragmentation_cdf": st_r["fragmentation_cdf"],
        "client_read_cdf_us": [[p, us(pct(rlat, p))] for p in CDF_POINTS],
        "client_write_cdf_us": [[p, us(pct(wlat, p))] for p in CDF_POINTS],
        "mismatched_blocks": bad,
        # What the replayed reads took from the disk (the page cache was
        # dropped before): read I/Os the device completed, and MB.
        "disk_read_ios": None if io0 is None else io1[0] - io0[0],
        "disk_read_mb": None if io0 is None else (io1[1] - io0[1]) * 512 / 1e6,
    }


def trace_mode(a):
    trace = os.path.join(a.work, "trace.prim")
    if not os.path.exists(trace):
        subprocess.run([os.path.join(BIN, "strata-bench"), "gen", "primary", "--size", a.size,
                        "--volume-size", a.volume_size or a.size, "--seed", "2", "--out", trace],
                       check=True)
        # Its 268 MB written back now, not during the first setting's writes.
        drop_caches()
    vol_blocks, n, reqs = read_trace(trace)
    print(f"trace: {n} block writes in {len(reqs)} requests, volume {vol_blocks} blocks", file=sys.stderr)
    settings = [("baseline", ["--no-dedup"])]
    for c in [float(x) for x in a.caches.split(",")]:
        cache = max(1, int(c * n)) * NODE_BYTES
        for t in [int(x) for x in a.thresholds.split(",")]:
            settings.append((f"t{t}-cache{int(c * 100)}", ["--threshold", str(t), "--cache", str(cache)]))
    # Each run goes through every setting in turn (the machine's noise
    # then falls on all of them alike); medians per setting.
    runs = []
    for k in range(a.trace_runs):
        rows = []
        for label, args in settings:
            print(f"run {k + 1}/{a.trace_runs}: setting {label}", file=sys.stderr)
            rows.append(one_setting(a.work, label, reqs, vol_blocks, args))
        runs.append(rows)
    return runs


def median_rows(runs):
    """Per setting, the median over runs of every figure (of lists of
    [x, y] points, the median y per x)."""
    out = []
    for i, first in enumerate(runs[0]):
        rs = [run[i] for run in runs]
        row = {}
        for key, v in first.items():
            vals = [r[key] for r in rs]
            if isinstance(v, bool) or isinstance(v, str) or v is None or any(x is None for x in vals):
                row[key] = v
            elif key == "mismatched_blocks":
                # (Not a figure to take the middle of: any run's count.)
                row[key] = max(vals)
            elif isinstance(v, (int, float)):
                row[key] = median(vals)
            elif isinstance(v, list) and all(len(r[key]) == len(v) for r in rs) and all(
                    isinstance(p, list) and len(p) == 2 for p in v):
                row[key] = [[p[0], median(r[key][j][1] for r in rs)] for j, p in enumerate(v)]
            else:
                row[key] = v
        row["runs"] = len(rs)
        out.append(row)
    return out


GOAL_KEYS = ["client_write_p50_us", "client_write_p99_us", "client_read_p50_us", "client_read_p99_us",
             "client_random_read_p50_us", "client_random_read_p99_us"]


def goal_table(runs, med):
    """Issue 11's latency goal: each setting's medians against the
    baseline's (dedup off), with the range of the runs."""
    base = med[0]
    print()
    print("| setting vs baseline (medians; range over runs) | " +
          " | ".join(k.replace("client_", "").replace("_us", "") for k in GOAL_KEYS) + " |")
    print("|---|" + "---|" * len(GOAL_KEYS))
    for i, row in enumerate(med[1:], start=1):
        cells = []
        for k in GOAL_KEYS:
            ratio = row[k] / base[k] - 1
            lo, hi = min(r[i][k] for r in runs), max(r[i][k] for r in runs)
            blo, bhi = min(r[0][k] for r in runs), max(r[0][k] for r in runs)
            cells.append(f"{ratio * 100:+.1f} % ({blo:.0f}-{bhi:.0f} vs {lo:.0f}-{hi:.0f})")
        print(f"| {row['setting']} | " + " | ".join(cells) + " |")


ORACLE = {"seq": 8, "rand": 1}


def mixed_schedule(reqs, vol_blocks, a):
    """Phase of each write request, and the reads issued after request i:
    {i: [(first block, blocks), ...]} (seeded: the same for every setting)."""
    import random
    kinds = a.phases.split(",")
    for k in kinds:
        if k not in ORACLE:
            raise SystemExit(f"--phases: {k!r} is not seq or rand")
    n = len(reqs)
    phase = [min(len(kinds) - 1, i * len(kinds) // n) for i in range(n)]
    rng = random.Random(7)
    reads = {}
    for i in range(a.every - 1, n, a.every):
        recent = reqs[i + 1 - a.every:i + 1]
        if kinds[phase[i]] == "seq":
            rs = []
            for _ in range(a.reads):
                first = rng.choice(recent)[0]
                rs.append((first, min(a.seq_blocks, vol_blocks - first)))
        else:
            blocks = [f + j for f, d in recent for j in range(len(d) // BLOCK)]
            rs = [(rng.choice(blocks), 1) for _ in range(a.rand_reads)]
        reads[i] = rs
    return kinds, phase, reads


def expected(img, first, nblocks):
    zero = bytes(BLOCK)
    return b"".join(img.get(b, zero) for b in range(first, first + nblocks))


def set_threshold(repo, t):
    """Rewrites the threshold of a stopped volume (for the oracle row)."""
    import glob
    paths = [p for p in glob.glob(os.path.join(repo, "**", "volume.json"), recursive=True)
             if json.load(open(p)).get("format") is not None]
    assert len(paths) == 1, paths
    cfg = json.load(open(paths[0]))
    cfg["threshold"] = {"fixed": t}
    with open(paths[0], "w") as f:
        json.dump(cfg, f, indent=2)


def mixed_setting(work, setting, reqs, vol_blocks, n_writes, sched, poll_every):
    kinds, phase, reads = sched
    label = "dedup off" if setting == "off" else (
        "oracle " + "→".join(str(ORACLE[k]) for k in kinds) if setting == "oracle"
        else f"threshold {setting}")
    repo = os.path.join(work, "repo-mixed")
    subprocess.run(["rm", "-rf", repo], check=True)
    strata(repo, "init")
    args = ["--no-dedup"] if setting == "off" else [
        "--threshold", str(ORACLE[kinds[0]]) if setting == "oracle" else setting,
        "--cache", str(n_writes * NODE_BYTES)]
    strata(repo, "volume", "create", "v", "--size", str(vol_blocks * BLOCK), *args)
    sock = os.path.join(work, "mixed.sock")
    s, h = serve_and_connect(repo, sock)
    img = {}
    wlat, live_rlat = [], []
    bad_live = 0
    # (phase, serve, writes counted in live.json, threshold_used): one per
    # batch seen (live.json is saved after every destage).
    batches = []
    serve = [0]

    def poll(p):
        st = strata(repo, "volume", "stats", "v")
        if st["threshold_used"] and (not batches or batches[-1][1:3] != [serve[0], st["writes"]]):
            batches.append([p, serve[0], st["writes"], st["threshold_used"]])

    t_start = time.perf_counter()
    for i, (first, data) in enumerate(reqs):
        if setting == "oracle" and i > 0 and phase[i] != phase[i - 1]:
            h.flush()
            h.shutdown()
            s.stop()
            poll(phase[i - 1])
            set_threshold(repo, ORACLE[kinds[phase[i]]])
            serve[0] += 1
            s, h = serve_and_connect(repo, sock)
        t = time.perf_counter()
        h.pwrite(data, first * BLOCK)
        wlat.append(time.perf_counter() - t)
        for j in range(len(data) // BLOCK):
            img[first + j] = data[j * BLOCK:(j + 1) * BLOCK]
        for rf, rn in reads.get(i, ()):
            t = time.perf_counter()
            got = h.pread(rn * BLOCK, rf * BLOCK)
            live_rlat.append(time.perf_counter() - t)
            bad_live += got != expected(img, rf, rn)
        if setting != "off" and i % poll_every == poll_every - 1:
            poll(phase[i])
    h.flush()
    h.shutdown()
    s.stop()
    run_s = time.perf_counter() - t_start
    st_w = strata(repo, "volume", "stats", "v")
    if setting != "off" and (not batches or batches[-1][1:3] != [serve[0], st_w["writes"]]):
        batches.append([phase[-1], serve[0], st_w["writes"], st_w["threshold_used"]])
    # Each phase's reads again, cold, one serve per phase.
    per_phase = []
    bad_replay = 0
    for p, kind in enumerate(kinds):
        drop_caches()
        s, h = serve_and_connect(repo, sock)
        lat = []
        for i in sorted(reads):
            if phase[i] != p:
                continue
            for rf, rn in reads[i]:
                t = time.perf_counter()
                got = h.pread(rn * BLOCK, rf * BLOCK)
                lat.append(time.perf_counter() - t)
                bad_replay += got != expected(img, rf, rn)
        h.shutdown()
        s.stop()
        st = strata(repo, "volume", "stats", "v")
        cdf = st["fragmentation_cdf"]
        per_phase.append({
            "phase": p, "kind": kind, "reads": len(lat),
            "reads_one_run": cdf[0][1] if cdf else None,
            "fragmentation_cdf": cdf,
            "read_p50_us": round(pct(lat, 50) * 1e6, 1), "read_p99_us": round(pct(lat, 99) * 1e6, 1),
            "thresholds_chosen": [b[3] for b in batches if b[0] == p],
        })
    # Every block of the final image.
    s, h = serve_and_connect(repo, sock)
    bad = sum(1 for b, d in img.items() if h.pread(BLOCK, b * BLOCK) != d)
    h.shutdown()
    s.stop()
    subprocess.run(["rm", "-rf", repo], check=True)
    us = lambda x: round(x * 1e6, 1)
    return {
        "setting": setting, "label": label,
        "dedup_ratio": st_w["dedup_ratio"],
        "saved_fraction": 1 - st_w["physical_blocks_written"] / max(1, st_w["logical_blocks_written"]),
        "logical_blocks_written": st_w["logical_blocks_written"],
        "physical_blocks_written": st_w["physical_blocks_written"],
        "deduplicated_blocks": st_w["deduplicated_blocks"],
        "duplicates_below_threshold": st_w["duplicates_below_threshold"],
        "threshold_used_at_close": st_w["threshold_used"],
        "batches": batches,
        "run_s": run_s,
        "client_write_p50_us": us(pct(wlat, 50)), "client_write_p99_us": us(pct(wlat, 99)),
        "client_live_read_p50_us": us(pct(live_rlat, 50)), "client_live_read_p99_us": us(pct(live_rlat, 99)),
        "phases": per_phase,
        "mismatched_live_reads": bad_live, "mismatched_replay_reads": bad_replay,
        "mismatched_blocks": bad,
    }


def mixed_mode(a):
    vsize = a.volume_size or str(4 * size_arg(a.size))
    trace = os.path.join(a.work, f"trace-mixed-{a.size}-{vsize}.prim")
    if not os.path.exists(trace):
        subprocess.run([os.path.join(BIN, "strata-bench"), "gen", "primary", "--size", a.size,
                        "--volume-size", vsize, "--seed", "2", "--out", trace], check=True)
    vol_blocks, n, reqs = read_trace(trace)
    sched = mixed_schedule(reqs, vol_blocks, a)
    kinds, phase, reads = sched
    print(f"trace: {n} block writes in {len(reqs)} requests, volume {vol_blocks} blocks; "
          f"phases {','.join(kinds)}; {sum(len(r) for r in reads.values())} reads", file=sys.stderr)
    rows = []
    for setting in a.settings.split(","):
        print("setting", setting, file=sys.stderr)
        rows.append(mixed_setting(a.work, setting, reqs, vol_blocks, n, sched, a.poll))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "phases"}), file=sys.stderr)
    return kinds, rows


def mixed_table(kinds, rows):
    t1 = next((r["saved_fraction"] for r in rows if r["setting"] == "1"), None)
    ph = lambda k, p: f"{k} (phase {p + 1})"
    head = ["setting", "dedup ratio", "saved", "% of t1's savings"]
    head += [f"{ph(k, p)}: reads on 1 run" for p, k in enumerate(kinds) if k == "seq"]
    head += ["write p50/p99 µs"]
    head += [f"{ph(k, p)}: read p50/p99 µs" for p, k in enumerate(kinds)]
    head += ["threshold used, by batch", "mismatches"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        ps = r["phases"]
        cells = [r["label"], f"{r['dedup_ratio']:.3f}", f"{r['saved_fraction'] * 100:.1f} %",
                 "–" if not t1 else f"{r['saved_fraction'] / t1 * 100:.0f} %"]
        cells += ["–" if q["reads_one_run"] is None else f"{q['reads_one_run'] * 100:.1f} %"
                  for q in ps if q["kind"] == "seq"]
        cells += [f"{r['client_write_p50_us']}/{r['client_write_p99_us']}"]
        cells += [f"{q['read_p50_us']}/{q['read_p99_us']}" for q in ps]
        cells += ["–" if r["setting"] == "off" else
                  "; ".join(f"{q['kind']}: " + (" ".join(map(str, q["thresholds_chosen"])) or "–") for q in ps)]
        cells += [str(r["mismatched_live_reads"] + r["mismatched_replay_reads"] + r["mismatched_blocks"])]
        print("| " + " | ".join(cells) + " |")


def wait_listening(sock):
    import socket
    for _ in range(200):
        try:
            c = socket.socket(socket.AF_UNIX)
            c.connect(sock)
            c.close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nothing listens on " + sock)


def fio(uri, rw, bs, size, runtime, work):
    args = ["fio", "--name=j", "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw, "--bs=" + bs,
            "--size=" + size, "--iodepth=8", "--output-format=json", "--verify_state_save=0"]
    if runtime:
        args += ["--runtime=" + str(runtime), "--time_based"]
    out = subprocess.run(args, check=True, capture_output=True, text=True, cwd=work).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["write"] if "write" in rw else j["read"]
    clat = side["clat_ns"].get("percentile", {})
    return {"iops": side["iops"], "mb_s": side["bw_bytes"] / 1e6,
            "p50_us": clat.get("50.000000", 0) / 1e3, "p99_us": clat.get("99.000000", 0) / 1e3}


def fio_mode(a):
    size = a.fio_size
    nbytes = size_arg(size)
    jobs = [("seq-write-1M", "write", "1M", 0), ("rand-write-4k", "randwrite", "4k", a.runtime),
            ("rand-read-4k", "randread", "4k", a.runtime), ("seq-read-1M", "read", "1M", 0)]
    rows = []
    for rep in range(a.repeat):
        for system in ["nbdkit-file", "strata-nodedup"]:
            if system == "nbdkit-file":
                img = os.path.join(a.work, "plain.img")
                with open(img, "wb") as f:
                    f.truncate(nbytes)
                sock = os.path.join(a.work, "nbdkit.sock")
                if os.path.exists(sock):
                    os.unlink(sock)
                p = subprocess.Popen(["nbdkit", "-f", "-U", sock, "file", img])
                wait_listening(sock)
                uri = "nbd+unix:///?socket=" + sock
                stop = lambda: (p.terminate(), p.wait())
            else:
                repo = os.path.join(a.work, "repo-fio")
                subprocess.run(["rm", "-rf", repo], check=True)
                strata(repo, "init")
                strata(repo, "volume", "create", "v", "--size", str(nbytes), "--no-dedup")
                sock = os.path.join(a.work, "strata.sock")
                s = Served(repo, "v", sock)
                uri = "nbd+unix:///v?socket=" + sock
                stop = s.stop
            for name, rw, bs, rt in jobs:
                if "read" in rw:
                    drop_caches()
                r = fio(uri, rw, bs, size, rt, a.work)
                r.update(system=system, job=name, rep=rep)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
            stop()
            subprocess.run(["rm", "-rf", os.path.join(a.work, "repo-fio"),
                            os.path.join(a.work, "plain.img")], check=True)
    return rows


def snapshots_mode(a):
    """A volume of --snapshot-size random data, snapshotted once; then per
    round 3 × 64 KiB written into 3 segments, a snapshot that reads only
    what changed, and (its change set removed: unknown, as after a crash)
    a snapshot of the same image that reads everything. Page cache dropped
    before each snapshot."""
    repo = os.path.join(a.work, "repo-snap")
    sock = os.path.join(a.work, "snap.sock")
    subprocess.run(["rm", "-rf", repo], check=True)
    size = size_arg(a.snapshot_size)
    strata(repo, "init")
    strata(repo, "volume", "create", "v", "--size", str(size))
    s, h = serve_and_connect(repo, sock)
    written = size_arg(a.snapshot_written) if a.snapshot_written else size
    for off in range(0, min(written, size), 1 << 20):
        h.pwrite(os.urandom(min(1 << 20, written - off, size - off)), off)
    h.flush()
    h.shutdown()
    s.stop()

    def snap():
        drop_caches()
        rss = os.path.join(a.work, "snap.rss")
        t = time.perf_counter()
        out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss, os.path.join(BIN, "strata"),
                              "--repo", repo, "volume", "snapshot", "v", "--json"],
                             check=True, capture_output=True, text=True).stdout
        secs = time.perf_counter() - t
        r = json.loads(out)
        return {"seconds": secs, "read_bytes": r["read_bytes"],
                "new_raw_bytes": r["new_raw_bytes"],
                "peak_rss_mb": int(open(rss).read().split()[-1]) / 1024}

    rows = [dict(kind="first", **snap())]
    seg = 2 << 20
    nseg = size // seg
    for rnd in range(a.repeat):
        s, h = serve_and_connect(repo, sock)
        for k in (1, nseg // 3, 2 * nseg // 3):
            h.pwrite(os.urandom(65536), min(k + rnd, nseg - 1) * seg + 8192)
        h.flush()
        h.shutdown()
        s.stop()
        rows.append(dict(kind="changed only", round=rnd, **snap()))
        os.remove(os.path.join(repo, "volumes", "v", "changes.json"))
        rows.append(dict(kind="everything", round=rnd, **snap()))
    subprocess.run(["rm", "-rf", repo], check=True)
    return rows


def random_image(path, size):
    """`size` random bytes in `path`."""
    with open(path, "wb") as f:
        for off in range(0, size, 1 << 20):
            f.write(os.urandom(min(1 << 20, size - off)))


def copy_in_and_out(img, out, serve):
    """nbdcopy `img` into a volume `serve()` serves ((server, url)), then
    out of it into `out` (page cache dropped, served again): seconds of
    each; a copy that reads back differently stops the benchmark."""
    import filecmp
    took = []
    for src, dst in ((img, None), (None, out)):
        s, url = serve()
        t = time.perf_counter()
        subprocess.run(["nbdcopy", src or url, dst or url], check=True)
        took.append(time.perf_counter() - t)
        s.stop()
        drop_caches()
    if not filecmp.cmp(img, out, shallow=False):
        raise SystemExit("read back differs")
    return took


def copy_rounds(a, size, name, kinds, setup):
    """--repeat rounds of `copy_in_and_out` over a fresh volume (dedup on
    and off) per kind; `setup(repo, kind, dedup)` makes the volume and
    returns its `serve()`. Rows of MB/s."""
    img = os.path.join(a.work, f"{name}-img.raw")
    out = os.path.join(a.work, f"{name}-out.raw")
    random_image(img, size)
    repo = os.path.join(a.work, f"repo-{name}")
    rows = []
    for rnd in range(a.repeat):
        for kind in kinds:
            for dedup in (True, False):
                subprocess.run(["rm", "-rf", repo], check=True)
                serve = setup(repo, kind, dedup)
                w, r = copy_in_and_out(img, out, serve)
                rows.append({"round": rnd, name: kind, "dedup": dedup,
                             "write_mb_s": size / w / 1e6, "read_mb_s": size / r / 1e6,
                             "same": True})
    for p in (img, out):
        os.remove(p)
    subprocess.run(["rm", "-rf", repo], check=True)
    return rows


def ratio_table(rows, name, label):
    """Medians of plain against `label` (rows' `name` False / True)."""
    print(f"| volume | write MB/s plain | {label} | ratio | read MB/s plain | {label} | ratio |")
    print("|---|---|---|---|---|---|---|")
    for dedup in (True, False):
        def med(k, key):
            return median(r[key] for r in rows if r[name] == k and r["dedup"] == dedup)
        w0, w1, r0, r1 = med(False, "write_mb_s"), med(True, "write_mb_s"), med(False, "read_mb_s"), med(True, "read_mb_s")
        print(f"| dedup {'on' if dedup else 'off'} | {w0:.0f} | {w1:.0f} | {w1 / w0:.2f} | "
              f"{r0:.0f} | {r1:.0f} | {r1 / r0:.2f} |")


def encryption_mode(a):
    """nbdcopy of --enc-size random bytes in and out of a fresh volume,
    plain and encrypted repositories, dedup on and off, --repeat rounds."""
    os.environ["STRATA_PASSWORD"] = "bench"
    sock = os.path.join(a.work, "enc.sock")

    def setup(repo, enc, dedup):
        strata(repo, "init", *(["--encrypt"] if enc else []))
        strata(repo, "volume", "create", "v", "--size", str(size_arg(a.enc_size)),
               *([] if dedup else ["--no-dedup"]))
        return lambda: (Served(repo, "v", sock), f"nbd+unix:///v?socket={sock}")
    return copy_rounds(a, size_arg(a.enc_size), "encrypted", (False, True), setup)


def tls_certificates(work):
    """A CA, and a server certificate for 127.0.0.1 it signed (openssl):
    the server's directory and the client's."""
    pki, srv, cli = (os.path.join(work, d) for d in ("pki", "tls-srv", "tls-cli"))
    for d in (pki, srv, cli):
        os.makedirs(d, exist_ok=True)
    ossl = lambda *args: subprocess.run(["openssl", *args], cwd=pki, check=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    ossl("req", "-x509", *key, "-days", "2", "-subj", "/CN=bench-ca", "-keyout", "ca-key.pem",
         "-out", "ca-cert.pem")
    ossl("req", *key, "-subj", "/CN=bench", "-keyout", "server-key.pem", "-out", "server.csr")
    with open(os.path.join(pki, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem",
         "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server-cert.pem")
    for name, d in (("server-cert.pem", srv), ("server-key.pem", srv), ("ca-cert.pem", cli)):
        shutil.copy(os.path.join(pki, name), os.path.join(d, name))
    return srv, cli


def tls_mode(a):
    """nbdcopy of --tls-size random bytes in and out of a fresh volume
    over TCP on loopback, plain and with TLS (`--tls-certificates`), dedup
    on and off, --repeat rounds (page cache dropped before reads)."""
    srv, cli = tls_certificates(a.work)

    def setup(repo, tls, dedup):
        strata(repo, "init")
        strata(repo, "volume", "create", "v", "--size", str(size_arg(a.tls_size)),
               *([] if dedup else ["--no-dedup"]))
        extra = ["--tls-certificates", srv] if tls else []

        def serve():
            s = Served(repo, "v", None, listen="127.0.0.1:0", extra=extra)
            return s, s.doc["url"] + (f"?tls-certificates={cli}" if tls else "")
        return serve
    return copy_rounds(a, size_arg(a.tls_size), "tls", (False, True), setup)


def serve_at_mode(a):
    """A version of a volume read back three ways, page cache dropped before
    each: `volume serve --at` (read-only NBD straight from the repository)
    copied out by nbdcopy, `strata restore`, and `strata dump`; seconds,
    and the server's peak RSS."""
    import filecmp
    size = size_arg(a.at_size)
    img = os.path.join(a.work, "at-img.raw")
    with open(img, "wb") as f:
        for off in range(0, size, 1 << 20):
            # Half random, half a repeat of the first MiB (dedup finds it).
            f.write(os.urandom(1 << 20) if (off >> 20) % 2 == 0 else b"\x5a" * (1 << 20))
    repo = os.path.join(a.work, "repo-at")
    subprocess.run(["rm", "-rf", repo], check=True)
    strata(repo, "init")
    strata(repo, "volume", "create", "v", "--from", img)
    strata(repo, "volume", "snapshot", "v")
    out = os.path.join(a.work, "at-out.raw")
    rows = []
    for rnd in range(a.repeat):
        drop_caches()
        rss = os.path.join(a.work, "at.rss")
        t = time.perf_counter()
        p = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss, os.path.join(BIN, "strata"),
                              "--repo", repo, "volume", "serve", "v", "--at", "latest",
                              "--listen", "127.0.0.1:0", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        doc = ""
        while True:
            line = p.stdout.readline()
            if not line:
                raise SystemExit("serve --at ended: " + p.stderr.read())
            doc += line
            try:
                url = json.loads(doc)["url"]
                break
            except ValueError:
                continue
        ready = time.perf_counter() - t
        subprocess.run(["nbdcopy", url, out], check=True)
        served = time.perf_counter() - t
        # (Through /usr/bin/time: signal the server itself.)
        subprocess.run(["pkill", "-TERM", "-P", str(p.pid)], check=False)
        p.wait(timeout=60)
        if not filecmp.cmp(img, out, shallow=False):
            raise SystemExit("serve --at read back something else")
        peak = int(open(rss).read().split()[-1]) / 1024
        os.remove(out)
        drop_caches()
        target = os.path.join(a.work, "at-restore")
        subprocess.run(["rm", "-rf", target], check=True)
        t = time.perf_counter()
        strata(repo, "restore", "volume:v@latest", "--target", target)
        restored = time.perf_counter() - t
        subprocess.run(["rm", "-rf", target], check=True)
        drop_caches()
        t = time.perf_counter()
        with open(out, "wb") as f:
            subprocess.run([os.path.join(BIN, "strata"), "--repo", repo, "dump", "volume:v@latest",
                            "v.img"], stdout=f, check=True)
        dumped = time.perf_counter() - t
        os.remove(out)
        rows.append({"round": rnd, "ready_s": ready, "serve_at_copy_s": served,
                     "restore_s": restored, "dump_s": dumped, "serve_at_peak_rss_mb": peak})
    os.remove(img)
    subprocess.run(["rm", "-rf", repo], check=True)
    return rows


def fs_image_mode(a):
    """A real file system changed between two snapshots, against restic
    and borg backing up the same image file (see the module docstring)."""
    img1, img2 = os.path.join(a.work, "fs1.img"), os.path.join(a.work, "fs2.img")
    size = size_arg(a.image_size)
    for p in (img1, img2):
        if os.path.exists(p):
            os.remove(p)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", a.tree, img1, str(size // 1024) + "k"], check=True)
    subprocess.run(["cp", "--sparse=always", img1, img2], check=True)
    # A week's work: files added, one directory removed, files appended to.
    src = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.changes) for f in fs
                 if os.path.isfile(os.path.join(d, f)) and not os.path.islink(os.path.join(d, f)))
    cmds = ["mkdir /week2"] + [f"write {p} /week2/f{i}" for i, p in enumerate(src[:a.change_files])]
    files = sorted(e for e in os.listdir(a.tree) if os.path.isfile(os.path.join(a.tree, e)))
    if files:
        cmds.append(f"rm /{files[0]}")
    cf = os.path.join(a.work, "debugfs.cmds")
    with open(cf, "w") as f:
        f.write("\n".join(cmds) + "\n")
    subprocess.run(["debugfs", "-w", "-f", cf, img2], check=True, capture_output=True)
    subprocess.run(["e2fsck", "-fn", img2], check=True, capture_output=True)
    # The volume: image 1 written (its non-zero blocks), then only the
    # blocks that differ in image 2 — what a VM writes.
    repo = os.path.join(a.work, "repo-fs")
    sock = os.path.join(a.work, "fs.sock")
    subprocess.run(["rm", "-rf", repo], check=True)
    strata(repo, "init")
    strata(repo, "volume", "create", "v", "--size", str(size))
    zero = bytes(BLOCK)
    changed_blocks = 0
    with open(img1, "rb") as f1, open(img2, "rb") as f2:
        for phase in (1, 2):
            s, h = serve_and_connect(repo, sock)
            f1.seek(0)
            f2.seek(0)
            for off in range(0, size, 1 << 20):
                a1, a2 = f1.read(1 << 20), f2.read(1 << 20)
                for i in range(0, len(a1), BLOCK):
                    b1, b2 = a1[i:i + BLOCK], a2[i:i + BLOCK]
                    if phase == 1 and b1 != zero:
                        h.pwrite(b1, off + i)
                    elif phase == 2 and b1 != b2:
                        h.pwrite(b2, off + i)
                        changed_blocks += 1
            h.flush()
            h.shutdown()
            s.stop()
            if phase == 1:
                drop_caches()
                t = time.perf_counter()
                r1 = strata(repo, "volume", "snapshot", "v")
                first_s = time.perf_counter() - t
    drop_caches()
    t = time.perf_counter()
    r = strata(repo, "volume", "snapshot", "v")
    # The repository's own bytes (its volumes apart): with linked
    # snapshots, what the volume holds is not stored a second time.
    repo_bytes = dir_bytes(repo) - dir_bytes(os.path.join(repo, "volumes"))
    rows = [{"tool": "strata volume snapshot", "first_s": first_s,
             "second_s": time.perf_counter() - t, "read_bytes": r["read_bytes"],
             "added_bytes": r["new_stored_bytes"], "new_chunk_bytes": r["new_raw_bytes"],
             "linked_bytes": r1.get("linked_stored_bytes", 0) + r.get("linked_stored_bytes", 0),
             "repo_bytes": repo_bytes,
             "volume_bytes": dir_bytes(os.path.join(repo, "volumes"))}]
    env = dict(os.environ, RESTIC_PASSWORD="bench", BORG_PASSPHRASE="",
               BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes")
    target = os.path.join(a.work, "vm.img")

    def peer(name, init, backup, du):
        subprocess.run(["rm", "-rf", du], check=True)
        subprocess.run(init, check=True, capture_output=True, env=env)
        times = []
        for img in (img1, img2):
            subprocess.run(["cp", "--sparse=always", img, target], check=True)
            before = dir_bytes(du)
            drop_caches()
            t = time.perf_counter()
            subprocess.run(backup, check=True, capture_output=True, env=env)
            times.append((time.perf_counter() - t, dir_bytes(du) - before))
        rows.append({"tool": name, "first_s": times[0][0], "second_s": times[1][0],
                     "read_bytes": None, "added_bytes": times[1][1], "repo_bytes": dir_bytes(du)})

    rr = os.path.join(a.work, "restic-fs")
    peer("restic 0.14 backup", ["restic", "-r", rr, "init"],
         ["restic", "-r", rr, "backup", target], rr)
    br = os.path.join(a.work, "borg-fs")
    peer("borg 1.2 create", ["borg", "init", "-e", "none", br],
         ["borg", "create", br + "::{now:%s.%f}", target], br)
    for p in (img1, img2, target):
        os.remove(p)
    subprocess.run(["rm", "-rf", repo, rr, br], check=True)
    return changed_blocks, rows


def served_link_mode(a):
    """Snapshots of a served volume, linked (in REPO/volumes, the default)
    against copied (the same build, the volume under --volumes-dir: not
    linked), beside restic backing up the same image; see the module
    docstring. Rounds alternate the two; a row per variant per round."""
    img = os.path.join(a.work, "served.img")
    size = size_arg(a.image_size)
    if os.path.exists(img):
        os.remove(img)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", a.tree, img, str(size // 1024) + "k"], check=True)
    change_at, change = 300 << 20, 16 << 20
    rows = []

    def volume_run(variant):
        repo = os.path.join(a.work, "repo-" + variant)
        vols = os.path.join(a.work, "vols-" + variant)
        subprocess.run(["rm", "-rf", repo, vols], check=True)
        extra = ["--volumes-dir", vols] if variant == "copied" else []
        strata(repo, "init")
        strata(repo, "volume", *extra, "create", "v", "--from", img)
        sock = os.path.join(a.work, variant + ".sock")
        srv = Served(repo, "v", sock, extra=extra)
        row = {"variant": variant}
        for k in ("first", "second"):
            if k == "second":
                h = connect(sock, "v")
                h.pwrite(os.urandom(change), change_at)
                h.flush()
                h.shutdown()
            drop_caches()
            t = time.perf_counter()
            j = strata(repo, "volume", *extra, "snapshot", "v")
            row[k + "_s"] = time.perf_counter() - t
            assert j.get("linking_stopped") is None, j
            row[k + "_linked_bytes"] = j["linked_stored_bytes"]
        srv.stop()
        row["repo_bytes"] = dir_bytes(repo) - dir_bytes(os.path.join(repo, "volumes"))
        row["volume_bytes"] = dir_bytes(os.path.join(repo, "volumes") if not extra else vols)
        subprocess.run(["rm", "-rf", repo, vols], check=True)
        return row

    def restic_run():
        rr = os.path.join(a.work, "restic-served")
        subprocess.run(["rm", "-rf", rr], check=True)
        env = dict(os.environ, RESTIC_PASSWORD="bench")
        subprocess.run(["restic", "-r", rr, "init"], env=env, check=True, capture_output=True)
        row = {"variant": "restic 0.14"}
        for k in ("first", "second"):
            if k == "second":
                with open(img, "r+b") as f:
                    f.seek(change_at)
                    f.write(os.urandom(change))
            drop_caches()
            t = time.perf_counter()
            subprocess.run(["restic", "-r", rr, "backup", img], env=env, check=True, capture_output=True)
            row[k + "_s"] = time.perf_counter() - t
        row["repo_bytes"] = dir_bytes(rr)
        subprocess.run(["rm", "-rf", rr], check=True)
        return row

    for r in range(a.repeat):
        for v in (["linked", "copied"] if r % 2 == 0 else ["copied", "linked"]):
            rows.append(volume_run(v))
        if shutil.which("restic"):
            rows.append(restic_run())
            # The image as it was, for the next round.
            subprocess.run(["mkfs.ext4", "-q", "-F", "-d", a.tree, img, str(size // 1024) + "k"],
                           check=True)
        print(f"round {r + 1}/{a.repeat}", file=sys.stderr)
    os.remove(img)
    return rows


def dir_bytes(path):
    total = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                pass
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--size", default="256M")
    ap.add_argument("--volume-size")
    ap.add_argument("--thresholds", default="1,2,4,8")
    ap.add_argument("--caches", default="1,0.25")
    ap.add_argument("--trace-runs", type=int, default=1)
    ap.add_argument("--fio", action="store_true")
    ap.add_argument("--fio-size", default="512M")
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--phases", default="seq,rand")
    ap.add_argument("--settings", default="off,1,2,4,8,auto,oracle")
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--reads", type=int, default=4)
    ap.add_argument("--rand-reads", type=int, default=4)
    ap.add_argument("--seq-blocks", type=int, default=32)
    ap.add_argument("--poll", type=int, default=64)
    ap.add_argument("--snapshots", action="store_true")
    ap.add_argument("--snapshot-size", default="1G")
    ap.add_argument("--snapshot-written", default=None)
    ap.add_argument("--fs-image", action="store_true")
    ap.add_argument("--tree", default="/usr/lib/python3")
    ap.add_argument("--changes", default="/usr/share/doc")
    ap.add_argument("--change-files", type=int, default=300)
    ap.add_argument("--image-size", default="1G")
    ap.add_argument("--served-link", action="store_true")
    ap.add_argument("--serve-at", action="store_true")
    ap.add_argument("--at-size", default="1G")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--tls-size", default="1G")
    ap.add_argument("--encryption", action="store_true")
    ap.add_argument("--enc-size", default="1G")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if a.fs_image:
        changed, rows = fs_image_mode(a)
        json.dump({"changed_blocks": changed, "rows": rows},
                  open(os.path.join(a.work, "volume-fs-image.json"), "w"), indent=1)
        print(f"image 2 differs from image 1 in {changed} blocks of 4 KiB")
        print("| tool | first backup s | second backup s | second read | second added |")
        print("|---|---|---|---|---|")
        for r in rows:
            rd = "–" if r["read_bytes"] is None else f"{r['read_bytes'] / 2**20:.0f} MiB"
            print(f"| {r['tool']} | {r['first_s']:.2f} | {r['second_s']:.2f} | {rd} | "
                  f"{r['added_bytes'] / 2**20:.1f} MiB |")
        return
    if a.served_link:
        rows = served_link_mode(a)
        json.dump(rows, open(os.path.join(a.work, "volume-served-link.json"), "w"), indent=1)
        print("| variant | first snapshot s | second s | repository MB (volumes apart) | volume MB |")
        print("|---|---|---|---|---|")
        for v in dict.fromkeys(r["variant"] for r in rows):
            rs = [r for r in rows if r["variant"] == v]
            med = lambda k: median(r[k] for r in rs) if k in rs[0] else None
            vol = med("volume_bytes")
            print(f"| {v} | {med('first_s'):.2f} | {med('second_s'):.2f} | "
                  f"{med('repo_bytes') / 1e6:.1f} | {'–' if vol is None else f'{vol / 1e6:.1f}'} |")
        return
    if a.serve_at:
        rows = serve_at_mode(a)
        json.dump(rows, open(os.path.join(a.work, "volume-serve-at.json"), "w"), indent=1)
        med = lambda k: median(r[k] for r in rows)
        print("| read a stored version back | seconds (median) |")
        print("|---|---|")
        print(f"| `volume serve --at` ready to serve | {med('ready_s'):.2f} |")
        print(f"| `volume serve --at` + nbdcopy of the whole image | {med('serve_at_copy_s'):.2f} "
              f"(peak RSS {med('serve_at_peak_rss_mb'):.0f} MB) |")
        print(f"| `strata restore` | {med('restore_s'):.2f} |")
        print(f"| `strata dump` | {med('dump_s'):.2f} |")
        return
    if a.tls:
        rows = tls_mode(a)
        json.dump(rows, open(os.path.join(a.work, "volume-tls.json"), "w"), indent=1)
        ratio_table(rows, "tls", "TLS")
        return
    if a.encryption:
        rows = encryption_mode(a)
        json.dump(rows, open(os.path.join(a.work, "volume-encryption.json"), "w"), indent=1)
        ratio_table(rows, "encrypted", "encrypted")
        return
    if a.snapshots:
        rows = snapshots_mode(a)
        json.dump(rows, open(os.path.join(a.work, "volume-snapshots.json"), "w"), indent=1)
        print("| snapshot | seconds | read | new data | peak RSS |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['kind']} | {r['seconds']:.2f} | {r['read_bytes'] / 2**20:.0f} MiB | "
                  f"{r['new_raw_bytes'] / 2**10:.0f} KiB | {r['peak_rss_mb']:.0f} MB |")
        return
    if a.mixed:
        kinds, rows = mixed_mode(a)
        json.dump(rows, open(os.path.join(a.work, "volume-mixed.json"), "w"), indent=1)
        mixed_table(kinds, rows)
        return
    if a.fio:
        rows = fio_mode(a)
        out = os.path.join(a.work, "volume-fio.json")
        json.dump(rows, open(out, "w"), indent=1)
        print("| job | nbdkit file | strata (dedup off) | ratio |")
        print("|---|---|---|---|")
        for name in ["seq-write-1M", "rand-write-4k", "rand-read-4k", "seq-read-1M"]:
            def med(system, key):
                return median(r[key] for r in rows if r["system"] == system and r["job"] == name)
            key = "mb_s" if "1M" in name else "iops"
            a_, b_ = med("nbdkit-file", key), med("strata-nodedup", key)
            print(f"| {name} ({key}) | {a_:.0f} | {b_:.0f} | {b_ / a_:.2f} |")
        return
    runs = trace_mode(a)
    rows = median_rows(runs)
    json.dump(rows, open(os.path.join(a.work, "volume-results.json"), "w"), indent=1)
    if len(runs) > 1:
        json.dump(runs, open(os.path.join(a.work, "volume-results-runs.json"), "w"), indent=1)
    charts(rows, a.work)
    print("| setting | dedup ratio | saved | cache blocks | write MB/s | read MB/s | write p50/p99 µs | read p50/p99 µs | random-order read p50/p99 µs | server read p50/p99 µs | disk reads (I/Os, MB) | reads touching 1 run | scan MB/s | mismatches |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        one = r["fragmentation_cdf"][0][1] if r["fragmentation_cdf"] else None
        disk = "–" if r["disk_read_ios"] is None else f"{r['disk_read_ios']:.0f}, {r['disk_read_mb']:.0f}"
        print(f"| {r['setting']} | {r['dedup_ratio']:.3f} | {r['saved_fraction'] * 100:.1f} % | "
              f"{r['cache_capacity_blocks']} | {r['write_mb_s']:.0f} | {r['read_mb_s']:.0f} | "
              f"{r['client_write_p50_us']}/{r['client_write_p99_us']} | "
              f"{r['client_read_p50_us']}/{r['client_read_p99_us']} | "
              f"{r['client_random_read_p50_us']}/{r['client_random_read_p99_us']} | "
              f"{r['server_read_p50_us']}/{r['server_read_p99_us']} | "
              f"{disk} | "
              f"{'–' if one is None else f'{one * 100:.1f} %'} | {r['scan_mb_s']:.0f} | "
              f"{r['mismatched_blocks']} |")
    if len(runs) > 1:
        goal_table(runs, rows)


if __name__ == "__main__":
    main()
