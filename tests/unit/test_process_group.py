"""A child's process group binds a device only where it has ranks to meet: a one-GPU child creates each NCCL
communicator at its group's first collective, as Megatron-LM's trainer does."""

from __future__ import annotations

import ast
import inspect
import textwrap

import torch

from graphdoctor.child.megatron_setup import _bound_device
from graphdoctor.protocol.spec import Placement


def test_a_process_alone_binds_no_device_and_each_rank_of_a_job_binds_its_own() -> None:
    assert _bound_device(Placement()) == {}
    assert _bound_device(Placement(rank=1, world_size=2, local_rank=1)) == {"device_id": torch.device("cuda", 1)}
    assert _bound_device(Placement(world_size=4, local_rank=3, launcher=True))["device_id"].index == 3


def test_megatron_lm_initialises_its_process_group_without_a_device() -> None:
    from megatron.training import initialize

    source = textwrap.dedent(inspect.getsource(initialize._initialize_distributed))
    keys: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "init_process_group_kwargs"
                                                for t in node.targets) and isinstance(node.value, ast.Dict):
            keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        if (isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "init_process_group_kwargs"
                and isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Store)):
            keys.add(node.slice.value)
    assert {"backend", "world_size", "rank"} <= keys
    assert "device_id" not in keys
