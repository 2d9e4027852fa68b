"""diff's memory section names the user's leaking line (issue 15, deliver 6): a forward hook keeping
1 MiB per step, real Megatron-Core GPT under `local` graphs on a real GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from kept import diff

from graphdoctor.config import DiffConfig
from graphdoctor.memory.sites import NO_USER_FRAME

pytestmark = pytest.mark.gpu

SMALL = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 512, "steps": 6, "cuda_graph_warmup_steps": 2, "timeout_s": 240.0}
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "planted" / "leaky_hook_forward_step.py"


def test_leaking_hook_leads_the_memory_summary() -> None:
    line = next(i for i, text in enumerate(FIXTURE.read_text(encoding="utf-8").splitlines(), 1)
                if "# [LEAK]" in text)
    config = DiffConfig(impls=("local",), dropout=0.0,
                        forward_step="fixtures.planted.leaky_hook_forward_step:forward_step", **SMALL)
    report = diff(config)
    (local,) = report.results
    assert local.memory is not None and local.memory.report is not None, local
    memory = local.memory.report
    where = f"planted/leaky_hook_forward_step.py:{line}"
    assert memory.verdict == "growth", memory.summary()
    first = memory.unfreed_replay_sites[0]
    assert first.site.startswith(where) and first.is_suspect, memory.unfreed_replay_sites
    assert f"top {where}" in memory.summary()
    assert NO_USER_FRAME not in memory.summary()
