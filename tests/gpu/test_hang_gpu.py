"""The planted rank-dependent collective on two GPUs: `hang` (or `timeout`) with both ranks' stacks,
phases and last steps, inside the timeout + 30 s, and no process of the run left (`ps`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu(2)]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
SMALL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2", "--dropout", "0"]


def test_rank0_only_all_reduce_in_the_graph_is_a_hang_with_both_ranks_stacks(tmp_path: Path) -> None:
    workdir, out = tmp_path / "work", tmp_path / "report.json"
    argv = [sys.executable, "-m", "graphdoctor.cli", "diff", "--nproc-per-node", "2", "--impl", "local",
            "--layer-spec", "fixtures.planted.rank0_allreduce:layer_spec", *SMALL, "--timeout", str(TIMEOUT_S),
            "--json", str(out), "--workdir", str(workdir), "-q"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=4 * (TIMEOUT_S + 30), check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (impl,) = json.loads(out.read_text(encoding="utf-8"))["impls"]
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
    # Nothing of the run is left: no process has one of its spec files on its command line.
    ps = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    specs = [str(p) for p in workdir.glob("spec-*.json")]
    assert specs
    left = [line for line in ps.splitlines() if any(spec in line for spec in specs)]
    assert not left, left
