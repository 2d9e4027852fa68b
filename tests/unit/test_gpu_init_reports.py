"""Reports of tests/gpu/test_gpu_init_gpu.py recorded on an H100 (2026-12-06; 2 layers x 128, bf16, dropout 0,
local, full_iteration and transformer_engine with Transformer Engine 2.20.2): weights initialised on the GPU, the
children forked from the template process (`h100_gpu_init_forked`) and started as their own interpreters
(`h100_gpu_init_started`, GRAPHDOCTOR_FORK_TEMPLATE=0), and the same diff with CPU initialisation
(`h100_cpu_init_forked`). Read here as the parent reads them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from graphdoctor.compare.weights import weights_disagree
from graphdoctor.protocol.record import RunRecord

DIFF = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff"


def _report(name: str) -> dict[str, Any]:
    with gzip.open(DIFF / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def _runs(report: dict[str, Any]) -> list[RunRecord]:
    found = [report["reference"], *(r for row in report["impls"] for r in row["runs"])]
    return [RunRecord.from_dict(r) for r in {r["name"]: r for r in found if r}.values()]


def test_every_child_of_a_gpu_init_diff_reported_one_digest_forked_or_started() -> None:
    """Six children per diff (eager, three graphed, and the tapped pair of local's divergence): one digest across all of them and across both ways of starting them, every tensor an init
    method filled seeded again, none left unseeded, no row noting runs that started apart."""
    digests = set()
    for name in ("h100_gpu_init_forked", "h100_gpu_init_started"):
        report = _report(name)
        runs = _runs(report)
        assert report["config"]["gpu_init"] is True and len(runs) == 6
        assert all(r.status == "ok" and r.weights is not None for r in runs)
        assert weights_disagree(runs) is None
        assert all(r.weights.num_seeded > 0 and r.weights.unseeded == () for r in runs if r.weights)
        digests |= {r.weights.digest for r in runs if r.weights}
        assert not [n for row in report["impls"] for n in row["notes"] if n.startswith("weights:")]
    assert len(digests) == 1


def _imports(run: RunRecord) -> float:
    assert run.seconds is not None
    return float(run.seconds.stages["imports"])


def test_forked_children_did_no_imports_of_their_own() -> None:
    """The template's imports are the forked children's `interpreter` stage; a started child imports itself. In
    this recording the tapped pair, asked for after local diverged, was started rather than forked. By then the
    parent's plan-time checks had imported megatron.core, which sets TORCHINDUCTOR_CACHE_DIR (through torch's
    inductor; seen on the CPU machine) in the parent's environment, and the template compared environments whole;
    it now accepts what the imports set (same_imports)."""
    forked = {r.name: r for r in _runs(_report("h100_gpu_init_forked"))}
    tapped = {name for name in forked if "tapped" in name}
    assert len(tapped) == 2
    assert all(_imports(r) < 1.0 for name, r in forked.items() if name not in tapped)
    assert all(_imports(forked[name]) > 1.0 for name in tapped)
    assert all(_imports(r) > 1.0 for r in _runs(_report("h100_gpu_init_started")))


def test_gpu_and_cpu_initialisation_give_the_same_verdicts() -> None:
    """The same diff with CPU initialisation: no digests, and each implementation's verdict as with GPU weights
    (local's numeric divergence is GD310's, Transformer Engine importable beside local graphs)."""
    gpu, cpu = _report("h100_gpu_init_forked"), _report("h100_cpu_init_forked")
    assert cpu["config"]["gpu_init"] is False
    assert all(r.weights is None for r in _runs(cpu))
    verdicts = [(row["impl"], row["verdict"]) for row in gpu["impls"]]
    assert verdicts == [(row["impl"], row["verdict"]) for row in cpu["impls"]]
    assert verdicts == [("local", "numeric-divergence"), ("full_iteration", "match"), ("transformer_engine", "match")]
