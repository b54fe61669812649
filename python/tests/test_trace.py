"""The fleet's trace mode (strata_fleet.trace): invariants of the model at
the paper's scale that could fail, its agreement with the paper's Table 1
and Fig. 9 within stated tolerances, and one calibration run of the real
stages on tiny inputs (the only test that needs the native module; a
few seconds)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from strata_fleet import trace
from strata_fleet.trace import MB, PAPER, STAGES, Params

COSTS = trace.DEFAULT_COSTS


@pytest.fixture(scope="module")
def sizes() -> list[list[float]]:
    return trace.vm_sizes(Params())


@pytest.fixture(scope="module")
def t1(sizes) -> list[dict]:
    return trace.table1(Params(), COSTS)


@pytest.fixture(scope="module")
def f9() -> list[trace.Job]:
    return trace.fig9(Params(), COSTS)


def test_workload_is_the_papers(sizes) -> None:
    p = Params()
    assert len(sizes) == 100 and all(len(h) == 25 for h in sizes)
    total = sum(map(sum, sizes))
    assert total == pytest.approx(2500 * 40e9, rel=1e-9)
    # Long tail: the largest VM is many times the mean.
    assert max(max(h) for h in sizes) > 10 * 40e9
    # §5: 1 − (1 − 0.78)(1 − 0.745) = 94.4 % of the bytes are not copied.
    assert 1 - p.stored_fraction == pytest.approx(0.944, abs=0.0005)
    assert p.dirty_fraction == pytest.approx(0.22)
    # Balanced placement: the busiest host within 0.2 % of the mean.
    assert max(map(sum, sizes)) <= 1.002 * total / 100 + 1


def test_time_decreases_weakly_with_memory(f9, sizes) -> None:
    totals = [j.total_hours for j in f9]
    assert all(a >= b - 1e-9 for a, b in zip(totals, totals[1:])), totals
    # At a fixed q too, stage by stage (more memory: larger buffers, fewer seeks).
    for q in (500, 1000):
        jobs = [trace.simulate(Params(), COSTS, m * MB, q, sizes=sizes) for m in (10, 20, 35, 50, 100, 190)]
        jobs = [j for j in jobs if j.feasible]
        assert len(jobs) >= 4
        for a, b in zip(jobs, jobs[1:]):
            for s in STAGES:
                assert a.stage_hours[s] >= b.stage_hours[s] - 1e-12, (q, s)


def test_option1_slower_and_gap_grows_with_q(t1) -> None:
    ok = [r for r in t1 if r["feasible"]]
    assert len(ok) == 4
    gaps = [r["option1_h"] - r["total_h"] for r in ok]
    assert all(g > 0 for g in gaps)
    assert all(a < b for a, b in zip(gaps, gaps[1:])), gaps


def test_index_request_per_partition_is_total_over_q(sizes) -> None:
    for q in (100, 250, 500, 750, 1000, 3000):
        j = trace.simulate(Params(), COSTS, 35 * MB, q, sizes=sizes)
        assert j.partition_bytes == pytest.approx((j.index_bytes_per_host + j.request_bytes_per_host) / q)
    # Requests: one 44-byte request per 4 KiB block of the dirty bytes, spread evenly.
    assert j.request_bytes_per_host == pytest.approx(0.22 * 1e12 / 4096 * 44, rel=1e-9)


@pytest.mark.parametrize("division", ["equal", "fixed-write"])
def test_memory_within_cap_and_na_exactly_when_partition_does_not_fit(sizes, division) -> None:
    p = replace(Params(), division=division)
    for m in (10, 20, 35, 50, 100):
        for q in trace.Q_CANDIDATES:
            for option in (1, 2):
                j = trace.simulate(p, COSTS, m * MB, q, option, sizes=sizes)
                fits = j.partition_bytes + trace.stage2_minimum(p) <= m * MB
                assert j.feasible == fits, (m, q)
                if not fits:
                    assert j.total_hours is None and j.throughput_gbps is None
                    continue
                assert j.memory_use, (m, q)
                for step, use in j.memory_use.items():
                    assert use["total"] <= m * MB * (1 + 1e-9), (m, q, option, step, use)
                    assert all(x[1] > 0 for x in use.values() if isinstance(x, list)), (step, use)
    # Table 1's N/A: 83.6 MB at q = 100 does not fit 35 MB; 33.5 MB at q = 250 does.
    assert not trace.simulate(p, COSTS, 35 * MB, 100, sizes=sizes).feasible
    assert trace.simulate(p, COSTS, 35 * MB, 250, sizes=sizes).feasible


def test_parallel_time_is_max_over_hosts(sizes) -> None:
    j = trace.simulate(Params(), COSTS, 35 * MB, 500, sizes=sizes)
    for s in STAGES:
        assert len(j.host_seconds[s]) == 100
        assert j.stage_hours[s] * 3600 == pytest.approx(max(j.host_seconds[s]))
    assert j.total_hours == pytest.approx(sum(j.stage_hours.values()))
    # One host with twice the VMs' bytes sets the scan stages' time.
    heavy = [list(h) for h in sizes]
    heavy[7] = [x * 2 for x in heavy[7]]
    k = trace.simulate(Params(), COSTS, 35 * MB, 500, sizes=heavy)
    for s in ("1 scan", "3 backup"):
        assert max(range(100), key=k.host_seconds[s].__getitem__) == 7
        assert k.stage_hours[s] > 1.5 * j.stage_hours[s]
    # The long tail placed at random: the busiest host, not the mean, decides.
    r = trace.best_q(replace(Params(), placement="random"), COSTS)
    b = trace.best_q(Params(), COSTS)
    assert r.total_hours > 1.2 * b.total_hours


# Tolerances against the paper. Index + request per partition: 3 % (83.6 MB
# at q = 100 is the model's one calibration point; the others test the 1/q
# shape; the paper's 8.45 MB at q = 1000 is 1 % above 1/q). Times and
# throughput: ±30 %: the paper gives no CPU/I-O overlap, buffer sizes or
# record sizes; our CPU costs come from this machine's (unoptimised)
# build and add ≈ 14 % of the time; the two scans at 50 MB/s, which are
# the paper's own figures, are ≈ 70 % of it.
TOL = 0.30


def test_table1_within_tolerance_of_paper(t1) -> None:
    P = PAPER["table1"]
    for i, r in enumerate(t1):
        assert r["q"] == P["q"][i]
        assert r["index_request_mb"] == pytest.approx(P["index_request_mb"][i], rel=0.03)
        if P["total_h"][i] is None:
            assert not r["feasible"]
            continue
        assert r["total_h"] == pytest.approx(P["total_h"][i], rel=TOL), r
        assert r["throughput_gbps"] == pytest.approx(P["gbps"][i], rel=TOL), r
        assert r["option1_h"] == pytest.approx(P["option1_h"][i], rel=TOL), r


def test_fig9_shape(f9) -> None:
    by_m = {round(j.memory / MB): j for j in f9}
    assert by_m[35].total_hours == pytest.approx(PAPER["fig9"]["total_h"][35], rel=TOL)
    # "No significant reduction as M increases to 190 MB".
    assert by_m[190].total_hours >= 0.85 * by_m[35].total_hours
    # "Stages 1 and 3 are dominated by the two scans of dirty segments".
    j = by_m[35]
    assert j.stage_hours["1 scan"] + j.stage_hours["3 backup"] > 0.7 * j.total_hours
    for s in ("1 scan", "3 backup"):
        c = j.components[s]
        assert c["transfer"] > c["seeks"] + c["cpu"]


def test_report_renders(tmp_path) -> None:
    import json

    res = trace.run(costs=COSTS)
    json.dumps(res)
    md = trace.markdown(res)
    assert "Fig. 9" in md and "Table 1" in md and "N/A" in md
    assert res["memory_check"]["model_within"]


def test_calibration_on_tiny_inputs(tmp_path) -> None:
    pytest.importorskip("strata._native")
    # A cost is clamped when the machine's load ate the difference it is
    # measured by (CPU time is counted in ticks): one calibration in three
    # must come out unclamped, a systematic clamp fails every time.
    for attempt in range(3):
        work = tmp_path / str(attempt)
        work.mkdir()
        cal = trace.calibrate(
            str(work),
            image_bytes=16 << 20,
            requests=30_000,
            entries=400_000,
            refs=75_000,
            workers=True,
        )
        for k, v in cal.costs.values().items():
            assert math.isfinite(v) and v > 0, (k, v)
        if not cal.clamped:
            break
    assert not cal.clamped, cal.clamped
    workers = [r for r in cal.runs if r["where"] == "worker"]
    assert {r["stage"] for r in workers} == {"scan", "route", "compare", "store", "update", "finish"}
    for r in workers:
        assert 0 < r["peak_rss_bytes"] <= 35 * MB, r
