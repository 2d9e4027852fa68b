"""Benchmark: `graphdoctor diff` at the scale of real models against the same child runs without
comparison, side by side in one invocation (issue 13).

Per size it runs, on the GPU:
1. the children of a diff (eager, then every implementation) WITHOUT comparison: same processes,
   model build, steps, observers and scheduling (`--jobs`), but no fingerprints and no re-runs;
2. `graphdoctor diff` itself (the library call, as the CLI makes it).
and prints: parameters, both wall times and their ratio, bytes written to disk (the work directory
and the reference-tensor scratch), and the extra GPU memory of comparison (peak allocated of each
diff child minus that of the same child without comparison, and the fingerprints' planned bytes),
against the parameter bytes. Targets: ratio <= 1.3, disk <= 50 MB per run, extra GPU <= 2 % of the
parameter bytes.

    python tests/benchmarks/diff_scale.py --help
    python tests/benchmarks/diff_scale.py --sizes default,0.5b,1.3b --out results.json
    python tests/benchmarks/diff_scale.py --sizes schedule --out schedule.json   # issue 20's schedule
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    "default": {},
    "0.5b": {"num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
             "dtype": "bf16", "vocab_size": 32000},
    "1.3b": {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
             "dtype": "bf16", "vocab_size": 32000},
    # issue 20: the clean schedule (evaluation, micro-batches, a checkpoint and a resumed process) at the
    # default size; both sides run the same schedule, the plain one without comparison.
    "schedule": {"eval_interval": 3, "eval_iters": 2, "save_at": 4, "resume": True, "num_microbatches": 4},
}


def tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def run_size(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from graphdoctor.config import DiffConfig
    from graphdoctor.diff import diff
    from graphdoctor.parent.children import ChildRequest, ChildSession
    from graphdoctor.parent.gpus import plan_jobs
    from graphdoctor.protocol.spec import EAGER, Role

    config = DiffConfig(impls=tuple(args.impls.split(",")), steps=args.steps, dropout=0.0,
                        jobs=args.jobs, timeout_s=args.timeout, **SIZES[name])
    plan = plan_jobs(config)
    work = Path(tempfile.mkdtemp(prefix=f"gd-scale-{name}-"))
    scratch = work / "scratch"
    scratch.mkdir()
    session = ChildSession(config, work / "plain", plan=plan)
    (work / "plain").mkdir()
    requests = [ChildRequest(EAGER, 0.0, Role.REFERENCE, scratch, fingerprints=False)] + [
        ChildRequest(impl, 0.0, Role.GRAPHED, scratch, fingerprints=False) for impl in config.impls]
    start = time.perf_counter()
    plain = session.run_many(requests)
    plain_wall = time.perf_counter() - start
    start = time.perf_counter()
    report = diff(config, workdir=work / "diff")
    diff_wall = time.perf_counter() - start
    diff_runs = {report.reference.impl: report.reference}
    for result in report.results:
        if result.runs:
            diff_runs[result.impl] = result.runs[0]
    rows = []
    for base in plain:
        mine = diff_runs.get(base.impl)
        extra = None
        if mine is not None and mine.peak_allocated_bytes is not None and base.peak_allocated_bytes is not None:
            extra = mine.peak_allocated_bytes - base.peak_allocated_bytes
        rows.append({"impl": base.impl, "status_plain": base.status, "status_diff": mine.status if mine else None,
                     "peak_plain_bytes": base.peak_allocated_bytes,
                     "peak_diff_bytes": mine.peak_allocated_bytes if mine else None,
                     "extra_peak_bytes": extra, "fingerprint_bytes": mine.fingerprint_bytes if mine else None})
    param_bytes = report.reference.parameter_bytes or max((r.parameter_bytes for r in plain), default=0)
    disk = tree_bytes(work / "diff") + report.scratch_bytes
    num_runs = len(list((work / "diff").glob("spec-*.json")))
    worst_extra = max([max(r["extra_peak_bytes"] or 0, r["fingerprint_bytes"] or 0) for r in rows], default=0)
    out = {
        "size": name, "num_parameters": report.reference.num_parameters, "parameter_bytes": param_bytes,
        "jobs": plan.reason, "plain_wall_s": round(plain_wall, 2), "diff_wall_s": round(diff_wall, 2),
        "ratio": round(diff_wall / plain_wall, 3) if plain_wall else None,
        "disk_bytes": disk, "num_runs": num_runs, "disk_bytes_per_run": disk // max(1, num_runs),
        "scratch_bytes": report.scratch_bytes,
        "extra_gpu_bytes": worst_extra,
        "extra_gpu_pct_of_params": round(100 * worst_extra / param_bytes, 3) if param_bytes else None,
        "verdicts": {r.impl: r.verdict.value for r in report.results},
        "speedups": {r.impl: (round(r.timing.speedup, 3) if r.timing and r.timing.speedup else None,
                              [round(x, 3) for x in r.timing.speedup_range] if r.timing and r.timing.speedup_range
                              else None) for r in report.results},
        "children": rows,
    }
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="default,0.5b,1.3b", help="Comma-separated: default, 0.5b, 1.3b, schedule.")
    parser.add_argument("--impls", default="local,full_iteration", help="Graphed implementations.")
    parser.add_argument("--steps", type=int, default=8, help="Training steps per run.")
    parser.add_argument("--jobs", type=int, default=0, help="Children at a time (0: decide).")
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds per child.")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    args = parser.parse_args(argv)
    results = []
    for name in args.sizes.split(","):
        result = run_size(name.strip(), args)
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "children"}), flush=True)
        if args.out:  # after every size: a run stopped by a time limit keeps the sizes it finished
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print("\nsize     params     plain s  diff s  ratio  disk MB  extra GPU  % of params  verdicts")
    for r in results:
        print(f"{r['size']:<8} {r['num_parameters'] / 1e9:>6.3f} B  {r['plain_wall_s']:>7.1f} {r['diff_wall_s']:>7.1f} "
              f"{r['ratio']:>6.2f} {r['disk_bytes'] / 1e6:>8.2f} {r['extra_gpu_bytes'] / 2**20:>7.1f} MiB "
              f"{r['extra_gpu_pct_of_params']:>10} %  {r['verdicts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
