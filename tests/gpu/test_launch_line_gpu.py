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
