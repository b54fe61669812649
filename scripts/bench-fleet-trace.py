#!/usr/bin/env python3
"""Fleet trace mode (issue 12): the paper's scale — 100 hosts × 25 VMs ×
40 GB, the paper's dirty ratios — modelled stage by stage from per-record
CPU costs measured on the real stages (python/strata_fleet/trace.py).

  scripts/bench-fleet-trace.py OUT [--no-calibrate] [--placement balanced|random|uniform]
                               [--division equal|fixed-write] [--overlap-cpu]

Calibrates (≈ 10 s: the real scan/route/compare/store/update/finish
stages on small synthetic inputs, then again each in a worker process
under a 35 MB cap for their peak RSS), then prints Markdown tables: the
costs, Fig. 9 (parallel time vs M with the stage breakdown), Table 1 (q
vs memory, time, throughput, Option 1) beside the paper's numbers, where
the time goes, the memory of every step at M = 35 MB (model and
measured). Writes OUT/fleet-trace.json, OUT/fleet-trace-fig9.svg,
OUT/fleet-trace-table1.svg and OUT/fleet-trace-option1.svg. Needs the
Python package (`scripts/python-env` or `pip install .`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from strata_fleet import trace  # noqa: E402

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
HEAD = '<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">'


def frame(W, H, L, B, T, R, title, xlabel, ylabel, y1):
    out = [HEAD.format(W=W, H=H), f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">{xlabel}</text>',
           f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" text-anchor="middle">{ylabel}</text>']
    sy = lambda v: H - B - v / y1 * (H - B - T)  # noqa: E731
    for k in range(6):
        yv = y1 * k / 5
        out.append(f'<line x1="{L - 4}" y1="{sy(yv):.1f}" x2="{W - R}" y2="{sy(yv):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    return out, sy


def fig9_svg(path, jobs):
    """Stacked bars: stage 1-4 hours per M, the paper's 3.1 h at 35 MB."""
    W, H, L, B, T, R = 640, 400, 60, 50, 40, 150
    y1 = max(j["total_h"] for j in jobs) * 1.1
    out, sy = frame(W, H, L, B, T, R, "Parallel time vs memory cap M (cf. Fig. 9)", "M (MB); q chosen per M", "hours", y1)
    slot = (W - L - R) / len(jobs)
    for i, j in enumerate(jobs):
        x, base = L + slot * i + slot * 0.2, 0.0
        for k, st in enumerate(trace.STAGES):
            h = j["stage_h"][st]
            out.append(f'<rect x="{x:.1f}" y="{sy(base + h):.1f}" width="{slot * 0.6:.1f}" height="{sy(base) - sy(base + h):.1f}" fill="{COLORS[k]}"/>')
            base += h
        out.append(f'<text x="{x + slot * 0.3:.1f}" y="{H - B + 16}" text-anchor="middle">{j["memory_mb"]:g} (q={j["q"]})</text>')
        out.append(f'<text x="{x + slot * 0.3:.1f}" y="{sy(base) - 4:.1f}" text-anchor="middle">{base:.2f}</text>')
        paper = trace.PAPER["fig9"]["total_h"].get(int(j["memory_mb"]))
        if paper:
            out.append(f'<line x1="{x - 4:.1f}" y1="{sy(paper):.1f}" x2="{x + slot * 0.6 + 4:.1f}" y2="{sy(paper):.1f}" stroke="black" stroke-width="2" stroke-dasharray="4 2"/>')
    for k, st in enumerate(trace.STAGES):
        out.append(f'<rect x="{W - R + 10}" y="{T + 18 * k}" width="12" height="12" fill="{COLORS[k]}"/>')
        out.append(f'<text x="{W - R + 28}" y="{T + 18 * k + 10}">stage {st}</text>')
    out.append(f'<text x="{W - R + 10}" y="{T + 18 * 5}">- - paper (3.1 h)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def lines_svg(path, title, ylabel, series):
    """Line chart over q: series = [(label, [(q, hours or None), ...], dashed)]."""
    W, H, L, B, T, R = 640, 400, 60, 50, 40, 190
    pts = [(x, y) for _, ps, _ in series for x, y in ps if y is not None]
    x0, x1 = min(x for x, _ in pts), max(x for x, _ in pts)
    y1 = max(y for _, y in pts) * 1.1
    out, sy = frame(W, H, L, B, T, R, title, "q (partitions per host)", ylabel, y1)
    sx = lambda v: L + (v - x0) / ((x1 - x0) or 1) * (W - L - R)  # noqa: E731
    for x in sorted({x for x, _ in pts}):
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x}</text>')
    for i, (label, ps, dashed) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        ps = [(x, y) for x, y in ps if y is not None]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{d}"/>')
        for x, y in ps:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>')
        out.append(f'<text x="{W - R + 10}" y="{T + 16 * i + 10}" fill="{c}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--no-calibrate", action="store_true", help="use trace.DEFAULT_COSTS instead of measuring")
    ap.add_argument("--placement", default="balanced", choices=["balanced", "random", "uniform"])
    ap.add_argument("--division", default="equal", choices=["equal", "fixed-write"])
    ap.add_argument("--overlap-cpu", action="store_true", help="CPU overlapped with disk I/O (default: added)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    params = replace(trace.Params(), placement=a.placement, division=a.division, overlap_cpu=a.overlap_cpu)
    res = trace.run(params, calibrate_costs=not a.no_calibrate)
    with open(os.path.join(a.out, "fleet-trace.json"), "w") as f:
        json.dump(res, f, indent=1)
    fig9_svg(os.path.join(a.out, "fleet-trace-fig9.svg"), res["fig9"])
    P = trace.PAPER["table1"]
    qs = P["q"]
    lines_svg(os.path.join(a.out, "fleet-trace-table1.svg"), "Total time vs q, M = 35 MB, Option 2 (cf. Table 1)", "hours", [
        ("ours", [(r["q"], r["total_h"]) for r in res["table1"]], False),
        ("ours, CPU overlapped", [(r["q"], r["total_h"]) for r in res["table1_cpu_overlapped"]], False),
        ("ours, fixed-write", [(r["q"], r["total_h"]) for r in res["table1_fixed_write"]], False),
        ("paper", list(zip(qs, P["total_h"])), True),
    ])
    lines_svg(os.path.join(a.out, "fleet-trace-option1.svg"), "Total time vs q, M = 35 MB, Option 1 (p×q send buffers)", "hours", [
        ("ours, Option 1", [(r["q"], r["option1_h"]) for r in res["table1"]], False),
        ("ours, Option 2", [(r["q"], r["total_h"]) for r in res["table1"]], False),
        ("paper, Option 1", list(zip(qs, P["option1_h"])), True),
        ("paper, Option 2", list(zip(qs, P["total_h"])), True),
    ])
    print(trace.markdown(res))
    print(f"\nWrote {a.out}/fleet-trace.json and fleet-trace-{{fig9,table1,option1}}.svg", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
