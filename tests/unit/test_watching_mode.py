"""The dispatch modes of diff's children leave torch.compile'd code compiled (graphdoctor.child.watching_mode): under
a plain dispatch mode torch.compile runs a compiled function's Python operator by operator, so a graph captured
under graphdoctor's watch would hold other kernels than the user's run."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graphdoctor.child.watching_mode import WatchingMode

MODE_MODULES = ("graphdoctor.child.holders", "graphdoctor.child.taps")
"""The modules whose dispatch modes run in diff's children (the holders watch during captures, the taps)."""


def _compiled_under(mode_cls: type[TorchDispatchMode]) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(how many graphs the backend was given, the input, the result): one call of a freshly compiled SwiGLU-like function
    (Megatron's bias_swiglu is compiled the same way) under an instance of `mode_cls`."""
    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True)
    def swiglu(x: torch.Tensor) -> torch.Tensor:
        a, b = torch.chunk(x, 2, dim=-1)
        return torch.nn.functional.silu(a) * b

    x = torch.randn(4, 16)
    with mode_cls():
        out = swiglu(x)
    return len(graphs), x, out


class _Plain(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


class _Watching(WatchingMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def test_a_plain_dispatch_mode_makes_compiled_code_run_uncompiled() -> None:
    """The hazard itself, on this torch: nothing reaches the backend under a plain mode."""
    compiled, _, _ = _compiled_under(_Plain)
    assert compiled == 0


def test_compiled_code_stays_compiled_under_a_watching_mode() -> None:
    compiled, x, out = _compiled_under(_Watching)
    assert compiled == 1
    a, b = torch.chunk(x, 2, dim=-1)
    assert torch.equal(out, torch.nn.functional.silu(a) * b)


@pytest.mark.parametrize("module", MODE_MODULES)
def test_every_dispatch_mode_of_a_diff_child_is_a_watching_mode(module: str) -> None:
    importlib.import_module(module)
    ours = [cls for cls in _subclasses(TorchDispatchMode) if cls.__module__ == module]
    assert ours, f"{module} defines no dispatch mode"
    for cls in ours:
        assert issubclass(cls, WatchingMode), f"{module}.{cls.__name__} would make compiled code run uncompiled"
        assert cls.ignore_compile_internals()


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def test_the_probe_recorder_runs_compiled_code_op_by_op_on_purpose() -> None:
    """check --probe's recorder sees the operators a compiled function is made of: its mode is a plain one."""
    from graphdoctor.child.probe.recorder import _DispatchMode

    assert not issubclass(_DispatchMode, WatchingMode) and not _DispatchMode.ignore_compile_internals()
