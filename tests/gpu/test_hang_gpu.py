"""Hangs and exits on two GPUs, each through the `graphdoctor diff` CLI with its report kept under GD_REPORT_DIR:
the planted rank-dependent collective is `hang` (or `timeout`) with both ranks' stacks, phases and last steps,
inside the timeout + 30 s; a graph kept past training is a `teardown-hang`; TP = 2 with evaluation exits
cleanly; and no process of any run is left (`ps`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu(2)]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
SMALL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2", "--dropout", "0"]


def run_diff(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`graphdoctor diff --nproc-per-node 2 SMALL ARGS` with its JSON report (kept as NAME.json under
    GD_REPORT_DIR when set); asserts afterwards that no process of the run is left."""
    workdir, out = tmp_path / "work", tmp_path / "report.json"
    argv = [sys.executable, "-m", "graphdoctor.cli", "diff", "--nproc-per-node", "2", *SMALL, *args,
            "--timeout", str(TIMEOUT_S), "--json", str(out), "--workdir", str(workdir), "-q"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=4 * (TIMEOUT_S + 30), check=False)
    if os.environ.get("GD_REPORT_DIR") and out.exists():
        shutil.copy(out, Path(os.environ["GD_REPORT_DIR"]) / f"{name}.json")
        (Path(os.environ["GD_REPORT_DIR"]) / f"{name}.txt").write_text(proc.stdout, encoding="utf-8")
    # Nothing of the run is left: no process has one of its spec files on its command line.
    ps = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    specs = [str(p) for p in workdir.glob("spec-*.json")]
    assert specs
    left = [line for line in ps.splitlines() if any(spec in line for spec in specs)]
    assert not left, left
    assert out.exists(), (proc.returncode, proc.stderr[-3000:])
    return proc, json.loads(out.read_text(encoding="utf-8"))


def test_rank0_only_all_reduce_in_the_graph_is_a_hang_with_both_ranks_stacks(tmp_path: Path) -> None:
    proc, doc = run_diff(tmp_path, "hang_rank0_allreduce", "--impl", "local",
                         "--layer-spec", "fixtures.planted.rank0_allreduce:layer_spec")
    assert proc.returncode == 1, proc.stderr[-3000:]
    (impl,) = doc["impls"]
    assert impl["verdict"] in ("hang", "timeout"), impl
    graphed = impl["runs"][0]
    assert graphed["wall_s"] < TIMEOUT_S + 30
    diag = impl["diagnosis"]
    stacks = {s["label"]: s for s in diag["stacks"]}
    for rank in ("rank0", "rank1"):
        assert stacks[rank]["frames"], stacks[rank]
        assert stacks[rank]["phase"] in ("warmup", "capture", "replay"), stacks[rank]
    if impl["verdict"] == "hang":
        assert any(stacks[r]["waiting_in"] for r in ("rank0", "rank1"))
    assert "no process left" in diag["message"]
    assert "rank0 (" in proc.stdout and "rank1 (" in proc.stdout


def test_graph_kept_past_training_is_a_teardown_hang_with_both_ranks_stacks(tmp_path: Path) -> None:
    """fixtures/planted/teardown_live_graph.py: the run matches eager, but a graph kept outside Megatron
    holds NCCL at destroy_process_group: teardown-hang on the graphed run's ranks with their stacks,
    graphs_alive >= 1, exit 1, inside the teardown bound, nothing left; the eager reference and a clean
    TP=2 exit are covered by test_multi_gpu.py (its runs release Megatron's graphs and exit cleanly)."""
    proc, doc = run_diff(tmp_path, "teardown_live_graph", "--impl", "local",
                         "--layer-spec", "fixtures.planted.teardown_live_graph:layer_spec")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not any(e["hung"] for e in doc["reference"]["teardown"]), doc["reference"]["teardown"]
    (impl,) = doc["impls"]
    assert impl["verdict"] == "match", impl["verdict"]
    exits = impl["runs"][0]["teardown"]
    hung = [e for e in exits if e["hung"]]
    assert hung, exits
    assert all(e["graphs_alive"] >= 1 for e in exits), exits
    assert all(e["stack"] and e["stack"]["frames"] for e in hung if e["teardown_s"] >= 0), hung
    assert all(e["teardown_s"] <= 30 for e in hung), hung
    assert "GD516 teardown-hang: phase exit: rank 0 (in destroy_process_group" in proc.stdout, proc.stdout
    assert "still alive at destroy_process_group" in proc.stdout


def test_tensor_parallel_with_evaluation_exits_cleanly(tmp_path: Path) -> None:
    """Issue 20 on two GPUs: TP = 2, evaluation every 2 steps and a final one, local and full_iteration:
    both match, every rank released Megatron's graphs and exited within the bound, exit 0 (Megatron-Bridge#2955:
    hangs after the final validation with TP > 1 and graphs)."""
    proc, doc = run_diff(tmp_path, "tp2_eval_exit", "--tensor-model-parallel-size", "2", "--impl",
                         "local,full_iteration", "--eval-interval", "2", "--eval-iters", "1")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])
    for impl in doc["impls"]:
        assert impl["verdict"] == "match", impl["verdict"]
        graphed = impl["runs"][0]
        assert len(graphed["evals"]) >= 3, graphed["evals"]  # after steps 1, 3, 5 and the final one
        exits = graphed["teardown"]
        assert len(exits) == 2 and not any(e["hung"] for e in exits), exits
        assert all(e["graphs_released"] >= 1 and e["graphs_alive"] == 0 for e in exits), exits
    assert not any(e["hung"] for e in doc["reference"]["teardown"])
