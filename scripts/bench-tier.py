#!/usr/bin/env python3
"""Cloud-tier figures (issue 10): a series of versions backed up into a local
repository, then migrated to its cloud tier in a real S3 bucket (versitygw on
loopback) one version at a time, oldest first. For every step: what
`tier estimate` said the active tier would free, what migrate + gc actually
freed (`stats --json` stored_bytes before and after), what migrate sent
against what the cloud tier lacked, and the requests. Then the newest cloud
version is restored from the bucket and compared with the source.

Last, every other cloud version is forgotten and the cloud tier cleaned
with `tier gc` (--gc service: a copy-forward service next to the bucket;
s3-copy: S3's UploadPartCopy; download: the egress-paying fallback),
reporting bytes freed and downloaded and the efficiency region
granularity costs.

usage: scripts/bench-tier.py WORK [--kind sg-image|ddgen] [--scale S] [--versions N]
                             [--gc service|s3-copy|download] [--container-mib N]
Starts its own S3 server unless STRATA_TEST_S3 is set (scripts/s3-server).
"""
import json, os, random, shutil, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATA = os.environ.get("STRATA_BIN", os.path.join(ROOT, "target/release/strata"))
BENCH = os.environ.get("STRATA_BENCH_BIN", os.path.join(ROOT, "target/release/strata-bench"))

def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default

def sh(cmd, env, ok=(0,)):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode not in ok:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout

def strata(env, repo, *args):
    out = sh([STRATA, "--repo", repo, "--json", *args], env, ok=(0, 3))
    return json.loads(out)

def main():
    work = os.path.abspath(sys.argv[1])
    kind = arg("--kind", "sg-image")
    scale = arg("--scale", "0.1")
    versions = int(arg("--versions", "6"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, STRATA_PASSWORD="bench", AWS_ACCESS_KEY_ID="strata",
               AWS_SECRET_ACCESS_KEY="strata-secret")
    server = None
    if not env.get("STRATA_TEST_S3"):
        out = sh(["bash", os.path.join(ROOT, "scripts/s3-server"), "start", os.path.join(work, "s3")], env)
        for line in out.split("\n"):
            for kv in line.replace("export ", "").split():
                k, _, v = kv.partition("=")
                env[k] = v
        server = env["STRATA_S3_PID"]
    env["AWS_ENDPOINT_URL"] = env["STRATA_TEST_S3"]
    try:
        run(work, kind, scale, versions, env)
    finally:
        if server:
            subprocess.run(["kill", server])

def run(work, kind, scale, versions, env):
    src, repo = os.path.join(work, "src"), os.path.join(work, "repo")
    strata(env, repo, "init", "--encrypt")
    gen = {"sg-image": ["sg", "--preset", "SG1", "--image"], "ddgen": ["ddgen", "--streams", "1"]}[kind]
    ids, logical = [], 0
    for v in range(1, versions + 1):
        # gen makes version v from scratch (earlier versions in place).
        for d in (src, src + ".sg-tree"):
            shutil.rmtree(d, ignore_errors=True)
        sh([BENCH, "gen", *gen, "--scale", scale, "--versions", str(versions),
            "--version", str(v), "--out", src], env)
        b = strata(env, repo, "backup", "--series", "bench", src)
        ids.append(b["id"])
        logical += b["logical_bytes"]
        if v == versions - 1:
            shutil.copytree(src, os.path.join(work, f"v{v}"))
    shutil.rmtree(src + ".sg-tree", ignore_errors=True)
    bucket = f"s3://bench-tier-{random.randrange(1 << 30)}/cold"
    strata(env, repo, "tier", "add", bucket, "--container-mib", arg("--container-mib", "4"))
    rows = []
    for k in range(versions - 1):
        vid = ids[k]
        est = strata(env, repo, "tier", "estimate", vid)
        before = strata(env, repo, "stats")["stored_bytes"]
        t = time.monotonic()
        m = strata(env, repo, "tier", "migrate", vid)
        secs = time.monotonic() - t
        strata(env, repo, "gc")
        after = strata(env, repo, "stats")["stored_bytes"]
        rows.append({"version": k + 1, "estimate_freed": est["freed_bytes"],
                     "estimate_whole_containers": est["freed_container_bytes"],
                     "actual_freed": before - after,
                     "lacked_raw": m["raw_bytes_sent"], "containers_bytes": m["stored_bytes_sent"],
                     "lacked_data": m["data_bytes_sent"], "lacked_recipe": m["recipe_bytes_sent"],
                     "sent_over_lacked": round(m["cloud_requests"]["bytes_sent"]
                                               / max(1, m["data_bytes_sent"] + m["recipe_bytes_sent"]), 4),
                     "sent_over_lacked_data": round(m["cloud_requests"]["bytes_sent"]
                                                    / max(1, m["data_bytes_sent"]), 4),
                     "bytes_uploaded": m["cloud_requests"]["bytes_sent"], "puts": m["cloud_requests"]["puts"],
                     "gets": m["cloud_requests"]["gets"] + m["cloud_requests"]["ranged_gets"],
                     "deduplicated_chunks": m["chunks_deduplicated"], "sent_chunks": m["chunks_sent"],
                     "migrate_seconds": secs})
        print(json.dumps(rows[-1]), flush=True)
    # Restore the newest cloud version from the bucket.
    target = os.path.join(work, "restore")
    t = time.monotonic()
    r = strata(env, repo, "restore", ids[versions - 2], "--target", target)
    secs = time.monotonic() - t
    same = subprocess.run(["diff", "-r", os.path.join(work, f"v{versions - 1}"),
                           target + os.path.join(work, "src")], capture_output=True).returncode == 0
    cr = r["cloud_requests"]
    print(json.dumps({"restore_from_cloud_seconds": secs, "bytes": r["bytes"], "identical": same,
                      "cloud_gets": cr["gets"] + cr["ranged_gets"], "cloud_bytes_received": cr["bytes_received"]}))
    # Forget every other cloud version, then clean the cloud tier.
    for vid in ids[0:versions - 1:2]:
        strata(env, repo, "forget", vid)
    how = arg("--gc", "service")
    svc = None
    gc_args = ["tier", "gc", "--threshold", arg("--threshold", "0.2")]
    if how == "service":
        import socket
        sk = socket.socket(); sk.bind(("127.0.0.1", 0)); port = sk.getsockname()[1]; sk.close()
        svc = subprocess.Popen([STRATA, "--repo", bucket, "copy-forward-service", "--listen",
                                f"127.0.0.1:{port}"], env=env, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close(); break
            except OSError:
                time.sleep(0.1)
        gc_args += ["--service", f"http://127.0.0.1:{port}"]
    else:
        gc_args += ["--" + how]
    try:
        g = strata(env, repo, *gc_args)
    finally:
        if svc:
            svc.kill()
    gc = {k: g[k] for k in ("copier", "bytes_before", "bytes_after", "dead_bytes_freed", "dead_bytes_kept",
                            "dead_bytes_copied", "efficiency_loss", "containers_deleted",
                            "containers_copied_forward", "containers_too_small", "bytes_copied",
                            "bytes_downloaded", "service_answer_bytes", "seconds")}
    gc["cloud_requests"] = g["cloud_requests"]
    print(json.dumps({"cloud_gc": gc}))
    print(json.dumps({"kind": kind, "scale": scale, "versions": versions, "logical_bytes": logical,
                      "steps": rows, "cloud_gc": gc}, indent=1))

if __name__ == "__main__":
    main()
