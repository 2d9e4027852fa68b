"""graphdoctor's synthetic data and default forward_step: the deterministic batches of every (step,
micro-batch), the same on every side and every process, and Megatron-LM pretrain_gpt's forward_step and
loss_func on them. Imported only inside children (and by planted fixtures that build on them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from graphdoctor.child import distributed as rank_setup
from graphdoctor.config import DiffConfig

_CONSTANT_INPUTS: dict[tuple[int, int, str, int], dict[str, torch.Tensor]] = {}
"""The batch tensors that are the same every step (causal mask, positions, loss mask), allocated once per
micro-batch index, so the tensors a graph captured stay alive at a stable address and every step allocates
the same. On the H200 a fresh mask per step coincided with local differing from eager at dropout 0 once the
allocation pattern shifted; that run also had Transformer Engine importable, which changes how Megatron's
local graphs hold their buffers (make_weakref), so the cause is not isolated yet.

Every micro-batch has its own tensors, as Megatron-LM's dataloader gives it: one mask object shared by
every micro-batch made megatron-core 0.19.2's local graphs fail to capture under a pipeline schedule
(cuda_graphs.py:617, P=2 on two H200s; fixtures/planted/shared_mask_forward.py keeps that case)."""


def constant_inputs(config: DiffConfig, device: torch.device, microbatch: int = 0) -> dict[str, torch.Tensor]:
    """Causal attention mask, position ids and loss mask of micro-batch `microbatch`, allocated once."""
    b, s = config.micro_batch_size, config.seq_length
    key = (b, s, str(device), microbatch)
    if key not in _CONSTANT_INPUTS:
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)
        _CONSTANT_INPUTS[key] = {
            "loss_mask": torch.ones(b, s, dtype=torch.float32).to(device),
            "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous().to(device),
            "attention_mask": causal.to(device),
        }
    return _CONSTANT_INPUTS[key]


def synthetic_batch(config: DiffConfig, step: int, microbatch: int) -> dict[str, torch.Tensor]:
    """The deterministic batch of (step, microbatch): the same on every side and every process."""
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1009 + microbatch + rank_setup.data_parallel_salt())
    b, s = config.micro_batch_size, config.seq_length
    data = torch.randint(0, config.vocab_size, (b, s + 1), generator=gen)
    device = torch.device("cuda", torch.cuda.current_device())
    return {
        "tokens": data[:, :-1].contiguous().to(device),
        "labels": data[:, 1:].contiguous().to(device),
        **constant_inputs(config, device, microbatch),
    }


def step_batches(config: DiffConfig, step: int) -> Iterator[dict[str, torch.Tensor]]:
    """Iterator over the micro-batches of one step."""
    return iter([synthetic_batch(config, step, m) for m in range(config.num_microbatches)])


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[Any, Any, Any]:
    """Megatron's GPT loss: token sum, token count, and the reported [sum, count] (tensors only)."""
    losses = output_tensor.float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses.view(-1) * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    report = torch.cat([loss.clone().detach().view(1), num_tokens.float().view(1)])
    return loss, num_tokens, {"lm loss": report}


def default_forward_step(data_iterator: Iterator[dict[str, torch.Tensor]],
                         model: torch.nn.Module) -> tuple[torch.Tensor, Callable[..., Any]]:
    """Megatron's forward_step for GPT on graphdoctor's synthetic batches."""
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"],
                   labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def forward_step_name(forward_step: str | None) -> str:
    """How messages name the run's forward_step."""
    return f"--forward-step {forward_step}" if forward_step else "graphdoctor's default forward_step"


__all__ = ["constant_inputs", "default_forward_step", "forward_step_name", "loss_func", "step_batches",
           "synthetic_batch"]
