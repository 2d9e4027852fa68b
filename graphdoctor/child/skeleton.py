"""`python -m graphdoctor.child.skeleton CONFIG.json RESULT.json`: build the eager reference's model as a diff child
builds it (graphdoctor.config.build), on the meta device, in one process with no GPU, and write what happened: its
parameters, or the error Megatron raised while building it, with Megatron's file:line.

`diff --plan` and `advise --plan` run it (graphdoctor.parent.skeleton), so that a set-up failure such as a
LayerNorm option torch's LayerNorm refuses is a plan-time refusal, not a GPU minute. Nothing trains; a model that
only a GPU can build (a CUDA stream made at construction) is said to be not built here.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

NEEDS_A_GPU = ("CUDA driver", "CUDA error", "no CUDA GPUs", "Torch not compiled with CUDA", "NVIDIA driver",
               "CUDA-capable device", "cudaErrorNoDevice", "cudaGetDevice", "torch.cuda.is_available() is False")
"""What a process with no GPU raises where the code only needs one (a CUDA stream made at construction): not a
setting Megatron refuses. A missing CUDA extension (Apex's fused_weight_gradient_mlp_cuda) is no such thing: it
is missing on the GPU machine too."""


def megatron_frame(exc: BaseException) -> str | None:
    """The innermost frame of Megatron's own code in the error's traceback (`megatron/core/...py:123`)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        if "/megatron/" in path:
            return f"{path[path.rfind('megatron/'):]}:{frame.lineno}"
    return None


def build(config_json: str) -> dict[str, Any]:
    """The result of building the eager reference's model of a DiffConfig (its JSON) on the meta device."""
    import torch
    from megatron.core import parallel_state

    from graphdoctor.config import DiffConfig
    from graphdoctor.config.build import build_model, described_transformer_config
    from graphdoctor.config.child_model import child_model, one_gpu
    from graphdoctor.config.impl import Impl

    config = one_gpu(DiffConfig.from_dict(json.loads(config_json)))
    model = child_model(config, Impl.EAGER, config.dropout)
    if config.model_provider or model.layer_spec and not model.layer_spec.startswith("megatron."):
        return {"built": False, "why": "the model comes from your own pkg.mod:fn, which runs only in diff's children"}
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    tconfig = described_transformer_config(model, Impl.EAGER)
    # Where the weights are initialised does not change the model; FP8 primary weights are initialised on the GPU
    # (graphdoctor.config.fp8.initialisation), which a process without one cannot do.
    tconfig.use_cpu_initialization = True
    with torch.device("meta"):
        built = build_model(model, tconfig)
    return {"built": True, "num_parameters": sum(p.numel() for p in built.parameters()),
            "modules": len(list(built.modules()))}


def main(argv: list[str]) -> int:
    """Build, write RESULT.json (always, unless the process is killed), exit 0."""
    config_path, result_path = argv
    warnings.simplefilter("ignore")
    try:
        result = build(Path(config_path).read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - the point is to report what Megatron raised, whatever it is
        text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".strip(": ")
        needs_gpu = any(word in str(exc) for word in NEEDS_A_GPU)
        result = {"built": False, "error": None if needs_gpu else text[:400], "where": megatron_frame(exc),
                  "why": f"it needs a GPU to build ({text[:200]})" if needs_gpu else None}
    Path(result_path).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
