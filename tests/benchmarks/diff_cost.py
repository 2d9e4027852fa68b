"""Benchmark: what `graphdoctor diff` costs against the bare Megatron-Core runs it stands for, side by side in
one invocation.

A user who checks graphs by hand runs eager training once and graphed training once per implementation. Per
size this runs, on the GPU:
1. tests/benchmarks/bare_megatron.py (no graphdoctor: the same model, DDP, optimizer, batches and steps as
   diff's children, its weights initialised on the GPU as Megatron's and diff's defaults do) once for eager and once per implementation, each its own process, one after another: the
   sum of the bare runs and the slowest of them;
2. the same bare processes all at once (the concurrency of diff's children): their wall, which is what a diff
   that runs its children side by side can at best cost;
3. `graphdoctor diff` as a user runs it (the CLI, its own process) with each flag set (the defaults, and
   `--dropout 0`), with --json: the diff seconds, from the command's start to its exit.
It prints each diff's ratio to the bare runs one after another, to the bare runs side by side and to the slowest
bare run, the parent's own seconds before its first child and after its last, whether the diff's children started
from equal weights (the gpu_init digests its report carries), and each first child (eager reference, graphed runs)
against its bare twin: start-up plus set-up, and training. Implementations the bare script cannot run
(transformer_engine) are left out of both sides, and a bare process that fails makes the size's row say so instead
of counting its seconds; bare processes that fail only side by side (too large to share the GPU) leave out the
side-by-side ratio.

    python tests/benchmarks/diff_cost.py --help
    python tests/benchmarks/diff_cost.py --sizes default,0.54b,1.08b --out cost.json
    python tests/benchmarks/diff_cost.py --sizes llama3-8b-2l,mixtral-8x7b-2l --flags dropout0,defaults --out cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

FULL_WIDTH: dict[str, Any] = {"num-layers": 2, "hidden-size": 4096, "num-attention-heads": 32, "seq-length": 4096,
                              "micro-batch-size": 1, "dtype": "bf16", "cuda-graph-warmup-steps": 2}
"""Two layers of a 7-8 B model at full width, in diff's own flags; warm-up 2 as at the other sizes (a launch line
alone would take Megatron-LM's 3)."""

LLAMA3_LINE = ("--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu --normalization RMSNorm "
               "--position-embedding-type rope --rotary-base 500000 --max-position-embeddings 4096 "
               "--untie-embeddings-and-output-weights --disable-bias-linear --transformer-impl local "
               "--no-masked-softmax-fusion --no-rope-fusion --no-gradient-accumulation-fusion --no-persist-layer-norm")
"""Llama-3 8B's layer as Megatron-LM flags (what diff's own flags cannot say: GQA 32/8, SwiGLU 14336, RMSNorm, RoPE
base 500000, untied embeddings, no linear bias), on Megatron's local layers; the four --no-* flags turn off fused
kernels that need Apex, Megatron-LM's compiled softmax or Transformer Engine (`graphdoctor diff --plan` refuses the
line without them where those are missing, and bare_megatron.py builds no more than the local layers)."""

MIXTRAL_LINE = (LLAMA3_LINE.replace("--rotary-base 500000", "--rotary-base 1000000")
                + " --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 14336 --moe-token-dispatcher-type alltoall"
                " --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.01 --moe-expert-capacity-factor 1.0"
                " --moe-pad-expert-input-to-capacity")
"""Mixtral 8x7B's layer: Llama-3's attention and norms, RoPE base 1e6, 8 experts of ffn 14336 routed top-2 with
Mixtral's aux loss (0.01), alltoall dispatch. Drop-and-pad (capacity factor 1.0, padded), not Mixtral's dropless
routing: dropless dispatch reads token counts on the host and fails capture under local and full_iteration (GD217,
docs/moe.md), so neither side could graph it; drop-and-pad keeps every weight and shape."""

