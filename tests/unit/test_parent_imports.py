"""The parent starts its first children before it imports torch: resolving a child's model from graphdoctor's own
GPT model (ChildSession._child_model, config.child_model) encodes plain values without importing torch, which
would take seconds (3.0-3.2 s before the first child on the H100 while it did). Checked in a fresh interpreter,
where nothing else has imported torch yet."""

from __future__ import annotations

import subprocess
import sys

import torch

from graphdoctor.config.codec import decode, encode

PROBE = """
import sys
from graphdoctor.config import DiffConfig
from graphdoctor.config.child_model import child_model
for impl in ("local", "full_iteration"):
    for dropout in (0.1, 0.0):
        child_model(DiffConfig(impls=("local", "full_iteration")), impl, dropout)
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""


def test_a_builtin_child_model_resolves_without_importing_torch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "torch not imported"


def test_a_dtype_still_encodes_once_torch_is_imported() -> None:
    encoded = encode({"params_dtype": torch.bfloat16, "hidden_size": 64})
    assert encoded == {"params_dtype": {"_target_": "torch.bfloat16", "_call_": False}, "hidden_size": 64}
    assert decode(encoded) == {"params_dtype": torch.bfloat16, "hidden_size": 64}
