"""Benchmark: what `graphdoctor diff` costs against the bare Megatron-Core runs it stands for, side by side in
one invocation (issue 32).

A user who checks graphs by hand runs eager training once and graphed training once per implementation. Per
size this runs, on the GPU, one after another:
1. tests/benchmarks/bare_megatron.py (no graphdoctor: the same model, DDP, optimizer, batches and steps as
   diff's children) once for eager and once per implementation, each its own process: the bare seconds;
2. `graphdoctor diff` as a user runs it (the CLI, its own process) with each flag set (the defaults, and
   `--dropout 0`), with --json: the diff seconds, from the command's start to its exit.
It prints the ratio of each diff to the bare runs' sum, the parent's own seconds before its first child and
after its last, and every child's seconds split into start-up, set-up, training, observers and comparison.
Targets (docs/diff.md): defaults <= 1.3x, `--dropout 0` <= 1.1x, parent <= 2 s before and after.

    python tests/benchmarks/diff_cost.py --help
    python tests/benchmarks/diff_cost.py --sizes default,0.54b,1.08b --out cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

SIZES: dict[str, dict[str, Any]] = {
    "default": {},
    "0.54b": {"num-layers": 8, "hidden-size": 2048, "num-attention-heads": 16, "seq-length": 2048,
              "micro-batch-size": 2, "dtype": "bf16", "vocab-size": 32000},
    "1.08b": {"num-layers": 4, "hidden-size": 4096, "num-attention-heads": 32, "seq-length": 4096,
              "micro-batch-size": 1, "dtype": "bf16", "vocab-size": 32000},
}
"""The sizes of issue 32 (h200-findings.md section 7), as flags both sides take."""

FLAG_SETS: dict[str, list[str]] = {"defaults": [], "dropout0": ["--dropout", "0"]}

TIMEOUT_S = 900.0


def size_flags(size: str) -> list[str]:
    return [part for key, value in SIZES[size].items() for part in (f"--{key}", str(value))]


def bare_run(size: str, impl: str, dropout: float, steps: int, out: Path) -> dict[str, Any]:
    """One bare process; its own JSON plus the process wall seen from here."""
    result = out / f"bare-{size}-{impl}.json"
    argv = [sys.executable, str(HERE / "bare_megatron.py"), "--impl", impl, "--steps", str(steps),
            "--dropout", str(dropout), "--json", str(result), *size_flags(size)]
    began = time.time()
    ended = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    wall = time.time() - began
    data: dict[str, Any] = json.loads(result.read_text()) if result.is_file() else {}
    data.update({"impl": impl, "process_s": round(wall, 2), "returncode": ended.returncode})
    if ended.returncode != 0:
        data["tail"] = (ended.stdout + ended.stderr)[-2000:]
    return data


def diff_run(size: str, flags: list[str], impls: str, out: Path, name: str) -> dict[str, Any]:
    """`graphdoctor diff` as its own process; the report plus the seconds seen from here."""
    report_path = out / f"diff-{size}-{name}.json"
    argv = [sys.executable, "-m", "graphdoctor", "diff", "--impl", impls, "--json", str(report_path), "-q",
            *size_flags(size), *flags]
    began = time.time()
    ended = subprocess.run(argv, capture_output=True, text=True, timeout=4 * TIMEOUT_S, check=False)
    exited = time.time()
    report: dict[str, Any] = json.loads(report_path.read_text()) if report_path.is_file() else {}
    timeline = report.get("timeline") or {}
    last = timeline.get("last_child_at")
    first = timeline.get("first_child_at")
    runs = _runs(report)
    return {
        "flags": name, "process_s": round(exited - began, 2), "exit_code": ended.returncode,
        "wall_s": report.get("wall_s"), "jobs": report.get("jobs"),
        "before_first_child_s": round(first - began, 2) if first else None,
        "after_last_child_s": round(exited - last, 2) if last else None,
        "report_after_last_child_s": timeline.get("after_last_child_s"),
        "verdicts": {r["impl"]: r["verdict"] for r in report.get("impls", ())},
        "observers": report.get("observers"),
        "children": [{"name": r.get("name"), "wall_s": round(float(r.get("wall_s", 0.0)), 2),
                      **{k: (round(v, 2) if isinstance(v, float) else v)
                         for k, v in (r.get("seconds") or {}).items() if k not in ("started_at", "ended_at")},
                      "start_at_s": round(r["seconds"]["started_at"] - began, 2) if r.get("seconds") else None}
                     for r in runs],
        "stdout_tail": ended.stdout[-3000:], "stderr_tail": ended.stderr[-2000:] if ended.returncode > 1 else "",
    }


def _runs(report: dict[str, Any]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for run in [report.get("reference"), report.get("control_reference"),
                *(r for row in report.get("impls", ()) for r in row.get("runs", ()))]:
        if run and run.get("name") not in seen:
            seen.add(run.get("name"))
            out.append(run)
    return sorted(out, key=lambda r: (r.get("seconds") or {}).get("started_at", 0.0))


def runnable_impls(requested: str) -> list[str]:
    """The implementations both sides run: transformer_engine only where Transformer Engine imports."""
    impls = [i for i in requested.split(",") if i]
    if "transformer_engine" in impls:
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is None:
            impls.remove("transformer_engine")
    return impls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="default,0.54b,1.08b", help="Comma-separated: " + ", ".join(SIZES))
    parser.add_argument("--flags", default="defaults,dropout0", help="Comma-separated: " + ", ".join(FLAG_SETS))
    parser.add_argument("--impls", default="local,full_iteration,transformer_engine",
                        help="Graphed implementations (transformer_engine is dropped where it does not import).")
    parser.add_argument("--steps", type=int, default=8, help="Training steps (diff's default).")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    args = parser.parse_args(argv)
    impls = runnable_impls(args.impls)
    work = Path(tempfile.mkdtemp(prefix="gd-cost-"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    results = []
    for size in args.sizes.split(","):
        bare = [bare_run(size, impl, 0.1, args.steps, work) for impl in ["eager", *impls]]
        bare_s = sum(b["process_s"] for b in bare)
        row: dict[str, Any] = {"size": size, "impls": impls, "bare": bare, "bare_s": round(bare_s, 2), "diffs": []}
        for name in args.flags.split(","):
            run = diff_run(size, FLAG_SETS[name], ",".join(impls), work, name)
            run["ratio"] = round(run["process_s"] / bare_s, 3) if bare_s else None
            row["diffs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k not in ("children", "stdout_tail")}), flush=True)
        results.append(row)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\nsize     bare s (eager+" + "+".join(impls) + ")  flags     diff s  ratio  before  after  verdicts")
    for row in results:
        for run in row["diffs"]:
            print(f"{row['size']:<8} {row['bare_s']:>8.1f} {'':>20} {run['flags']:<9} {run['process_s']:>6.1f} "
                  f"{run['ratio'] or 0:>6.2f} {run['before_first_child_s'] or 0:>6.1f} {run['after_last_child_s'] or 0:>6.1f}"
                  f"  {run['verdicts']}")
    print("\nchild seconds (start at, wall = startup + setup + train + observers + compare + teardown):")
    for row in results:
        print(f"  {row['size']} bare: " + ", ".join(
            f"{b['impl']} {b['process_s']:.1f} (startup {b.get('startup_s', 0):.1f}, setup {b.get('setup_s', 0):.1f}, "
            f"train {b.get('train_s', 0):.1f})" for b in row["bare"]))
        for run in row["diffs"]:
            print(f"  {row['size']} {run['flags']}:")
            for c in run["children"]:
                print(f"    {c['name']:<36} at {c.get('start_at_s') or 0:>5.1f} wall {c['wall_s']:>5.1f} = "
                      f"{c.get('startup_s', 0):.1f} + {c.get('setup_s', 0):.1f} + {c.get('train_s', 0):.1f} + "
                      f"{c.get('observers_s', 0):.1f} {c.get('observers', {})} + {c.get('compare_s', 0):.1f} + "
                      f"{c.get('teardown_s', 0):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
