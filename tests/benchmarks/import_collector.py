"""Benchmark: what the garbage collector costs a process that imports torch and Megatron, and what
graphdoctor.collector.imports_frozen saves, side by side in one run.

Three kinds of fresh interpreter, started one after another in alternating rounds (so drift on a shared machine
falls on all three alike), each timed from its start to the end of its imports:
- `bare`: what tests/benchmarks/bare_megatron.py imports before it builds anything (a user's training process);
- `preload, collector on`: the child template's imports (graphdoctor.child.entry.PRELOADED) as plain imports;
- `preload, frozen`: the same imports as the template makes them (graphdoctor.child.entry.preload).
Each prints its import seconds and the collections it made (counted with gc.callbacks). The summary gives the
median of each and the ratios to `bare`.

    python tests/benchmarks/import_collector.py [--rounds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

WATCH = """
import gc, time
began = time.perf_counter()
passes = [0, 0, 0]
spent = [0.0]
mark = [0.0]
def watch(phase, info):
    if phase == "start":
        mark[0] = time.perf_counter()
    else:
        spent[0] += time.perf_counter() - mark[0]
        passes[info["generation"]] += 1
gc.callbacks.append(watch)
import warnings
warnings.simplefilter("ignore")
"""

REPORT = """
import json
print(json.dumps({"seconds": time.perf_counter() - began, "passes": passes, "gc_seconds": spent[0]}))
"""

BARE = """
import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.full_cuda_graph import FullCudaGraphWrapper, get_shared_capture_stream
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
from megatron.core.transformer.transformer_config import TransformerConfig
"""
"""tests/benchmarks/bare_megatron.py's imports before it builds anything."""

KINDS: dict[str, str] = {
    "bare": BARE,
    "preload, collector on": ("import importlib\nfrom graphdoctor.child.entry import PRELOADED\n"
                              "for name in PRELOADED:\n"
                              "    try:\n        importlib.import_module(name)\n"
                              "    except Exception:\n        pass\n"),
    "preload, frozen": "from graphdoctor.child.entry import preload\npreload()\n",
}


def one(kind: str) -> dict[str, Any]:
    """One fresh interpreter of `kind`: its import seconds and collections."""
    env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # as the template runs (no CUDA initialised)
    proc = subprocess.run([sys.executable, "-P", "-c", WATCH + KINDS[kind] + REPORT], capture_output=True, text=True,
                          timeout=600, check=True, env=env, cwd=HERE.parents[1])
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    one("bare")  # warm the file cache and the bytecode once, uncounted
    for _ in range(args.rounds):
        for kind in KINDS:
            runs[kind].append(one(kind))
    bare = statistics.median(r["seconds"] for r in runs["bare"])
    summary = {}
    for kind, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        summary[kind] = {"median_s": round(seconds, 3), "ratio_to_bare": round(seconds / bare, 3),
                         "gc_s": round(statistics.median(r["gc_seconds"] for r in results), 3),
                         "passes": results[len(results) // 2]["passes"]}
        print(f"{kind:24s} {seconds:6.2f} s  {seconds / bare:5.2f}x bare  collector "
              f"{summary[kind]['gc_s']:.2f} s, passes {summary[kind]['passes']}")
    if args.json:
        args.json.write_text(json.dumps({"python": sys.version.split()[0], "rounds": args.rounds, "summary": summary,
                                         "runs": runs}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
