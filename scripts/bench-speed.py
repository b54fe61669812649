#!/usr/bin/env python3
"""Speed beside restic and borg, with a profile of where the time goes.

Two real workloads, each tool at its defaults in one interleaved run (the
order of tools rotates every step):

  tree   a release series (`scripts/release-series`: one directory per
         release): every release copied to the same path with fresh mtimes
         (so every file is read again) and backed up; then the newest
         version restored ROUNDS times per tool.
  image  a disk-image series (`scripts/vm-image-series`: DIR/week-N/disk.img):
         every image copied to the same path and backed up (read into the
         page cache before each tool's run); then `forget` of the oldest half + prune.

Strata and restic encrypt (`strata-plain`: Strata unencrypted, without
the key derivation every command of an encrypted repository pays); borg
runs `-e none`. Restores go to a fresh
ext4 file system on a loop device for every run when the harness runs as
root (ext4 makes whoever creates files first after a mass deletion pay
for it), else to fresh directories after one untimed restore.

Per run: wall seconds, user and system CPU, peak RSS (wait4). For Strata
also its own profile (`--json`): busy seconds per backup stage, restore
phases, the time opening the repository took (key derivation), read/write
calls. With `--syscalls` (needs strace) one more untimed later backup and
restore per tool run under `strace -f -c`: system calls per file.

usage: scripts/bench-speed.py WORK [--tree RELEASES_DIR] [--images IMAGES_DIR]
         [--systems strata,strata-plain,restic,borg] [--rounds 3] [--keep N] [--syscalls]
Writes WORK/speed.json and prints a Markdown summary.
"""
import json, os, re, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")


def timed(cmd, env, cwd=None):
    """Wall seconds, user, system, peak RSS MiB and stdout of one command."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) not in (0, 3):
        sys.exit(f"{' '.join(cmd)} failed: {err.decode(errors='replace')[-2000:]}")
    return {"seconds": dt, "user": ru.ru_utime, "sys": ru.ru_stime,
            "peak_rss_MiB": ru.ru_maxrss / 1024}, out


def warm(path):
    """Reads every file below `path` into the page cache: each tool reads
    its source from memory (borg drops what it read from the cache, so
    whoever came after it would read from the disk)."""
    subprocess.run(["find", path, "-type", "f", "-exec", "cat", "{}", "+"],
                   stdout=subprocess.DEVNULL, check=True)


def median(xs):
    return statistics.median(xs) if xs else None


class Tools:
    def __init__(self, work, systems):
        self.strata = os.environ.get("STRATA_BIN", os.path.join(HERE, "../target/release/strata"))
        self.env = dict(os.environ, STRATA_PASSWORD="bench", RESTIC_PASSWORD="bench", BORG_PASSPHRASE="",
                        BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
                        BORG_RELOCATED_REPO_ACCESS_IS_OK="yes")
        self.work, self.systems = work, systems

    def repo(self, s, w):
        return os.path.join(self.work, w, "repo-" + s)

    def env_for(self, s, w):
        return dict(self.env, STRATA_CACHE_DIR=self.repo(s, w) + ".cache", RESTIC_CACHE_DIR=self.repo(s, w) + ".cache",
                    BORG_CACHE_DIR=self.repo(s, w) + ".cache", BORG_BASE_DIR=self.repo(s, w) + ".base")

    def init(self, s, w):
        r = self.repo(s, w)
        shutil.rmtree(r, ignore_errors=True)
        shutil.rmtree(r + ".cache", ignore_errors=True)
        cmd = {"strata": [self.strata, "--repo", r, "-q", "init", "--encrypt"],
               "strata-plain": [self.strata, "--repo", r, "-q", "init"],
               "restic": ["restic", "-q", "-r", r, "init"],
               "borg": ["borg", "init", "-e", "none", r]}[s]
        run(cmd, self.env_for(s, w))

    def backup(self, s, w, src, tag):
        r = self.repo(s, w)
        s = "strata" if s.startswith("strata") else s
        return {"strata": [self.strata, "--repo", r, "--json", "backup", src],
                "restic": ["restic", "-q", "-r", r, "backup", src],
                "borg": ["borg", "create", "--compression", "zstd,3", f"{r}::{tag}", src]}[s]

    def restore(self, s, w, target, tag):
        r = self.repo(s, w)
        s = "strata" if s.startswith("strata") else s
        return {"strata": [self.strata, "--repo", r, "--json", "restore", "latest", "--target", target],
                "restic": ["restic", "-q", "-r", r, "restore", "latest", "--target", target],
                "borg": ["borg", "extract", f"{r}::{tag}"]}[s]

    def forget(self, s, w, keep):
        r = self.repo(s, w)
        s = "strata" if s.startswith("strata") else s
        return {"strata": [[self.strata, "--repo", r, "-q", "forget", "--keep-last", str(keep), "--prune"]],
                "restic": [["restic", "-q", "-r", r, "forget", "--keep-last", str(keep), "--prune"]],
                "borg": [["borg", "prune", "--keep-last", str(keep), r], ["borg", "compact", r]]}[s]


def strata_profile(out, kind):
    """The profile in Strata's --json output."""
    try:
        j = json.loads(out)
    except ValueError:
        return None
    p = {"process": j.get("process")}
    if kind == "backup":
        p["stages"] = {st["stage"]: round(st["busy_seconds"], 3) for st in j.get("stages") or []}
        p["read_bytes"] = j.get("read_bytes")
    else:
        p["phases"] = {f"{ph['kind']}:{ph['phase']}": round(ph["seconds"], 3) for ph in j.get("phases") or []}
    return p