SIZES: dict[str, dict[str, Any]] = {
    "default": {},
    "0.54b": {"num-layers": 8, "hidden-size": 2048, "num-attention-heads": 16, "seq-length": 2048,
              "micro-batch-size": 2, "dtype": "bf16", "vocab-size": 32000},
    "1.08b": {"num-layers": 4, "hidden-size": 4096, "num-attention-heads": 32, "seq-length": 4096,
              "micro-batch-size": 1, "dtype": "bf16", "vocab-size": 32000},
    "llama3-8b-2l": {**FULL_WIDTH, "vocab-size": 128256, "megatron-args": LLAMA3_LINE},
    "mixtral-8x7b-2l": {**FULL_WIDTH, "vocab-size": 32000, "megatron-args": MIXTRAL_LINE},
}
"""The sizes of issue 32 (h200-findings.md section 7) and the full-width two-layer Llama-3 8B (1.49 B parameters)
and Mixtral 8x7B (3.16 B) of issue 44, as flags both sides take: diff's own, and where those cannot say it a
Megatron-LM line (`--megatron-args`, which diff resolves with Megatron-LM's parser and bare_megatron.py reads
by hand)."""

CPU_INIT = str(Path(__file__).resolve().parents[2] / "fixtures" / "runfiles" / "cpu_init.yaml")
FLAG_SETS: dict[str, list[str]] = {"defaults": [], "dropout0": ["--dropout", "0"],
                                   "cpu_init": ["--config", CPU_INIT],
                                   "cpu_init_dropout0": ["--config", CPU_INIT, "--dropout", "0"]}

TIMEOUT_S = 900.0


def size_flags(size: str) -> list[str]:
    """The size's flags, one argument each (a launch line stays one): the same list for both sides."""
    return [part for key, value in SIZES[size].items() for part in (f"--{key}", str(value))]


def bare_argv(size: str, impl: str, dropout: float, steps: int, result: Path) -> list[str]:
    """The command of one bare process."""
    return [sys.executable, str(HERE / "bare_megatron.py"), "--impl", impl, "--steps", str(steps),
            "--dropout", str(dropout), "--json", str(result), *size_flags(size)]


def diff_argv(size: str, flags: list[str], impls: str, report_path: Path) -> list[str]:
    """The command of one `graphdoctor diff`."""
    return [sys.executable, "-m", "graphdoctor", "diff", "--impl", impls, "--json", str(report_path), "-q",
            *size_flags(size), *flags]


def bare_run(size: str, impl: str, dropout: float, steps: int, out: Path) -> dict[str, Any]:
    """One bare process; its own JSON plus the process wall seen from here."""
    result = out / f"bare-{size}-{impl}.json"
    argv = bare_argv(size, impl, dropout, steps, result)
    began = time.time()
    ended = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    wall = time.time() - began
    data: dict[str, Any] = json.loads(result.read_text()) if result.is_file() else {}
    data.update({"impl": impl, "process_s": round(wall, 2), "returncode": ended.returncode})
    if ended.returncode != 0:
        data["tail"] = (ended.stdout + ended.stderr)[-2000:]
    return data


def bare_together(size: str, impls: list[str], dropout: float, steps: int, out: Path) -> dict[str, Any]:
    """The bare processes of one size all at once: the wall until the last exits, and each one's record."""
    procs = []
    began = time.time()
    for impl in impls:
        result = out / f"bare-together-{size}-{impl}.json"
        argv = bare_argv(size, impl, dropout, steps, result)
        procs.append((impl, result, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    runs = []
    for impl, result, proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, TIMEOUT_S - (time.time() - began)))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        data: dict[str, Any] = json.loads(result.read_text()) if result.is_file() else {}
        data.update({"impl": impl, "returncode": proc.returncode})
        if proc.returncode != 0:
            data["tail"] = err.decode(errors="replace")[-2000:]
        runs.append(data)
    return {"wall_s": round(time.time() - began, 2), "runs": runs}


