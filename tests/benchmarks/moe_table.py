"""MoE table (issue 15, docs/moe.md): MoE configuration x graph implementation x scope -> verdict,
diagnosis (rule, Megatron file:line), eager and graphed step time, from one `graphdoctor diff` per row.

Configurations: the run files fixtures/runfiles/moe_{dropless_allgather,dropless_alltoall,drop_pad}.yaml
(2 layers, hidden 256, 4 experts top-2, seq 128, 6 steps, aux loss and z-loss, dropout 0). Scopes:
`local` whole layer, `local` attn, `transformer_engine` attn,moe_router,moe_preprocess (skipped with a
note when Transformer Engine does not import). Each row is a `python -m graphdoctor.cli diff` process
with --timeout per child and a wall limit of its own; --parallel rows run at once (their children share
the GPU, so step times are indicative: rerun a row with --parallel 1 for clean ones). The JSON of every
row and table.json are written under --out as rows finish. Needs a CUDA GPU.

    python tests/benchmarks/moe_table.py --help
    python tests/benchmarks/moe_table.py --out /tmp/moe-table [--parallel 5] [--layer-spec te]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from graphdoctor.report.table import markdown_table

REPO = Path(__file__).resolve().parents[2]
RUNFILES = REPO / "fixtures" / "runfiles"
CONFIGS = ("dropless_allgather", "dropless_alltoall", "drop_pad")
SCOPES: dict[str, tuple[str, str]] = {
    "local-whole": ("local", ""),
    "local-attn": ("local", "attn"),
    "te-attn-router-preprocess": ("transformer_engine", "attn,moe_router,moe_preprocess"),
}
COLUMNS = ("config", "impl", "scope", "predicted", "verdict", "rule", "location", "eager_ms", "graphed_ms", "wall_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, metavar="DIR", help="Directory for row JSON and table.json.")
    parser.add_argument("--configs", default=",".join(CONFIGS), metavar="LIST",
                        help=f"Comma-separated configurations. Default: {','.join(CONFIGS)}.")
    parser.add_argument("--scopes", default=",".join(SCOPES), metavar="LIST",
                        help=f"Comma-separated scopes. Default: {','.join(SCOPES)}.")
    parser.add_argument("--layer-spec", default="local", choices=("local", "te"),
                        help="Megatron layer spec; te also sets moe_grouped_gemm (TEGroupedMLP). Default: local.")
    parser.add_argument("--timeout", type=float, default=240.0, metavar="SECONDS",
                        help="graphdoctor diff --timeout: the limit of each child run. Default: 240.")
    parser.add_argument("--row-timeout", type=float, default=560.0, metavar="SECONDS",
                        help="Wall limit of one diff process (children, re-runs, culprit hunt). Default: 560.")
    parser.add_argument("--parallel", type=int, default=5, metavar="N", help="Rows at a time. Default: 5.")
    parser.add_argument("--steps", type=int, default=6, metavar="N", help="Training steps. Default: 6.")
    return parser.parse_args(argv)


def te_importable() -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-c", "import transformer_engine.pytorch"], capture_output=True,
                          text=True, timeout=120, check=False)
    return proc.returncode == 0, (proc.stderr.strip().splitlines() or [""])[-1][:200]


def run_file_for(config: str, layer_spec: str, out: Path) -> Path:
    """The configuration's run file; for the TE spec a copy under --out with moe_grouped_gemm on."""
    source = RUNFILES / f"moe_{config}.yaml"
    if layer_spec == "local":
        return source
    target = out / "runfiles" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    text = source.read_text(encoding="utf-8").replace("transformer:\n", "transformer:\n  moe_grouped_gemm: true\n", 1)
    target.write_text(text, encoding="utf-8")
    return target


def predicted(run_file: Path, impl: str, modules: str) -> str:
    """The static MoE findings graphdoctor check gives this row before any GPU work."""
    from graphdoctor.config import diff_config_from, load_run_file
    from graphdoctor.parent.static import moe_static_findings

    config = diff_config_from(load_run_file(run_file), impls=impl, cuda_graph_modules=modules)
    codes = sorted({f.code for f in moe_static_findings(config, impl)})
    return ",".join(codes) or "clean"


def run_row(config: str, scope: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    impl, modules = SCOPES[scope]
    run_file = run_file_for(config, args.layer_spec, out)
    row: dict[str, Any] = {"config": config, "impl": impl, "scope": modules or "whole layer",
                           "layer_spec": args.layer_spec, "predicted": predicted(run_file, impl, modules)}
    json_path = out / f"{config}__{scope}__{args.layer_spec}.json"
    cmd = [sys.executable, "-m", "graphdoctor.cli", "diff", "--config", str(run_file), "--impl", impl,
           "--cuda-graph-modules", modules, "--dropout", "0", "--steps", str(args.steps), "--layer-spec",
           args.layer_spec, "--timeout", str(args.timeout), "--json", str(json_path), "--quiet"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.row_timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**row, "verdict": "row-timeout", "wall_s": round(time.perf_counter() - start, 1)}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    row["exit_code"] = proc.returncode
    if not json_path.is_file():
        return {**row, "verdict": f"no report (exit {proc.returncode})", "stderr": proc.stderr[-2000:]}
    return {**row, **summarize(json.loads(json_path.read_text(encoding="utf-8")))}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Verdict, diagnosis and step times of the single implementation of a diff JSON report."""
    (result,) = report["impls"]
    diag = result.get("diagnosis") or {}
    timing = result.get("timing") or {}
    return {"verdict": result["verdict"], "rule": diag.get("rule"), "location": diag.get("location"),
            "message": diag.get("message"), "fix": diag.get("fix"), "eager_ms": timing.get("eager_ms"),
            "graphed_ms": timing.get("graphed_ms"), "notes": result.get("notes", []),
            "reference": report["reference"]["status"]}


def render(rows: list[dict[str, Any]]) -> str:
    """A Markdown table (docs/moe.md)."""
    return markdown_table(rows, COLUMNS)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [c for c in args.configs.split(",") if c]
    scopes = [s for s in args.scopes.split(",") if s]
    for name in (*configs, *scopes):
        if name not in (*CONFIGS, *SCOPES):
            print(f"moe_table: unknown configuration or scope {name!r}", file=sys.stderr)
            return 2
    have_te, why = te_importable()
    rows: list[dict[str, Any]] = []
    work = []
    for config in configs:
        for scope in scopes:
            if (SCOPES[scope][0] == "transformer_engine" or args.layer_spec == "te") and not have_te:
                rows.append({"config": config, "impl": SCOPES[scope][0], "scope": SCOPES[scope][1] or "whole layer",
                             "verdict": "skipped", "note": f"transformer_engine does not import ({why})"})
            else:
                work.append((config, scope))
    table = out / "table.json"
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = [pool.submit(run_row, config, scope, args, out) for config, scope in work]
        for future in as_completed(futures):
            rows.append(future.result())
            print(f"done: {rows[-1]['config']} {rows[-1]['impl']} {rows[-1]['scope']} -> {rows[-1]['verdict']}",
                  file=sys.stderr, flush=True)
            table.write_text(json.dumps({"rows": rows}, indent=2), encoding="utf-8")
    order = {(c, s): i for i, (c, s) in enumerate((c, s) for c in CONFIGS for s in SCOPES)}
    key = {v: k for k, v in SCOPES.items()}
    rows.sort(key=lambda r: order.get((r["config"], key.get((r["impl"], "" if r["scope"] == "whole layer"
                                                                 else r["scope"]), "")), 99))
    table.write_text(json.dumps({"rows": rows}, indent=2), encoding="utf-8")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
