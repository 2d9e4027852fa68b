"""Why megatron-core 0.19.2's `local` graphs differ from eager when Transformer Engine is importable: the same
model (local spec, fp32, dropout 0) three times at once, as `graphdoctor diff` runs it, with Megatron unchanged,
with cuda_graphs.HAVE_TE_GRAPHS off, and with cuda_graphs.make_weakref keeping strong references
(tests/gpu/megatron_weakref.py). Needs Transformer Engine. Set GD_REPORT_DIR to keep the three reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.needs_te]

REPO = Path(__file__).resolve().parents[2]
MODEL = ["--dropout", "0", "--num-layers", "2", "--hidden-size", "128", "--num-attention-heads",
         "4", "--seq-length", "64", "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2",
         "--timeout", "300", "--no-launches", "--no-memory", "-q"]
"""The model of test_te_gpu.py::test_local_graphs_differ_from_eager_at_dropout_0_with_te_installed."""
SPECS = {"unchanged": "local", "no_te_graphs": "tests.gpu.megatron_weakref:local_spec_without_te_graphs",
         "strong_refs": "tests.gpu.megatron_weakref:local_spec_with_strong_refs"}
IMPLS = {"unchanged": "local,full_iteration"}
"""full_iteration beside the unchanged local run: FullCudaGraphWrapper takes no weak references."""


def test_local_graphs_with_te_match_once_megatron_keeps_strong_references(tmp_path: Path) -> None:
    procs = {}
    for name, spec in SPECS.items():
        out = tmp_path / f"{name}.json"
        procs[name] = (out, subprocess.Popen(
            [sys.executable, "-m", "graphdoctor.cli", "diff", *MODEL, "--impl", IMPLS.get(name, "local"),
             "--layer-spec", spec, "--json", str(out)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    rows = {}
    for name, (out, proc) in procs.items():
        output, _ = proc.communicate(timeout=900)
        assert proc.returncode in (0, 1), f"{name}: exit {proc.returncode}\n{output[-3000:]}"
        report = json.loads(out.read_text())
        for row in report["impls"]:
            rows[name if row["impl"] == "local" else f"{name}_{row['impl']}"] = row
            first = row.get("first_divergence") or {}
            print(f"{name} {row['impl']}: {row['verdict']} first {first.get('tensor')} step {first.get('step')} "  # noqa: T201
                  f"max abs {first.get('max_abs')} loss {first.get('loss_max_abs')}; peak allocated "
                  f"{row['runs'][0].get('peak_allocated_bytes')}")
        report_dir = os.environ.get("GD_REPORT_DIR")
        if report_dir:
            shutil.copy(out, Path(report_dir) / f"te_weakref_{name}.json")
    assert rows["unchanged"]["verdict"] == "numeric-divergence", rows["unchanged"]
    assert any(n.startswith("static GD310 te-weak-refs-in-local-graphs") for n in rows["unchanged"]["notes"])
    assert rows["unchanged_full_iteration"]["verdict"] == "match", rows["unchanged_full_iteration"]
    assert rows["no_te_graphs"]["verdict"] == "match", rows["no_te_graphs"]
    assert rows["strong_refs"]["verdict"] == "match", rows["strong_refs"]
