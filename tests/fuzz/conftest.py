"""Fuzz suite setup: import the CLI (and megatron-core's TransformerConfig fields) once in the
parent, so each forked case starts warm; hypothesis settings shared by every fuzz test."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime" on CPU

import graphdoctor.cli  # noqa: E402,F401  - warm the CLI for the forked children
from graphdoctor.rules import all_rules  # noqa: E402
from graphdoctor.rules.context import transformer_fields  # noqa: E402

transformer_fields()
all_rules()

SCALE = float(os.environ.get("GD_FUZZ_SCALE", "1"))
"""Multiply every test's max_examples (GD_FUZZ_SCALE=10 for a deeper local run)."""

settings.register_profile(
    "fuzz",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.filter_too_much],
)


def examples(num: int) -> int:
    """max_examples for a fuzz test, scaled by GD_FUZZ_SCALE."""
    return max(1, int(num * SCALE))
