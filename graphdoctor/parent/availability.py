"""What can run here: a visible CUDA GPU, and Transformer Engine for the `transformer_engine` implementation.

TE's import is tried in an isolated child process with a timeout (its compiled library can crash or
hang the importing process); the answer is cached for the process.
"""

from __future__ import annotations

from graphdoctor.config import DiffConfig
from graphdoctor.config.entry_points import TE_LAYER_SPECS
from graphdoctor.config.fp8 import recipe_unavailable_here
from graphdoctor.config.impl import Impl
from graphdoctor.errors import NoGPUError
from graphdoctor.installed import mamba_findable, te_findable
from graphdoctor.parent.runner import python_command, run_isolated

TE_INSTALL_HINT = ("install Transformer Engine (pip install 'graphdoctor[transformer-engine]'); "
                   "graphdoctor drives the transformer_engine implementation only where "
                   "transformer_engine.pytorch imports")
"""The fix wherever Transformer Engine is needed and does not import."""


def require_gpu(command: str = "graphdoctor diff") -> None:
    """Raise NoGPUError naming `command` and the commands that work without a GPU."""
    import torch

    if not torch.cuda.is_available():
        raise NoGPUError(
            f"{command} needs a CUDA GPU and none is visible; without a GPU use "
            "`graphdoctor check`, `graphdoctor rules`, `graphdoctor triage SNAPSHOT` or "
            "`graphdoctor count --trace FILE`")


MAMBA_MISSING = ("a hybrid model's Mamba layers need mamba_ssm (Megatron-Core's HybridModel imports it), which is "
                 "not installed here; install mamba-ssm to diff it")

TE_PROBE_TIMEOUT_S = 180.0
"""Limit for the child process that imports transformer_engine.pytorch to see whether it loads."""

TE_PROBE_MODULE = "graphdoctor.child.te_check"

_TE_STATUS: tuple[bool, str] | None = None


def te_available() -> tuple[bool, str]:
    """(True, "") when transformer_engine.pytorch imports here, else (False, one-line reason).

    The import runs in a child process with a timeout: loading TE's compiled library can crash or
    hang the process (a CUDA or torch mismatch), which must not take the command down.
    """
    global _TE_STATUS
    if not te_findable():
        return False, "transformer_engine is not installed"
    if _TE_STATUS is None:
        _TE_STATUS = _probe_te_import()
    return _TE_STATUS


def _probe_te_import() -> tuple[bool, str]:
    ended = run_isolated(python_command(TE_PROBE_MODULE), timeout_s=TE_PROBE_TIMEOUT_S, capture_stdout=True)
    if ended.timed_out:
        return False, f"importing transformer_engine.pytorch took over {TE_PROBE_TIMEOUT_S:.0f} s"
    lines = ended.stdout.strip().splitlines()
    if ended.returncode == 0 and lines and lines[-1] == "ok":
        return True, ""
    if lines and lines[-1].startswith("no: "):
        return False, lines[-1][4:]
    tail = (ended.log_tail.strip().splitlines() or [ended.describe_exit()])[-1]
    return False, f"importing transformer_engine.pytorch failed ({tail[:200]})"


def why_unavailable(impl: str, cfg: DiffConfig, *, probe: bool = True) -> str | None:
    """Why `impl` cannot run here (None: it can): a model this machine cannot build (every implementation), an FP8
    or FP4 recipe this machine's GPU does not run (every implementation, checked with `probe`), or
    Transformer Engine's graphs without Transformer Engine or bf16. `probe=False` takes an installed
    Transformer Engine as importable without the import probe (te_available's child process) unless the probe
    already ran: diff starts its children before the probe answers, and a child whose import fails reports the
    implementation unavailable itself."""
    if cfg.model is not None and cfg.model.unavailable is not None:
        return cfg.model.unavailable
    recipe = recipe_unavailable_here(cfg.model.value) if probe else None
    if recipe is not None:
        return recipe
    if cfg.model is not None and cfg.model.kind == "hybrid" and not mamba_findable():
        return MAMBA_MISSING
    te_layers = cfg.layer_spec in TE_LAYER_SPECS and cfg.model_provider is None
    if impl != Impl.TRANSFORMER_ENGINE and not te_layers:
        return None
    if not probe and _TE_STATUS is None and te_findable():
        ok, why = True, ""
    else:
        ok, why = te_available()
    if not ok:
        return why if impl == Impl.TRANSFORMER_ENGINE else f"{why} (the run builds Transformer Engine layers)"
    if impl != Impl.TRANSFORMER_ENGINE:
        return None
    if cfg.dtype != "bf16":
        return (f"Megatron's TECudaGraphHelper captures with bf16 sample inputs "
                f"(megatron/core/transformer/module.py:259), so dtype {cfg.dtype} cannot be graphed "
                f"by transformer_engine; run with --dtype bf16")
    return None


__all__ = ["MAMBA_MISSING", "TE_INSTALL_HINT", "require_gpu", "te_available", "why_unavailable"]
