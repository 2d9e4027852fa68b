"""Weights initialised on the GPU (DiffConfig.gpu_init, the default) are identical in every child of a diff: eager,
local, full_iteration and, where Transformer Engine imports, transformer_engine, by the digest each child reports; no
row carries the note of runs that started apart; and the diff's verdicts are those of CPU initialisation."""

from __future__ import annotations

import pytest
from kept import diff
from te_gate import te_import_error

from graphdoctor.compare.weights import weights_disagree
from graphdoctor.config import DiffConfig

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 256,
         "steps": 6, "dropout": 0.0, "dtype": "bf16"}


def _impls() -> tuple[str, ...]:
    return ("local", "full_iteration") + (("transformer_engine",) if te_import_error() is None else ())


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_every_child_starts_from_the_same_weights(moe: bool) -> None:
    transformer = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_grouped_gemm": False} if moe else {}
    report = diff(DiffConfig(impls=_impls(), gpu_init=True, transformer=transformer, **SMALL))
    runs = [r for r in report.runs() if r is not None and r.status == "ok"]
    assert len(runs) >= 1 + len(_impls()) and all(r.weights is not None for r in runs)
    assert weights_disagree(runs) is None, weights_disagree(runs)
    assert not [n for r in report.results for n in r.notes if n.startswith("weights:")]
    cpu = diff(DiffConfig(impls=_impls(), gpu_init=False, transformer=transformer, **SMALL))
    assert all(r.weights is None for r in cpu.runs() if r is not None)
    assert [r.verdict for r in report.results] == [r.verdict for r in cpu.results]
