"""Benchmark: six `graphdoctor diff` processes started at once on one GPU against the same six one after another.

Usage (on a CUDA machine, from the repository root):
    python tests/benchmarks/concurrent_diffs.py --out DIR [--mode together,alone] [--timeout 400]

The cases are the clean model at dropout 0 and at 0.1 and planted fixtures whose verdicts are capture-failed
(`.item()` in an MLP), frozen-rng (a host-drawn mask) and numeric-divergence (a reassigned scale, and a rebound
gain). `together` starts all six at once, each sizing its own children, as two engineers or `pytest -n 6` would;
the machine-wide GPU slots (graphdoctor/parent/slots.py) make their children queue. `alone` runs them one after
another. For each case and mode it records the exit code, every row's verdict, diagnosis module and file:line,
and the wall time; the JSON on stdout has both modes side by side with their total walls. A case whose verdict,
module or line differs between the modes is a failure of the concurrency issue's acceptance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SMALL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2", "--timeout", "300",
         "--no-memory", "--no-launches"]
CASES: dict[str, list[str]] = {
    "clean_dropout0": ["--impl", "local,full_iteration", "--dropout", "0"],
    "clean_dropout0.1": ["--impl", "local,full_iteration", "--dropout", "0.1"],
    "capture_failed_item": ["--impl", "local", "--dropout", "0", "--layer-spec", "fixtures.planted.item_mlp:layer_spec"],
    "frozen_rng_host_mask": ["--impl", "local", "--dropout", "0",
                             "--layer-spec", "fixtures.planted.host_mask_dropout:layer_spec"],
    "numeric_reassigned_scale": ["--impl", "local", "--dropout", "0",
                                 "--layer-spec", "fixtures.planted.reassigned_scale:layer_spec"],
    "numeric_rebound_gain": ["--impl", "local", "--dropout", "0",
                             "--layer-spec", "fixtures.planted.cause_rebound_gain:layer_spec",
                             "--forward-step", "fixtures.planted.cause_rebound_gain:forward_step"],
}


def _start(case: str, out: Path, mode: str) -> tuple[subprocess.Popen[bytes], float]:
    report = out / f"{mode}-{case}.json"
    argv = [sys.executable, "-m", "graphdoctor", "diff", *SMALL, *CASES[case], "--json", str(report), "-q"]
    log = (out / f"{mode}-{case}.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()), time.time()


def _result(case: str, out: Path, mode: str, code: int, wall_s: float) -> dict[str, Any]:
    report = out / f"{mode}-{case}.json"
    rows: list[dict[str, Any]] = []
    if report.exists():
        data = json.loads(report.read_text())
        for row in data.get("impls", []):
            diag = row.get("diagnosis") or {}
            rows.append({"impl": row["impl"], "verdict": row["verdict"], "module": diag.get("module"),
                         "location": diag.get("location"), "rule": diag.get("rule")})
    return {"case": case, "exit_code": code, "wall_s": round(wall_s, 1), "rows": rows,
            "said": (out / f"{mode}-{case}.log").read_text(errors="replace").strip().splitlines()[-1:]}


def run_mode(mode: str, out: Path, timeout_s: float) -> dict[str, Any]:
    """Every case, all at once (`together`) or one after another (`alone`)."""
    began = time.time()
    results = []
    if mode == "together":
        started = {case: _start(case, out, mode) for case in CASES}
        for case, (proc, at) in started.items():
            try:
                code = proc.wait(timeout=max(1.0, timeout_s - (time.time() - began)))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            results.append(_result(case, out, mode, code, time.time() - at))
    else:
        for case in CASES:
            proc, at = _start(case, out, mode)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            results.append(_result(case, out, mode, code, time.time() - at))
    return {"mode": mode, "wall_s": round(time.time() - began, 1), "cases": results}


def main(argv: list[str] | None = None) -> int:
    """Run the modes asked for; 0 when every case wrote its report, 1 when any did not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", default="together,alone")
    parser.add_argument("--timeout", type=float, default=400.0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = [run_mode(mode, out, args.timeout) for mode in args.mode.split(",")]
    print(json.dumps({"modes": modes}, indent=1))
    for mode in modes:
        print(f"{mode['mode']}: {mode['wall_s']} s; " + ", ".join(
            f"{c['case']} {c['exit_code']} {'/'.join(r['verdict'] for r in c['rows'])}" for c in mode["cases"]),
            file=sys.stderr)
    return 0 if all(c["rows"] for m in modes for c in m["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
