"""DiffConfig.graph_layers in the one set-up path: the decoder layers of a real GPTModel built on the CPU,
and the TECudaGraphHelper layer lists cut to them (the lists are plain attributes set by its
_discover_layers; the helper itself needs Transformer Engine and a GPU: tests/gpu/test_advise_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import types
    import torch
    from megatron.core import parallel_state
    from graphdoctor.child.megatron_setup import build_probe_model, decoder_layers, restrict_graph_layers
    from graphdoctor.config import DiffConfig
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    config = DiffConfig(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128)
    model, _ = build_probe_model(config, device="cpu")
    layers = decoder_layers(model)
    print("layers", sorted(layers), all(layers[i] is model.decoder.layers[i] for i in layers))
    wrapped = torch.nn.Sequential(model)
    print("wrapped", sorted(decoder_layers(wrapped)))
    chunk = list(model.decoder.layers)
    helper = types.SimpleNamespace(chunks_with_decoder=[model], callables_per_chunk=[chunk],
                                   callables_per_chunk_is_mtp=[[False] * 3], num_layers_per_chunk=[3],
                                   flattened_callables=list(chunk), flattened_callables_is_mtp=[False] * 3)
    restrict_graph_layers(config.replace(graph_layers=(0, 2)), model, helper)
    print("te", [layers_index for layers_index, layer in layers.items() if layer in helper.flattened_callables],
          helper.num_layers_per_chunk, helper.callables_per_chunk_is_mtp, helper.chunks_with_decoder[0] is model)
    untouched = types.SimpleNamespace(flattened_callables=list(chunk))
    restrict_graph_layers(config, model, untouched)
    print("all", len(untouched.flattened_callables))
""")


def test_decoder_layers_and_the_te_helper_lists() -> None:
    # A child process: the process group and model-parallel state must not leak into other tests.
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["layers"] == "[0, 1, 2] True"
    assert lines["wrapped"] == "[0, 1, 2]"
    assert lines["te"] == "[0, 2] [2] [[False, False]] True"
    assert lines["all"] == "3"
