#!/usr/bin/env python3
"""Side-by-side core benchmark (issue 2): Strata vs restic (and borg) on one
directory of real files, in one interleaved run.

Steps per system: first backup, second backup after ~5 % of the files were
changed, restore of the latest version (page cache dropped before each
restore where permitted). Reports wall time, MB/s, peak RSS (wait4 rusage)
and repository size. The full harness (strata-bench) supersedes this.

usage: scripts/bench-core.py SRC_DIR WORK_DIR [--systems strata,restic,borg]
"""
import json, os, random, shutil, subprocess, sys, time

def run(cmd, env=None, stdin=None):
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=stdin)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 3):
        sys.exit(f"{' '.join(cmd)} failed ({code}): {err[-2000:]}")
    return dt, ru.ru_maxrss * 1024

def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total

def drop_caches():
    try:
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False

def modify(src, fraction, seed):
    files = []
    for root, _, fs in os.walk(src):
        for f in fs:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                files.append(p)
    files.sort()
    rnd = random.Random(seed)
    chosen = rnd.sample(files, max(1, int(len(files) * fraction)))
    for p in chosen:
        with open(p, "r+b") as f:
            data = f.read()
            pos = rnd.randrange(len(data) + 1)
            f.seek(0)
            f.write(data[:pos] + b"strata-bench edit %d\n" % rnd.randrange(1 << 30) + data[pos:])
    return len(chosen), len(files)

def main():
    src, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    systems = ["strata", "restic", "borg"]
    if "--systems" in sys.argv:
        systems = sys.argv[sys.argv.index("--systems") + 1].split(",")
    strata = os.environ.get("STRATA_BIN", os.path.join(os.path.dirname(__file__), "../target/release/strata"))
    env = dict(os.environ, STRATA_PASSWORD="bench", RESTIC_PASSWORD="bench", BORG_PASSPHRASE="",
               BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes", BORG_RELOCATED_REPO_ACCESS_IS_OK="yes")
    os.makedirs(work, exist_ok=True)
    repos = {s: os.path.join(work, "repo-" + s) for s in systems}
    for r in repos.values():
        shutil.rmtree(r, ignore_errors=True)
    cmds = {
        "strata": {
            "init": [strata, "--repo", repos.get("strata", ""), "-q", "init", "--encrypt"],
            "backup": lambda i: [strata, "--repo", repos["strata"], "-q", "backup", src],
            "restore": lambda t: [strata, "--repo", repos["strata"], "-q", "restore", "latest", "--target", t],
        },
        "restic": {
            "init": ["restic", "-q", "-r", repos.get("restic", ""), "init"],
            "backup": lambda i: ["restic", "-q", "-r", repos["restic"], "backup", src],
            "restore": lambda t: ["restic", "-q", "-r", repos["restic"], "restore", "latest", "--target", t],
        },
        "borg": {
            "init": ["borg", "init", "-e", "none", repos.get("borg", "")],
            "backup": lambda i: ["borg", "create", "--compression", "zstd,3", f"{repos['borg']}::v{i}", src],
            "restore": lambda t: ["sh", "-c", f"cd {t} && borg extract {repos['borg']}::v2"],
        },
    }
    size = du(src)
    res = {s: {} for s in systems}
    for s in systems:
        run(cmds[s]["init"], env)
    for i in (1, 2):
        if i == 2:
            n, tot = modify(src, 0.05, 42)
            print(f"modified {n} of {tot} files", flush=True)
        for s in systems:
            drop_caches()
            dt, rss = run(cmds[s]["backup"](i), env)
            res[s][f"backup{i}"] = {"seconds": dt, "MBps": size / dt / 1e6, "peak_rss_MiB": rss / 2**20,
                                   "repo_bytes": du(repos[s])}
            print(s, f"backup{i}", json.dumps(res[s][f"backup{i}"]), flush=True)
    for s in systems:
        t = os.path.join(work, "restore-" + s)
        shutil.rmtree(t, ignore_errors=True)
        os.makedirs(t)
        dropped = drop_caches()
        dt, rss = run(cmds[s]["restore"](t), env)
        res[s]["restore"] = {"seconds": dt, "MBps": size / dt / 1e6, "peak_rss_MiB": rss / 2**20,
                             "cache_dropped": dropped}
        print(s, "restore", json.dumps(res[s]["restore"]), flush=True)
        rc = subprocess.run(["diff", "-rq", src, t + src], stdout=subprocess.DEVNULL).returncode
        res[s]["restore"]["identical"] = rc == 0
        shutil.rmtree(t, ignore_errors=True)
    print(json.dumps({"source_bytes": size, "results": res}, indent=1))

if __name__ == "__main__":
    main()
