"""The FP8 table of issue 35 on one GPU: `graphdoctor diff` for every FP8 recipe on the default model (TE spec,
bf16) and on the shrunk Llama-3 8B FP8 example line (also saved after step 4 and resumed in a fresh process that loads
the checkpoint into FP8 primary weights), each implementation's verdict, first difference, FP8 state comparison and
eager and graphed step times, side by side in one run; plus the planted GD521 fixture.

    python tests/benchmarks/fp8_table.py --out DIR [--only default,llama,planted] [--recipes delayed,...]

Writes DIR/<case>.json (the diff reports) and DIR/table.md; prints the table last. Not a test: no timing is
asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = ["--layer-spec", "te", "--dtype", "bf16", "--dropout", "0", "--steps", "8", "--no-memory"]
LLAMA = ["--megatron-args", "@fixtures/megatron_lines/llama3_8b.txt --no-gradient-accumulation-fusion "
         "--ffn-hidden-size 896 --num-query-groups 2 --kv-channels 32 --eval-interval 0",
         "--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "256",
         "--vocab-size", "1024", "--nproc-per-node", "1", "--num-microbatches", "2", "--steps", "8", "--no-memory"]
RECIPES = {"delayed-hybrid": ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"],
           "delayed-e4m3": ["--fp8-format", "e4m3", "--fp8-recipe", "delayed"],
           "tensorwise": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
           "blockwise": ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
           "mxfp8": ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]}
IMPLS = "local,full_iteration,transformer_engine"


def cases(only: set[str], recipes: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    if "default" in only:
        out += [(f"default-{r}", [*DEFAULT, *RECIPES[r], "--impl", IMPLS]) for r in recipes]
        out.append(("default-delayed-hybrid-attn", [*DEFAULT, *RECIPES["delayed-hybrid"], "--impl",
                                                    "transformer_engine", "--cuda-graph-modules", "attn"]))
    if "llama" in only:
        out.append(("llama-line", [*LLAMA, "--impl", IMPLS]))
        out.append(("llama-line-resume", [*LLAMA, "--impl", IMPLS, "--save-at", "4", "--resume"]))
    if "planted" in only:
        out.append(("planted-gd521", [*DEFAULT, *RECIPES["delayed-hybrid"], "--impl", "local,transformer_engine",
                                      "--forward-step", "fixtures.planted.fp8_scale_reset:forward_step"]))
    return out


def fmt(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def row_lines(case: str, report: dict) -> list[str]:
    lines = []
    for row in report.get("impls", []):
        div = row.get("first_divergence") or {}
        first = f"step {div['step']} {div['what']} {div.get('tensor') or ''}".strip() if div else "-"
        timing = row.get("timing") or {}
        eager = (timing.get("eager") or {}).get("median_ms")
        graphed = (timing.get("graphed") or {}).get("median_ms")
        state = row.get("fp8_state")
        fp8 = "-" if not state else ("equal" if state["first_step"] is None else
                                     f"step {state['first_step']} {state['first_tensor']}")
        causes = ",".join(sorted({c["rule"] for c in row.get("causes", [])})) or "-"
        why = (row.get("diagnosis") or {}).get("message", "")[:70] if row["verdict"] != "match" else ""
        lines.append(f"| {case} | {row['impl']} | {row['verdict']} | {first} | {fp8} | {causes} | {fmt(eager)} | "
                     f"{fmt(graphed)} | {why} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run every case; 0 when each wrote its report (whatever its verdict), 1 when any did not."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="default,llama,planted")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--timeout", type=float, default=200.0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| case | impl | verdict | first difference | FP8 state | causes | eager ms | graphed ms | why |",
             "|---|---|---|---|---|---|---|---|---|"]
    missing: list[str] = []
    for case, flags in cases(set(args.only.split(",")), args.recipes.split(",")):
        path = out / f"{case}.json"
        began = time.time()
        try:
            done = subprocess.run([sys.executable, "-m", "graphdoctor", "diff", *flags, "--json", str(path), "-q"],
                                  capture_output=True, text=True, timeout=args.timeout)
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
            code = done.returncode
        except subprocess.TimeoutExpired:
            code, tail = 124, ["timeout"]
        (out / f"{case}.txt").write_text(f"exit {code} in {time.time() - began:.0f} s\n{tail[0]}\n")
        if path.exists():
            lines += row_lines(case, json.loads(path.read_text()))
        else:
            missing.append(case)
            lines.append(f"| {case} | - | exit {code} | {tail[0][:120]} | | | | | |")
        print(f"{case}: exit {code} in {time.time() - began:.0f} s", flush=True)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if missing:
        print(f"fp8_table: no report from {', '.join(missing)} (a diff that crashed, timed out or refused)",
              file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
