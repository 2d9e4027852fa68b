"""`graphdoctor diff --megatron-args @examples/megatron/pretrain_gpt_small.sh` on a real GPU, to a verdict: the
script's --eval-interval 1000 --eval-iters 10 give each run Megatron-LM's evaluation after the last step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
VERDICTS = {"match", "rng-divergence", "numeric-divergence", "frozen-rng", "capture-failed", "crashed", "timeout",
            "unavailable", "reference-failed"}


def test_diff_of_the_committed_launch_script_reaches_a_verdict(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "graphdoctor.cli", "diff", "--megatron-args",
         "@examples/megatron/pretrain_gpt_small.sh", "--json", str(report_path), "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert proc.stdout.count("launch line: flags that do not apply (") == 1, proc.stdout
    report = json.loads(report_path.read_text(encoding="utf-8"))
    config = report["config"]
    assert config["megatron_args"] == "@examples/megatron/pretrain_gpt_small.sh"
    assert (config["num_layers"], config["hidden_size"], config["seq_length"], config["dtype"]) == (4, 512, 256, "bf16")
    assert config["impls"] == ["local"] and config["num_microbatches"] == 2
    assert (config["eval_interval"], config["eval_iters"]) == (1000, 10)
    assert config["launch_notes"] and "--clip-grad" in config["launch_notes"][-1]
    (row,) = report["impls"]
    assert row["impl"] == "local" and row["verdict"] in VERDICTS, row
    assert row["verdict"] not in ("crashed", "timeout", "reference-failed"), row.get("diagnosis")
    # within diff's 8 steps, Megatron-LM's schedule evaluates once: after the last step, on both sides
    last = config["steps"] - 1
    assert [(e["after_step"], e["final"]) for e in report["reference"]["evals"]] == [(last, True)]
    graphed = row["runs"][0]
    assert [(e["after_step"], e["final"]) for e in graphed["evals"]] == [(last, True)]
    print(row["verdict"], [e["loss"] for e in report["reference"]["evals"]],  # noqa: T201 - the closing note
          [e["loss"] for e in graphed["evals"]])


LLAMA_LINE = ("--group-query-attention --num-query-groups 8 --ffn-hidden-size 3584 --swiglu --normalization RMSNorm "
              "--position-embedding-type rope --rotary-base 500000 --max-position-embeddings 4096 "
              "--untie-embeddings-and-output-weights --disable-bias-linear --transformer-impl local "
              "--no-masked-softmax-fusion --no-rope-fusion --no-gradient-accumulation-fusion --no-persist-layer-norm")
"""A Llama-3 layer at a quarter of its width: Megatron-LM's defaults keep bias-SwiGLU and bias-dropout-add fused,
which megatron.core.jit compiles with torch.compile."""


def test_launch_line_with_compiled_fusions_matches_eager_at_dropout_0(tmp_path: Path) -> None:
    """The graphed children capture the compiled fusions as the user's run does, though graphdoctor watches each
    capture through a dispatch mode (graphdoctor.child.watching_mode): bitwise equal to eager at dropout 0."""
    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "graphdoctor.cli", "diff", "--megatron-args", LLAMA_LINE, "--impl",
         "local,full_iteration", "--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "16",
         "--seq-length", "1024", "--micro-batch-size", "1", "--dtype", "bf16", "--vocab-size", "32000",
         "--dropout", "0", "--json", str(report_path), "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = json.loads(report_path.read_text(encoding="utf-8"))
    verdicts = {row["impl"]: row["verdict"] for row in report["impls"]}
    assert verdicts == {"local": "match", "full_iteration": "match"}, proc.stdout
    assert proc.returncode == 0
    assert "holders" in {o["name"] for o in report["observers"]}, report["observers"]  # the watch was on
