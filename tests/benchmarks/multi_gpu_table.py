"""Multi-GPU table (issue 14, docs/multi-gpu.md): configuration x implementation -> verdict, eager and
graphed steady-state step time (median of the steady-state steps, with min-max), speedup, from one
`graphdoctor diff` per configuration on N GPUs of one host (each child's ranks under torch.distributed.run).

Configurations (4 layers, hidden 256, seq 128, 6 steps, dropout 0 unless named): tp2 (local and
full_iteration), tp2_dropout0.1, tp2_sp (sequence parallel with the TE layer spec, local and
transformer_engine: needs Transformer Engine), dp2_distopt_overlap (distributed optimizer and
overlap_grad_reduce, local), pp2 (2 microbatches, each its own mask, local), and pp2_shared_mask (one mask
object for every microbatch: fails in Megatron's graph creation). Each configuration is one
`python -m graphdoctor.cli diff --json` process; its JSON and table.json are written under --out as
configurations finish. --from-reports DIR reads the reports tests/gpu/test_multi_gpu.py kept
(GD_REPORT_DIR) instead of running anything, so the table costs no extra GPU time. Needs 2 GPUs to run.

    python tests/benchmarks/multi_gpu_table.py --help
    python tests/benchmarks/multi_gpu_table.py --out /tmp/mgpu-table [--configs tp2,pp2]
    python tests/benchmarks/multi_gpu_table.py --out /tmp/mgpu-table --from-reports $OUT/reports
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from graphdoctor.report.table import markdown_table

REPO = Path(__file__).resolve().parents[2]
MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
         "--vocab-size", "1024", "--steps", "6"]
CONFIGS: dict[str, list[str]] = {
    "tp2": ["--impl", "local,full_iteration", "--dropout", "0", "--nproc-per-node", "2",
            "--tensor-model-parallel-size", "2"],
    "tp2_dropout0.1": ["--impl", "local,full_iteration", "--dropout", "0.1", "--no-localize", "--no-launches",
                       "--nproc-per-node", "2", "--tensor-model-parallel-size", "2"],
    "tp2_sp": ["--impl", "local,transformer_engine", "--layer-spec", "te", "--dropout", "0", "--no-launches",
               "--nproc-per-node", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"],
    "dp2_distopt_overlap": ["--impl", "local", "--dropout", "0", "--no-launches", "--nproc-per-node", "2",
                            "--use-distributed-optimizer", "--overlap-grad-reduce"],
    "pp2": ["--impl", "local", "--dropout", "0", "--no-launches", "--nproc-per-node", "2",
            "--pipeline-model-parallel-size", "2", "--num-microbatches", "2"],
    "pp2_shared_mask": ["--impl", "local", "--dropout", "0", "--no-launches", "--nproc-per-node", "2",
                        "--pipeline-model-parallel-size", "2", "--num-microbatches", "2",
                        "--forward-step", "fixtures.planted.shared_mask_forward:forward_step"],
}
REPORT_NAMES = {"tp2": "tp2_dropout0", "tp2_dropout0.1": "tp2_dropout0.1", "tp2_sp": "tp2_sp_te_dropout0",
                "dp2_distopt_overlap": "dp2_distopt_overlap_dropout0", "pp2": "pp2_dropout0",
                "pp2_shared_mask": "pp2_shared_mask_dropout0"}
"""Configuration -> the name tests/gpu/test_multi_gpu.py keeps its report under (multi_gpu_<name>.json)."""
COLUMNS = ("config", "impl", "verdict", "control", "first divergence", "eager ms", "graphed ms", "speedup",
           "wall s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, metavar="DIR", help="Directory for the reports and table.json.")
    parser.add_argument("--configs", default=",".join(CONFIGS), metavar="LIST",
                        help=f"Comma-separated configurations. Default: {','.join(CONFIGS)}.")
    parser.add_argument("--timeout", type=float, default=240.0, metavar="SECONDS",
                        help="graphdoctor diff --timeout: the limit of each child run. Default: 240.")
    parser.add_argument("--row-timeout", type=float, default=560.0, metavar="SECONDS",
                        help="Wall limit of one diff process. Default: 560.")
    parser.add_argument("--from-reports", default=None, metavar="DIR",
                        help="Read multi_gpu_<name>.json reports kept by tests/gpu/test_multi_gpu.py "
                             "(GD_REPORT_DIR) instead of running. Default: run.")
    return parser.parse_args(argv)


def spread(times: dict[str, Any] | None) -> str | None:
    """`12.34 (12.10-12.60)`: the median of the steady-state steps with their min and max."""
    if not times:
        return None
    return f"{times['median_ms']:.2f} ({times['min_ms']:.2f}-{times['max_ms']:.2f})"


def rows_of(config: str, report: dict[str, Any], wall_s: float | None) -> list[dict[str, Any]]:
    """One row per implementation of a diff JSON report."""
    rows = []
    for result in report["impls"]:
        timing = result.get("timing") or {}
        first = result.get("first_divergence") or {}
        speedup = timing.get("speedup")
        rows.append({
            "config": config, "impl": result["impl"], "verdict": result["verdict"],
            "control": (result.get("control") or {}).get("verdict"),
            "first divergence": f"step {first['step']} {first.get('tensor') or first.get('what')}" if first else None,
            "eager ms": spread(timing.get("eager")), "graphed ms": spread(timing.get("graphed")),
            "speedup": None if speedup is None else
            f"{speedup:.2f}x ({timing.get('speedup_min') or 0:.2f}-{timing.get('speedup_max') or 0:.2f})",
            "wall s": None if wall_s is None else round(wall_s, 1)})
    return rows


def run_config(config: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """One `graphdoctor diff` process; its rows (or one row saying why there is no report)."""
    json_path = out / f"{config}.json"
    cmd = [sys.executable, "-m", "graphdoctor.cli", "diff", *MODEL, *CONFIGS[config], "--timeout",
           str(args.timeout), "--json", str(json_path), "--quiet"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.row_timeout, check=False)
    except subprocess.TimeoutExpired:
        return [{"config": config, "verdict": "row-timeout", "wall s": round(time.perf_counter() - start, 1)}]
    (out / f"{config}.txt").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if not json_path.is_file():
        return [{"config": config, "verdict": f"no report (exit {proc.returncode})",
                 "wall s": round(time.perf_counter() - start, 1)}]
    return rows_of(config, json.loads(json_path.read_text(encoding="utf-8")), time.perf_counter() - start)


def read_config(config: str, folder: Path) -> list[dict[str, Any]]:
    """The rows of a report a GPU test kept."""
    path = folder / f"multi_gpu_{REPORT_NAMES[config]}.json"
    if not path.is_file():
        return [{"config": config, "verdict": f"no report ({path.name})"}]
    report = json.loads(path.read_text(encoding="utf-8"))
    return rows_of(config, report.get("result", report), report.get("result", report).get("wall_s"))


def render(rows: list[dict[str, Any]]) -> str:
    """A Markdown table (docs/multi-gpu.md)."""
    return markdown_table(rows, COLUMNS)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        print(f"multi_gpu_table: unknown configuration {unknown[0]!r}, expected one of {', '.join(CONFIGS)}",
              file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    for config in configs:
        if args.from_reports:
            rows += read_config(config, Path(args.from_reports))
        else:
            rows += run_config(config, args, out)
        (out / "table.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        print(render(rows[-1:]).splitlines()[-1], flush=True)
    table = render(rows)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
