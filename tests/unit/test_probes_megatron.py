"""CPU tests of the Megatron side of the probes: specs, planted fixtures and the model build."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.config.entry_points import resolve_entry_point
from graphdoctor.errors import UsageError
from graphdoctor.probes.api import probe_config
from graphdoctor.protocol.spec import ProbeJob

PLANTED = {
    "item_mlp": "GD501", "nonzero_mlp": "GD502", "default_stream_mlp": "GD503",
    "unregistered_generator_dropout": "GD505", "host_mask_dropout": "GD506",
    "forward_hook_mlp": "GD508", "reassigned_scale": "GD509", "clean": None,
}


def test_probe_config_is_the_diff_config_itself():
    config = DiffConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                        vocab_size=128, layer_spec="fixtures.planted.item_mlp:layer_spec",
                        model_provider="fixtures.planted.clean:layer_spec")
    assert probe_config(config) is config
    assert probe_config(config, dropout=0.0).dropout == 0.0
    job = ProbeJob(config=config, layers=(0, 1), warmup_iters=3)
    assert ProbeJob.from_json(job.to_json()) == job


def test_probe_config_from_mapping_with_overrides_and_validation():
    config = probe_config({"num_layers": 3, "hidden_size": 64, "num_attention_heads": 4}, dtype="bf16")
    assert config.num_layers == 3 and config.dtype == "bf16"
    with pytest.raises(UsageError, match="dtype"):
        probe_config({"dtype": "fp8"})
    with pytest.raises(UsageError, match="layer_spec"):
        probe_config({"layer_spec": "no colon"})
    with pytest.raises(UsageError, match="not_a_field"):
        probe_config({"not_a_field": 1})


def test_entry_point_errors_name_the_field():
    with pytest.raises(UsageError, match="cannot import"):
        resolve_entry_point("fixtures.planted.no_such_module:layer_spec")
    with pytest.raises(UsageError, match="no attribute"):
        resolve_entry_point("fixtures.planted.clean:no_such_fn")


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_fixture_builds_a_spec_and_marks_its_line(name: str):
    from megatron.core.transformer.spec_utils import ModuleSpec

    module = importlib.import_module(f"fixtures.planted.{name}")
    spec = resolve_entry_point(f"fixtures.planted.{name}:layer_spec")()
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
    from graphdoctor.child.megatron_setup import build_probe_model
    from graphdoctor.child.probe.modules import scan_hooks
    from graphdoctor.config import DiffConfig
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    for name in ("clean", "item_mlp", "forward_hook_mlp"):
        config = DiffConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                            vocab_size=128, layer_spec=f"fixtures.planted.{name}:layer_spec")
        model, regs = build_probe_model(config, device="cpu")
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
