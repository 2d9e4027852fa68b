"""CPU tests of the Megatron side of the probes: specs, planted fixtures and the model build."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.errors import UsageError
from graphdoctor.probes.megatron import ProbeSpec, load_entry_point, spec_from_config

PLANTED = {
    "item_mlp": "GD501", "nonzero_mlp": "GD502", "default_stream_mlp": "GD503",
    "unregistered_generator_dropout": "GD505", "host_mask_dropout": "GD506",
    "forward_hook_mlp": "GD508", "reassigned_scale": "GD509", "clean": None,
}


def test_spec_from_diff_config_takes_model_fields():
    config = DiffConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                        vocab_size=128, layer_spec="fixtures.planted.item_mlp:layer_spec")
    spec = spec_from_config(config)
    assert (spec.num_layers, spec.hidden_size, spec.seq_length, spec.vocab_size) == (2, 64, 32, 128)
    assert spec.layer_spec == "fixtures.planted.item_mlp:layer_spec"
    assert spec.dropout == config.dropout


def test_spec_from_mapping_with_overrides_and_validation():
    spec = spec_from_config({"num_layers": 3, "not_a_probe_field": 1}, dtype="bf16")
    assert spec.num_layers == 3 and spec.dtype == "bf16"
    with pytest.raises(UsageError, match="dtype"):
        ProbeSpec(dtype="fp8")
    with pytest.raises(UsageError, match="layer_spec"):
        ProbeSpec(layer_spec="no colon")


def test_load_entry_point_errors_name_the_field():
    with pytest.raises(UsageError, match="cannot import"):
        load_entry_point("fixtures.planted.no_such_module:layer_spec")
    with pytest.raises(UsageError, match="no attribute"):
        load_entry_point("fixtures.planted.clean:no_such_fn")


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_fixture_builds_a_spec_and_marks_its_line(name: str):
    from megatron.core.transformer.spec_utils import ModuleSpec

    module = importlib.import_module(f"fixtures.planted.{name}")
    spec = load_entry_point(f"fixtures.planted.{name}:layer_spec")()
    assert isinstance(spec, ModuleSpec)
    source = inspect.getsource(module)
    code = PLANTED[name]
    if code is None:
        assert "# [GD" not in source
    else:
        assert source.count(f"# [{code}]") == 1


BUILD_SCRIPT = textwrap.dedent("""
    import torch
    from megatron.core import parallel_state
    from graphdoctor.probes.megatron import ProbeSpec, build_gpt
    from graphdoctor.probes.modules import scan_hooks
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    for name in ("clean", "item_mlp", "forward_hook_mlp"):
        model, regs = build_gpt(ProbeSpec(layer_spec=f"fixtures.planted.{name}:layer_spec"), device="cpu")
        names = {id(m): n for n, m in model.named_modules()}
        layer = model.decoder.layers[0]
        found = scan_hooks(layer, names[id(layer)], regs)
        print(name, type(layer.mlp).__name__, [(o.code, o.module, o.location) for o in found])
""")


def test_build_on_cpu_swaps_the_planted_module_and_finds_the_hook():
    # A child process: the process group and model-parallel state must not leak into other tests.
    proc = subprocess.run([sys.executable, "-c", BUILD_SCRIPT], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["clean"] == "MLP []"
    assert lines["item_mlp"] == "ItemMLP []"
    source = inspect.getsource(importlib.import_module("fixtures.planted.forward_hook_mlp"))
    line = next(i + 1 for i, text in enumerate(source.splitlines()) if "# [GD508]" in text)
    assert lines["forward_hook_mlp"] == (
        f"MLP [('GD508', 'decoder.layers.0.mlp', 'fixtures/planted/forward_hook_mlp.py:{line}')]"
    )
