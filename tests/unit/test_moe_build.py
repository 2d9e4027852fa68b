"""MoE GPT models through the one set-up path, built on the CPU: the layer spec gets the experts from the
run's `transformer:` mapping, both dispatchers and drop-and-pad build, and the MoE metrics tracker is
cleared per step in place (Megatron layers do not run forward on the CPU, so nothing is trained here)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.config import load_run_file

REPO = Path(__file__).resolve().parents[2]
RUNFILES = REPO / "fixtures" / "runfiles"


BUILD = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    from graphdoctor.child.megatron_setup import build_probe_model, clear_moe_metrics
    from graphdoctor.config import diff_config_from, load_run_file
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    # The alltoall dispatcher creates its host-copy side stream at construction (token_dispatcher.py:469),
    # which this CPU-only torch cannot; the class attribute it checks stands in (no forward runs here).
    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "not created on the CPU"
    out = {}
    for path in sys.argv[1:]:
        config = diff_config_from(load_run_file(path), hidden_size=64, num_attention_heads=4,
                                  seq_length=32, vocab_size=128)
        model, _ = build_probe_model(config, device="cpu")
        layers = model.decoder.layers
        mlp = layers[0].mlp
        out[path] = {
            "num_layers": len(layers),
            "mlp": [type(layer.mlp).__name__ for layer in layers],
            "experts": type(mlp.experts).__name__,
            "num_local_experts": len(mlp.experts.local_experts),
            "dispatcher": type(mlp.token_dispatcher).__name__,
            "topk": mlp.router.topk,
            "drop_and_pad": bool(model.config.moe_pad_expert_input_to_capacity),
            "capacity_factor": model.config.moe_expert_capacity_factor,
            "aux_loss_coeff": model.config.moe_aux_loss_coeff,
            "z_loss_coeff": model.config.moe_z_loss_coeff,
            "add_bias_linear": model.config.add_bias_linear,
            "fc1_bias": mlp.experts.local_experts[0].linear_fc1.bias is not None,
        }
    tracker = get_moe_metrics_tracker()
    tracker.record("load_balancing_loss", torch.tensor(0.5), layer_number=1, num_layers=2)
    values = tracker.metrics["load_balancing_loss"].values
    before = values.tolist()
    clear_moe_metrics()
    out["tracker"] = {"before": before, "after": tracker.metrics["load_balancing_loss"].values.tolist(),
                      "same_tensor": tracker.metrics["load_balancing_loss"].values is values}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    paths = [str(RUNFILES / f"moe_{name}.yaml") for name in ("dropless_allgather", "dropless_alltoall", "drop_pad")]
    # A child process: the process group and model-parallel state must not leak into other tests.
    proc = subprocess.run([sys.executable, "-c", BUILD, *paths], capture_output=True, text=True, timeout=300,
                          check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {Path(k).stem.removeprefix("moe_") if k != "tracker" else k: v for k, v in result.items()}


@pytest.mark.parametrize(("name", "dispatcher", "drop_and_pad"), [
    ("dropless_allgather", "MoEAllGatherTokenDispatcher", False),
    ("dropless_alltoall", "MoEAlltoAllTokenDispatcher", False),
    ("drop_pad", "MoEAlltoAllTokenDispatcher", True),
])
def test_moe_gpt_builds_on_cpu(built: dict[str, Any], name: str, dispatcher: str, drop_and_pad: bool) -> None:
    model = built[name]
    assert model["num_layers"] == 2 and model["mlp"] == ["MoELayer", "MoELayer"]
    assert (model["experts"], model["num_local_experts"], model["topk"]) == ("SequentialMLP", 4, 2)
    assert model["dispatcher"] == dispatcher
    assert model["drop_and_pad"] is drop_and_pad
    assert model["capacity_factor"] == (1.0 if drop_and_pad else None)
    assert (model["aux_loss_coeff"], model["z_loss_coeff"]) == (0.01, 0.001)
    assert model["add_bias_linear"] is False and model["fc1_bias"] is False


def test_moe_metrics_are_cleared_in_place(built: dict[str, Any]) -> None:
    assert built["tracker"] == {"before": [0.5, 0.0], "after": [0.0, 0.0], "same_tensor": True}


def test_moe_run_defaults_add_bias_linear_off_unless_given() -> None:
    from graphdoctor.config.builtin import moe_defaults

    run = load_run_file(RUNFILES / "moe_drop_pad.yaml")
    without = {k: v for k, v in run.transformer.items() if k != "add_bias_linear"}
    assert moe_defaults(without) == {"add_bias_linear": False}
    assert moe_defaults({**without, "add_bias_linear": True}) == {}
    assert moe_defaults({"hidden_size": 64}) == {}