class Target:
    """Where restores go: a fresh ext4 on a loop device per run (as root),
    else fresh directories."""

    def __init__(self, work, size_gib):
        self.work = work
        self.img = os.path.join(work, "restore-fs.img")
        self.mnt = os.path.join(work, "restore-mnt")
        self.loop = os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None
        self.size = size_gib
        self.n = 0

    def fresh(self):
        self.n += 1
        if self.loop:
            subprocess.run(["umount", self.mnt], stderr=subprocess.DEVNULL)
            os.makedirs(self.mnt, exist_ok=True)
            with open(self.img, "wb") as f:
                f.truncate(self.size << 30)
            subprocess.run(["mkfs.ext4", "-q", "-F", self.img], check=True)
            if subprocess.run(["mount", "-o", "loop", self.img, self.mnt]).returncode == 0:
                subprocess.run(["sync"])
                return os.path.join(self.mnt, "out")
            self.loop = False
        t = os.path.join(self.work, f"restore-{self.n}")
        return t

    def done(self, path):
        if self.loop:
            subprocess.run(["umount", self.mnt], check=True)
            os.remove(self.img)
        else:
            shutil.rmtree(path, ignore_errors=True)


def syscalls(cmd, env, cwd=None):
    """strace -f -c of one run: {syscall: calls}."""
    out = f"/tmp/strace-{os.getpid()}.txt"
    subprocess.run(["strace", "-f", "-c", "-o", out] + cmd, env=env, cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    calls = {}
    for line in open(out):
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if m and m.group(2) != "total":
            calls[m.group(2)] = int(m.group(1))
    os.remove(out)
    return calls


def tree_workload(t, releases, rounds, want_syscalls):
    w = "tree"
    versions = sorted((d for d in os.listdir(releases) if not d.startswith(".")),
                      key=lambda d: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", d)])
    src = os.path.join(t.work, w, "src")
    res = {s: {"backups": [], "restores": []} for s in t.systems}
    for s in t.systems:
        t.init(s, w)
    for i, v in enumerate(versions):
        shutil.rmtree(src, ignore_errors=True)
        # A plain copy: fresh mtimes, so every file is read again.
        subprocess.run(["cp", "-r", os.path.join(releases, v), src], check=True)
        subprocess.run(["sync"], check=True)
        k = i % len(t.systems)
        for s in t.systems[k:] + t.systems[:k]:
            warm(src)
            row, out = timed(t.backup(s, w, src, f"v{i}"), t.env_for(s, w))
            row["version"] = v
            if s.startswith("strata"):
                row["profile"] = strata_profile(out, "backup")
            res[s]["backups"].append(row)
            print(w, s, "backup", v, json.dumps(row), flush=True)
    files = sum(len(f) for _, _, f in os.walk(src))
    size = sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(src) for f in fs)
    target = Target(os.path.join(t.work, w), 2)
    first = t.systems[0]
    tr = target.fresh()  # untimed warm-up restore
    os.makedirs(tr, exist_ok=True)
    timed(t.restore(first, w, tr, f"v{len(versions) - 1}"), t.env_for(first, w), cwd=tr)
    target.done(tr)
    for r in range(rounds):
        k = r % len(t.systems)
        for s in t.systems[k:] + t.systems[:k]:
            tr = target.fresh()
            os.makedirs(tr, exist_ok=True)
            row, out = timed(t.restore(s, w, tr, f"v{len(versions) - 1}"), t.env_for(s, w), cwd=tr)
            got = os.path.join(tr, src.lstrip("/"))
            row["identical"] = subprocess.run(["diff", "-rq", src, got], stdout=subprocess.DEVNULL).returncode == 0
            if s.startswith("strata"):
                row["profile"] = strata_profile(out, "restore")
            res[s]["restores"].append(row)
            print(w, s, "restore", json.dumps(row), flush=True)
            target.done(tr)
    if want_syscalls and shutil.which("strace"):
        subprocess.run(["find", src, "-type", "f", "-exec", "touch", "{}", "+"], check=True)
        for s in t.systems:
            res[s]["backup_syscalls"] = syscalls(t.backup(s, w, src, "sc"), t.env_for(s, w))
            tr = target.fresh()
            os.makedirs(tr, exist_ok=True)
            res[s]["restore_syscalls"] = syscalls(t.restore(s, w, tr, "sc"), t.env_for(s, w), cwd=tr)
            target.done(tr)
    return {"versions": versions, "files": files, "bytes": size, "results": res}


def image_workload(t, images, keep):
    w = "image"
    def order(d):
        n = d.rsplit("-", 1)[-1]
        return (0, int(n), d) if n.isdigit() else (1, 0, d)
    versions = sorted((d for d in os.listdir(images)
                       if os.path.isfile(os.path.join(images, d, "disk.img"))), key=order)
    src = os.path.join(t.work, w, "vm")
    os.makedirs(src, exist_ok=True)
    img = os.path.join(src, "disk.img")
    res = {s: {"backups": []} for s in t.systems}
    for s in t.systems:
        t.init(s, w)
    for i, v in enumerate(versions):
        subprocess.run(["cp", "--sparse=always", os.path.join(images, v, "disk.img"), img + ".new"], check=True)
        os.replace(img + ".new", img)
        subprocess.run(["sync"], check=True)
        st = os.stat(img)
        k = i % len(t.systems)
        for s in t.systems[k:] + t.systems[:k]:
            warm(src)
            row, out = timed(t.backup(s, w, src, f"v{i}"), t.env_for(s, w))
            row.update(version=v, logical=st.st_size, allocated=st.st_blocks * 512)
            if s.startswith("strata"):
                row["profile"] = strata_profile(out, "backup")
            res[s]["backups"].append(row)
            print(w, s, "backup", v, json.dumps(row), flush=True)
    keep = keep or max(1, len(versions) // 2)
    for s in t.systems:
        total = {"seconds": 0.0, "user": 0.0, "sys": 0.0, "peak_rss_MiB": 0.0}
        for cmd in t.forget(s, w, keep):
            row, _ = timed(cmd, t.env_for(s, w))
            for k2 in ("seconds", "user", "sys"):
                total[k2] += row[k2]
            total["peak_rss_MiB"] = max(total["peak_rss_MiB"], row["peak_rss_MiB"])
        total["forgotten"] = len(versions) - keep
        res[s]["forget_prune"] = total
        print(w, s, "forget+prune", json.dumps(total), flush=True)
    return {"versions": versions, "results": res}


def limits():
    bench = os.path.join(HERE, "../target/release/strata-bench")
    if not os.path.exists(bench):
        return None
    out = subprocess.run([bench, "limits"], capture_output=True, text=True).stdout
    get = lambda k: float(re.search(k + r"[^:]*:\s*([\d.]+) MB/s", out).group(1))
    cores = int(re.search(r"cores:\s*(\d+)", out).group(1))
    chunk, hash_ = get("FastCDC"), get("BLAKE3")
    return {"cores": cores, "chunk_MBps": chunk, "hash_MBps": hash_,
            "chunk_hash_MBps": cores / (1 / chunk + 1 / hash_)}


def summary(data, systems):
    lines = []
    tree = data.get("tree")
    if tree:
        r = tree["results"]
        lines.append(f"tree: {len(tree['versions'])} releases, {tree['files']} files, {tree['bytes'] / 1e6:.1f} MB")
        lines.append("| tool | later backup s (median) | restore s (median) | backup RSS MiB | restore RSS MiB |")
        lines.append("|---|---|---|---|---|")
        for s in systems:
            b = [x["seconds"] for x in r[s]["backups"][1:]]
            rs = [x["seconds"] for x in r[s]["restores"]]
            lines.append(f"| {s} | {median(b):.3f} | {median(rs):.3f} | "
                         f"{max(x['peak_rss_MiB'] for x in r[s]['backups']):.0f} | "
                         f"{max(x['peak_rss_MiB'] for x in r[s]['restores']):.0f} |")
    img = data.get("image")
    if img:
        r = img["results"]
        lim = data.get("limits")
        lines.append(f"image: {len(img['versions'])} versions")
        lines.append("| tool | later backup s (median) | MB/s (logical) | of chunk+hash limit | forget+prune s | backup RSS MiB |")
        lines.append("|---|---|---|---|---|---|")
        for s in systems:
            later = r[s]["backups"][1:] or r[s]["backups"]
            sec = median([x["seconds"] for x in later])
            mbps = median([x["logical"] / x["seconds"] / 1e6 for x in later])
            of = f"{mbps / lim['chunk_hash_MBps'] * 100:.0f} %" if lim else "–"
            lines.append(f"| {s} | {sec:.2f} | {mbps:.0f} | {of} | {r[s]['forget_prune']['seconds']:.2f} | "
                         f"{max(x['peak_rss_MiB'] for x in r[s]['backups']):.0f} |")
    return "\n".join(lines)


def main():
    work = os.path.abspath(sys.argv[1])
    systems = [s for s in arg("--systems", "strata,strata-plain,restic,borg").split(",")
               if s.startswith("strata") or shutil.which(s)]
    t = Tools(work, systems)
    os.makedirs(work, exist_ok=True)
    data = {"systems": systems, "limits": limits()}
    if arg("--tree"):
        data["tree"] = tree_workload(t, os.path.abspath(arg("--tree")), int(arg("--rounds", "3")),
                                     "--syscalls" in sys.argv)
    if arg("--images"):
        data["image"] = image_workload(t, os.path.abspath(arg("--images")), int(arg("--keep", "0")))
    with open(os.path.join(work, "speed.json"), "w") as f:
        json.dump(data, f, indent=1)
    print(summary(data, systems))


if __name__ == "__main__":
    main()
