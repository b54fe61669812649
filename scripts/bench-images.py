#!/usr/bin/env python3
"""Side-by-side benchmark on a real disk-image series (issue 9): every
version is one raw disk image (e.g. `scripts/vm-image-series` output:
DIR/week-N/disk.img), backed up in order from the same path, as nightly
image backups of one VM are.

Systems: strata (plain `strata init` + `strata backup`: the defaults a user
gets), strata-exact (`init --index exact`), restic (defaults). Strata is
unencrypted here unless --encrypt (restic always encrypts). Reports per
version the backup wall time, peak RSS (wait4) and repository size, then
the final sizes and their ratios, and checks that the newest version
restores identical.

usage: scripts/bench-images.py VERSIONS_DIR WORK_DIR [--systems strata,strata-exact,restic] [--encrypt]
"""
import json, os, shutil, subprocess, sys, time

def run(cmd, env):
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    err = p.stderr.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed: {err[-2000:]}")
    return dt, ru.ru_maxrss * 1024, out

def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total

def main():
    vdir, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    systems = ["strata", "strata-exact", "restic"]
    if "--systems" in sys.argv:
        systems = sys.argv[sys.argv.index("--systems") + 1].split(",")
    enc = ["--encrypt"] if "--encrypt" in sys.argv else []
    strata = os.environ.get("STRATA_BIN", os.path.join(os.path.dirname(__file__), "../target/release/strata"))
    def order(d):
        n = d.rsplit("-", 1)[-1]
        return (0, int(n), d) if n.isdigit() else (1, 0, d)
    versions = sorted((d for d in os.listdir(vdir)
                       if not d.startswith(".") and os.path.isfile(os.path.join(vdir, d, "disk.img"))),
                      key=order)
    env = dict(os.environ, STRATA_PASSWORD="bench", RESTIC_PASSWORD="bench")
    shutil.rmtree(work, ignore_errors=True)
    src = os.path.join(work, "vm")
    os.makedirs(src)
    repos = {s: os.path.join(work, "repo-" + s) for s in systems}
    def strata_cmd(s, *a):
        return [strata, "--repo", repos[s], *a]
    cmds = {
        "strata": {"init": strata_cmd("strata", "-q", "init", *enc),
                   "backup": strata_cmd("strata", "--json", "backup", src),
                   "restore": lambda t: strata_cmd("strata", "-q", "restore", "latest", "--target", t)},
        "strata-exact": {"init": strata_cmd("strata-exact", "-q", "init", "--index", "exact", *enc),
                         "backup": strata_cmd("strata-exact", "--json", "backup", src),
                         "restore": lambda t: strata_cmd("strata-exact", "-q", "restore", "latest", "--target", t)},
        "restic": {"init": ["restic", "-q", "-r", repos.get("restic", ""), "init"],
                   "backup": ["restic", "-q", "-r", repos.get("restic", ""), "backup", src],
                   "restore": lambda t: ["restic", "-q", "-r", repos["restic"], "restore", "latest", "--target", t]},
    }
    for s in systems:
        env_s = dict(env, STRATA_CACHE_DIR=repos[s] + ".cache")
        run(cmds[s]["init"], env_s)
    res = {s: [] for s in systems}
    logical = 0
    for v in versions:
        img = os.path.join(src, "disk.img")
        subprocess.run(["cp", "--sparse=always", os.path.join(vdir, v, "disk.img"), img + ".new"], check=True)
        os.replace(img + ".new", img)
        # The copy's writeback must not slow whichever system reads first,
        # and every system reads the image from the page cache.
        subprocess.run(["sync"], check=True)
        subprocess.run(["cat", img], stdout=subprocess.DEVNULL, check=True)
        size = os.path.getsize(img)
        logical += size
        # Each version, another system goes first.
        k = versions.index(v) % len(systems)
        for s in systems[k:] + systems[:k]:
            env_s = dict(env, STRATA_CACHE_DIR=repos[s] + ".cache")
            dt, rss, out = run(cmds[s]["backup"], env_s)
            row = {"version": v, "seconds": dt, "MBps": size / dt / 1e6, "peak_rss_MiB": rss / 2**20,
                   "repo_bytes": du(repos[s])}
            if s.startswith("strata"):
                try:
                    j = json.loads(out)
                    row["lifecycle_seconds"] = (j.get("lifecycle") or {}).get("seconds")
                    row["new_raw_bytes"] = j.get("new_raw_bytes")
                except ValueError:
                    pass
            res[s].append(row)
            print(s, json.dumps(row), flush=True)
    final = {s: res[s][-1]["repo_bytes"] for s in systems}
    summary = {"versions": versions, "logical_bytes": logical, "final_repo_bytes": final}
    if "restic" in final:
        summary["vs_restic"] = {s: final[s] / final["restic"] for s in systems}
    if "strata-exact" in final:
        summary["vs_strata_exact"] = {s: final[s] / final["strata-exact"] for s in systems}
    for s in systems:
        later = sorted(r["seconds"] for r in res[s][1:]) or [0]
        summary.setdefault("median_later_backup_s", {})[s] = later[len(later) // 2]
        summary.setdefault("first_backup_s", {})[s] = res[s][0]["seconds"]
        summary.setdefault("max_rss_MiB", {})[s] = max(r["peak_rss_MiB"] for r in res[s])
        t = os.path.join(work, "restore-" + s)
        os.makedirs(t)
        env_s = dict(env, STRATA_CACHE_DIR=repos[s] + ".cache")
        dt, rss, _ = run(cmds[s]["restore"](t), env_s)
        got = os.path.join(t, src.lstrip("/"), "disk.img")
        same = subprocess.run(["cmp", "-s", got, os.path.join(src, "disk.img")]).returncode == 0
        summary.setdefault("restore_newest", {})[s] = {"seconds": dt, "identical": same}
        shutil.rmtree(t, ignore_errors=True)
    print(json.dumps({"summary": summary, "runs": res}, indent=1))

if __name__ == "__main__":
    main()
