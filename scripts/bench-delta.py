#!/usr/bin/env python3
"""Delta compression on a real release series: stored bytes per version.

Every release (`scripts/release-series`: one directory per release, taken
in natural version order) is copied with its files' times to the same
path and backed up by each system in turn:

  strata-delta  `strata init --encrypt --delta on`
  strata        `strata init --encrypt` (deltas off)
  borg          `borg init -e none`, `--compression zstd,3`
  restic        `restic init` (its default compression)
  git           each release committed; `git gc --aggressive` at the end

After each backup: the repository's bytes on disk, the backup's wall
seconds (and Strata's `delta` figures). At the end: the newest version
restored 3 times by both Strata repositories (wall seconds, bytes the
process read per byte restored, `diff -r` against the source).

usage: scripts/bench-delta.py WORK --tree RELEASES_DIR [--count N]
         [--systems strata-delta,strata,borg,restic,git]
Writes WORK/delta.json and prints a Markdown summary.
"""
import json, os, re, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
STRATA = os.environ.get("STRATA_BIN", os.path.join(HERE, "../target/release/strata"))


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def natural(d):
    return [int(x) if x.isdigit() else x.lower() for x in re.split(r"(\d+)", d)]


def du(path):
    total = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except FileNotFoundError:
                pass
    return total


class Systems:
    def __init__(self, work):
        self.work = work
        self.env = dict(os.environ, STRATA_PASSWORD="bench", RESTIC_PASSWORD="bench", BORG_PASSPHRASE="",
                        BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes", GIT_CONFIG_COUNT="2",
                        GIT_CONFIG_KEY_0="safe.directory", GIT_CONFIG_VALUE_0="*",
                        GIT_CONFIG_KEY_1="gc.auto", GIT_CONFIG_VALUE_1="0")

    def repo(self, s):
        return os.path.join(self.work, "repo-" + s)

    def env_for(self, s):
        r = self.repo(s)
        return dict(self.env, STRATA_CACHE_DIR=r + ".cache", RESTIC_CACHE_DIR=r + ".cache",
                    BORG_CACHE_DIR=r + ".cache", BORG_BASE_DIR=r + ".base")

    def run(self, s, cmd, cwd=None):
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=self.env_for(s), cwd=cwd, capture_output=True)
        if p.returncode not in (0, 3):
            sys.exit(f"{' '.join(cmd)} failed: {p.stderr.decode(errors='replace')[-2000:]}")
        return time.monotonic() - t0, p.stdout

    def init(self, s):
        r = self.repo(s)
        for p in (r, r + ".cache", r + ".base"):
            shutil.rmtree(p, ignore_errors=True)
        if s == "git":
            os.makedirs(r)
            self.run(s, ["git", "init", "-q", r])
            return
        cmd = {"strata-delta": [STRATA, "--repo", r, "-q", "init", "--encrypt", "--delta", "on"],
               "strata": [STRATA, "--repo", r, "-q", "init", "--encrypt"],
               "restic": ["restic", "-q", "-r", r, "init"],
               "borg": ["borg", "init", "-e", "none", r]}[s]
        self.run(s, cmd)

    def backup(self, s, src, tag):
        r = self.repo(s)
        if s == "git":
            t0 = time.monotonic()
            for e in os.listdir(r):
                if e != ".git":
                    p = os.path.join(r, e)
                    shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
            subprocess.run(["cp", "-a", src + "/.", r], check=True)
            self.run(s, ["git", "add", "-A", "."], cwd=r)
            self.run(s, ["git", "-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", tag], cwd=r)
            return time.monotonic() - t0, None
        cmd = {"strata": [STRATA, "--repo", r, "--json", "backup", src],
               "restic": ["restic", "-q", "-r", r, "backup", src],
               "borg": ["borg", "create", "--compression", "zstd,3", f"{r}::{tag}", src]}
        secs, out = self.run(s, cmd["strata" if s.startswith("strata") else s])
        return secs, (json.loads(out) if s.startswith("strata") else None)

    def size(self, s):
        r = self.repo(s)
        if s == "git":
            return du(os.path.join(r, ".git", "objects"))
        return du(r)


