"""The parent's parameter estimate (graphdoctor.parent.gpus.num_parameters), which sizes how many children
share a GPU, against the real Megatron-Core GPT models the one set-up path builds on the CPU: dense,
grouped-query SwiGLU with RMSNorm, and the committed MoE run files (experts, shared experts)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.parent.gpus import child_bytes, num_parameters

REPO = Path(__file__).resolve().parents[2]
SMALL = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128}
CASES: dict[str, dict] = {
    "dense": {},
    "gqa_swiglu_rmsnorm": {"num_query_groups": 2, "gated_linear_unit": True, "normalization": "RMSNorm",
                           "ffn_hidden_size": 96, "add_bias_linear": False},
    "moe_shared": {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 48,
                   "moe_shared_expert_intermediate_size": 80},
}
RUNFILES = ["moe_dropless_allgather.yaml", "moe_drop_pad.yaml"]

BUILD = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from graphdoctor.child.megatron_setup import build_probe_model
    from graphdoctor.config import DiffConfig
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "not created on the CPU"  # see tests/unit/test_moe_build.py
    out = {}
    for name, fields in json.loads(sys.argv[1]).items():
        model, _ = build_probe_model(DiffConfig.from_dict(fields), device="cpu")
        out[name] = sum(p.numel() for p in model.parameters())
    print(json.dumps(out))
""")


def _configs() -> dict[str, DiffConfig]:
    configs = {name: DiffConfig(transformer=fields, **SMALL) for name, fields in CASES.items()}
    for runfile in RUNFILES:
        configs[runfile] = diff_config_from(load_run_file(REPO / "fixtures" / "runfiles" / runfile), **SMALL)
    return configs


def test_estimate_is_the_parameter_count_megatron_builds() -> None:
    configs = _configs()
    payload = json.dumps({name: c.to_dict() for name, c in configs.items()})
    proc = subprocess.run([sys.executable, "-c", BUILD, payload], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {name: num_parameters(c) for name, c in configs.items()} == built


def test_experts_make_a_child_bigger() -> None:
    dense = DiffConfig(**SMALL)
    moe = DiffConfig(transformer={"num_moe_experts": 8, "moe_router_topk": 2}, **SMALL)
    assert num_parameters(moe) > 4 * num_parameters(dense) // 2
    assert child_bytes(moe) > child_bytes(dense)
