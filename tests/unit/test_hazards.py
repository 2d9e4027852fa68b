"""NoneMaskObserver on a real Megatron GPTModel built on the CPU (in a subprocess: process groups)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import contextlib
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_layer import TransformerLayer
    from graphdoctor.child.megatron_setup import build_probe_model
    from graphdoctor.child.hazards import NoneMaskObserver
    from graphdoctor.config import DiffConfig
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model, _ = build_probe_model(DiffConfig(num_layers=2, hidden_size=64, num_attention_heads=4), device="cpu")
    names = {id(m): n for n, m in model.named_modules()}
    original = TransformerLayer.__dict__["forward"]
    watch = NoneMaskObserver(model, names)
    layer = model.decoder.layers[0]
    hidden = torch.zeros(8, 1, 64)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).triu(1)
    with contextlib.suppress(Exception):   # Megatron layers do not run forward on the CPU
        layer(hidden_states=hidden, attention_mask=mask)
    print("with mask", watch.found)
    with contextlib.suppress(Exception):
        layer(hidden_states=hidden, attention_mask=None)
    print("without mask", [(f.rule, f.module) for f in watch.found])
    watch.end_step(0, "warmup")
    print("restored", TransformerLayer.__dict__["forward"] is original)
    print("finish", [f.rule for f in watch.finish()])
""")


def test_none_mask_is_seen_on_local_attention_and_the_patch_is_removed() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "with mask []" in lines
    assert ("without mask [('GD511', 'decoder.layers.0.self_attention.core_attention')]"
            in lines), done.stdout
    assert "restored True" in lines
    assert "finish ['GD511']" in lines