def main():
    if len(sys.argv) < 2 or "--tree" not in sys.argv:
        sys.exit(__doc__)
    work, releases = os.path.abspath(sys.argv[1]), arg("--tree")
    systems = arg("--systems", "strata-delta,strata,borg,restic,git").split(",")
    systems = [s for s in systems if s.startswith("strata") or shutil.which(s)]
    versions = sorted((d for d in os.listdir(releases) if not d.startswith(".")), key=natural)
    versions = versions[: int(arg("--count", len(versions)))]
    os.makedirs(work, exist_ok=True)
    t = Systems(work)
    for s in systems:
        t.init(s)
    src = os.path.join(work, "src")
    rows = []
    for i, v in enumerate(versions):
        shutil.rmtree(src, ignore_errors=True)
        subprocess.run(["cp", "-a", os.path.join(releases, v), src], check=True)
        row = {"version": v, "bytes": du(src)}
        for s in systems:
            secs, out = t.backup(s, src, f"v{i}")
            row[s] = {"seconds": secs, "stored": t.size(s)}
            if out and out.get("delta"):
                row[s]["delta"] = out["delta"]
            if out:
                row[s]["new_stored_bytes"] = out.get("new_stored_bytes")
        rows.append(row)
        print(json.dumps(row), flush=True)
    final = {}
    if "git" in systems:
        secs, _ = t.run("git", ["git", "gc", "-q", "--aggressive"], cwd=t.repo("git"))
        final["git_gc_seconds"] = secs
        rows[-1]["git"]["stored"] = t.size("git")
    restores = {}
    for s in [s for s in systems if s.startswith("strata")]:
        restores[s] = []
        for k in range(3):
            target = os.path.join(work, f"restore-{s}-{k}")
            shutil.rmtree(target, ignore_errors=True)
            secs, out = t.run(s, [STRATA, "--repo", t.repo(s), "--json", "restore", "latest", "--target", target])
            rep = json.loads(out)
            read = (rep.get("process") or {}).get("rchar")
            same = subprocess.run(["diff", "-rq", src, os.path.join(target, src.lstrip("/"))],
                                  stdout=subprocess.DEVNULL).returncode == 0
            restores[s].append({"seconds": secs, "read_bytes": read, "identical": same})
            shutil.rmtree(target, ignore_errors=True)
    data = {"versions": versions, "rows": rows, "restores": restores, "final": final}
    with open(os.path.join(work, "delta.json"), "w") as f:
        json.dump(data, f, indent=1)
    summary(data, systems)


def summary(d, systems):
    last = d["rows"][-1]
    logical = sum(r["bytes"] for r in d["rows"])
    print(f"\n{len(d['rows'])} versions, {logical / 1e6:.1f} MB of trees\n")
    print("| system | stored MB | vs strata | median later backup s |")
    print("|---|---|---|---|")
    base = last.get("strata", {}).get("stored")
    for s in systems:
        st = last[s]["stored"]
        later = [r[s]["seconds"] for r in d["rows"][1:]]
        ratio = f"{st / base:.2f}×" if base else "–"
        med = f"{statistics.median(later):.2f}" if later else "–"
        print(f"| {s} | {st / 1e6:.2f} | {ratio} | {med} |")
    for s, rs in d["restores"].items():
        secs = statistics.median(r["seconds"] for r in rs)
        reads = [r["read_bytes"] for r in rs if r["read_bytes"]]
        per = f", {statistics.median(reads) / last['bytes']:.2f} bytes read per byte" if reads else ""
        ok = all(r["identical"] for r in rs)
        print(f"restore newest, {s}: median {secs:.3f} s{per}, identical: {ok}")


if __name__ == "__main__":
    main()