def twins(bare: list[dict[str, Any]], children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each first child of the diff (the eager reference, each graphed run) against the bare process of its
    implementation: start-up plus set-up and training seconds, and their ratios. Both start-ups count from the
    moment this benchmark started the process: the bare process's own, and for a child the diff's seconds before
    it asked for its first child plus the child's start-up (its wait for the template's imports). A wait for GPU
    memory or for an earlier child to end is not start-up."""
    parent_s = min((float(c["start_at_s"]) for c in children if c.get("start_at_s") is not None), default=0.0)
    out = []
    for twin in bare:
        name = "eager-reference-" if twin["impl"] == "eager" else f"{twin['impl']}-graphed-"
        child = next((c for c in children if str(c.get("name", "")).startswith(name)), None)
        if child is None or twin.get("returncode") != 0:
            continue
        bare_setup = float(twin.get("startup_s", 0.0)) + float(twin.get("setup_s", 0.0))
        child_setup = parent_s + float(child.get("startup_s", 0.0)) + float(child.get("setup_s", 0.0))
        bare_train, child_train = float(twin.get("train_s", 0.0)), float(child.get("train_s", 0.0))
        out.append({"impl": twin["impl"], "child": child["name"], "bare_setup_s": round(bare_setup, 2),
                    "child_setup_s": round(child_setup, 2),
                    "setup_ratio": round(child_setup / bare_setup, 3) if bare_setup else None,
                    "bare_train_s": round(bare_train, 2), "child_train_s": round(child_train, 2),
                    "train_ratio": round(child_train / bare_train, 3) if bare_train else None})
    return out


def diff_run(size: str, flags: list[str], impls: str, out: Path, name: str) -> dict[str, Any]:
    """`graphdoctor diff` as its own process; the report plus the seconds seen from here."""
    report_path = out / f"diff-{size}-{name}.json"
    argv = diff_argv(size, flags, impls, report_path)
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
        "template_after_s": timeline.get("template_after_s"), "template_imports_s": timeline.get("template_imports_s"),
        "verdicts": {r["impl"]: r["verdict"] for r in report.get("impls", ())},
        "weights_equal": weights_equal(report),
        "weights_reported": sum(isinstance(r.get("weights"), dict) for r in runs),
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


def weights_equal(report: dict[str, Any]) -> bool | None:
    """Whether every child of the diff started from the same weights, as its report says: the digests of the
    children that initialised them on the GPU (the default, gpu_init: each run record's `weights.digest`,
    graphdoctor/protocol/record.py); None when no record carries one (CPU initialisation, or no report)."""
    digests = {str(run["weights"].get("digest")) for run in _runs(report) if isinstance(run.get("weights"), dict)}
    return len(digests) == 1 if digests else None


BARE_IMPLS = ("local", "full_iteration")
"""The graphed implementations bare_megatron.py runs (it refuses transformer_engine: exit 2)."""


def runnable_impls(requested: str) -> tuple[list[str], list[str]]:
    """(the implementations both sides run, those left out): what the bare script can run."""
    impls = [i for i in requested.split(",") if i]
    return [i for i in impls if i in BARE_IMPLS], [i for i in impls if i not in BARE_IMPLS]


def _figure(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    """The summary table: per size and flag set the bare seconds (one after another, side by side, the slowest),
    the diff's seconds and ratios (to the median bare run too: one bare process's start-up varies by seconds on
    the GPU machines, and a slow one flatters the ratio to the slowest), the parent's seconds before its first
    child and after its last, whether the children's weights were equal (`-`: no digests in the report), when
    the template was asked for and how long it took to be ready (`tmpl at`, `imports`: against a bare run's
    start-up) and the verdicts."""
    size_w = max([len("size"), *(len(row["size"]) for row in results)])
    flags_w = max([len("flags"), *(len(run["flags"]) for row in results for run in row["diffs"])])
    lines = [f"{'size':<{size_w}}  bare: sum  together  slowest  {'flags':<{flags_w}}  diff s   /sum  /together  "
             f"/slowest  /median  before  after  tmpl at  imports  weights  verdicts"]
    for row in results:
        for run in row["diffs"]:
            weights = {True: "equal", False: "DIFFER", None: "-"}[run.get("weights_equal")]
            lines.append(
                f"{row['size']:<{size_w}}  {_figure(row['bare_s'], 9, 1)} {_figure(row['bare_together_s'], 9, 1)} "
                f"{_figure(row['bare_slowest_s'], 8, 1)}  {run['flags']:<{flags_w}}  {_figure(run['process_s'], 6, 1)} "
                f"{_figure(run['ratio'], 6, 2)} {_figure(run['ratio_together'], 10, 2)} "
                f"{_figure(run['ratio_slowest'], 9, 2)} {_figure(run.get('ratio_median'), 8, 2)} "
                f"{_figure(run['before_first_child_s'] or 0, 7, 1)} "
                f"{_figure(run['after_last_child_s'] or 0, 6, 1)} {_figure(run.get('template_after_s'), 8, 1)} "
                f"{_figure(run.get('template_imports_s'), 8, 1)}  {weights:<7}  {run['verdicts']}")
    return lines


def warm_imports() -> float:
    """Import what a bare process and a diff import, once, in a process of its own, and return its seconds. On a
    machine just started, the first process to import torch and Megatron reads them from disk: that process would
    be the slowest bare run, and every ratio to it would flatter the diff."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, megatron.core, megatron.training, graphdoctor.child"],
                   check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="default,0.54b,1.08b", help="Comma-separated: " + ", ".join(SIZES))
    parser.add_argument("--flags", default="defaults,dropout0", help="Comma-separated: " + ", ".join(FLAG_SETS))
    parser.add_argument("--impls", default="local,full_iteration",
                        help="Graphed implementations; those bare_megatron.py cannot run are left out and said.")
    parser.add_argument("--steps", type=int, default=8, help="Training steps (diff's default).")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    args = parser.parse_args(argv)
    impls, left_out = runnable_impls(args.impls)
    if left_out:
        print(f"left out (bare_megatron.py cannot run them): {', '.join(left_out)}", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="gd-cost-"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    results: list[dict[str, Any]] = []
    failed = False

    def save(done: list[dict[str, Any]]) -> None:
        """The rows so far to --out, after each size (a later size that fails keeps the earlier ones)."""
        if args.out:
            Path(args.out).write_text(json.dumps(done, indent=2) + "\n", encoding="utf-8")

    warm_s = warm_imports()
    print(f"imports warmed in {warm_s:.1f} s (one process, before every measured one)", file=sys.stderr)
    for size in args.sizes.split(","):
        bare = [bare_run(size, impl, 0.1, args.steps, work) for impl in ["eager", *impls]]
        together = bare_together(size, ["eager", *impls], 0.1, args.steps, work)
        broken = [b["impl"] for b in bare if b["returncode"] != 0]
        crowded = [b["impl"] for b in together["runs"] if b["returncode"] != 0]
        row: dict[str, Any] = {"size": size, "impls": impls, "left_out": left_out, "bare": bare,
                               "bare_together": together, "bare_failed": broken, "bare_together_failed": crowded,
                               "diffs": []}
        if broken:  # a failed process's seconds are no bare run's: nothing to compare against
            print(f"{size}: bare processes failed: {', '.join(broken)}", file=sys.stderr)
            for run in bare:
                if run.get("returncode") != 0:
                    last = [line for line in str(run.get("tail", "")).splitlines() if line.strip()][-3:]
                    print(f"  {run['impl']} (exit {run.get('returncode')}): " + " | ".join(last), file=sys.stderr)
            failed = True
            results.append(row)
            save(results)
            continue
        if crowded:
            # Each ran alone, so the size runs; side by side they did not fit (at full width several processes
            # outgrow one GPU's memory, where diff runs its children one at a time): no side-by-side wall.
            print(f"{size}: bare processes failed side by side: {', '.join(crowded)}; no /together ratio",
                  file=sys.stderr)
        bare_s = sum(b["process_s"] for b in bare)
        slowest_s = max(b["process_s"] for b in bare)
        median_s = statistics.median(b["process_s"] for b in bare)  # beside the slowest: one slow start flatters
        together_s = None if crowded else together["wall_s"]
        row.update(bare_s=round(bare_s, 2), bare_slowest_s=round(slowest_s, 2), bare_median_s=round(median_s, 2),
                   bare_together_s=together_s)
        for name in args.flags.split(","):
            run = diff_run(size, FLAG_SETS[name], ",".join(impls), work, name)
            run["ratio"] = round(run["process_s"] / bare_s, 3)
            run["ratio_together"] = round(run["process_s"] / together_s, 3) if together_s else None
            run["ratio_slowest"] = round(run["process_s"] / slowest_s, 3)
            run["ratio_median"] = round(run["process_s"] / median_s, 3)
            run["twins"] = twins(bare, run["children"])
            row["diffs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k not in ("children", "stdout_tail")}), flush=True)
        results.append(row)
        save(results)
    print("\n" + "\n".join(summary_lines(results)))
    print("\neach first child against its bare twin (start-up + set-up, training):")
    for row in results:
        for run in row["diffs"]:
            for t in run["twins"]:
                print(f"  {row['size']} {run['flags']} {t['child']:<36} set-up {t['child_setup_s']:.1f} / "
                      f"{t['bare_setup_s']:.1f} s ({t['setup_ratio']}x), training {t['child_train_s']:.1f} / "
                      f"{t['bare_train_s']:.1f} s ({t['train_ratio']}x)")
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
