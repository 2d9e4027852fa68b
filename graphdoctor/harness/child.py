"""Entry point of one isolated child run: `python -m graphdoctor.harness.child SPEC.json`.

Megatron keeps process-global graph state (graph records, mempools, RNG tracker, FullCudaGraphWrapper
class state), so every implementation trains in its own process. Progress goes to a JSON-lines file as
it happens, so a crash, CUDA error or hang still leaves the steps done so far for the parent.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from types import TracebackType
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 3


class EventLog:
    """Append-only JSON-lines writer, flushed per event."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the whole child

    def __call__(self, event: dict[str, Any]) -> None:
        self._fh.write(json.dumps(event, default=str) + "\n")
        self._fh.flush()


def _frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]


def _module_on_stack(tb: TracebackType | None, names: dict[int, str]) -> str | None:
    """Qualified name of the innermost nn.Module whose method is on the failing stack."""
    found = None
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if obj is not None and id(obj) in names:
            found = names[id(obj)]
        tb = tb.tb_next
    return found


def _env_info(spec: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "pid": os.getpid(),
                            "rank": spec.placement.rank, "world_size": spec.placement.world_size}
    try:
        import megatron.core

        info["megatron_core"] = megatron.core.__version__
    except ImportError:
        info["megatron_core"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(spec.placement.local_rank)
        info["capability"] = list(torch.cuda.get_device_capability(spec.placement.local_rank))
    return info


def _install_taps(spec: Any, setup: Any, names: dict[int, str]) -> tuple[Any, dict[str, Any] | None]:
    """(Taps or None, the forensics section to report when installing them failed)."""
    if not spec.taps:
        return None, None
    from graphdoctor.harness.taps import Taps

    try:
        return Taps(setup.model, names, num_steps=spec.config["steps"] + 1), None
    except Exception as exc:  # noqa: BLE001 - training still runs; the report says why no taps
        return None, {"version": 1, "error": f"installing taps: {type(exc).__name__}: {exc}"[:500],
                      "sites": [], "steps": []}


def _close_taps(taps: Any) -> dict[str, Any]:
    try:
        return dict(taps.close())
    except Exception as exc:  # noqa: BLE001 - the run's other results still count
        return {"version": 1, "error": f"{type(exc).__name__}: {exc}"[:500], "sites": [], "steps": []}


def _align(spec: Any) -> Any:
    if spec.impl == "none" or not spec.config.get("align_rng"):
        return lambda: None
    from graphdoctor.harness.rng import align_rng

    return align_rng(spec.impl)


def run(spec_path: str) -> int:
    """Run one child; always leaves an `end` or `error` event behind (unless killed)."""
    from graphdoctor.harness.spec import ChildSpec

    with open(spec_path, encoding="utf-8") as fh:
        spec = ChildSpec.from_json(fh.read())
    emit = EventLog(spec.events_path)
    # The parent already placed the run file's env: and the deterministic settings in our
    # environment (before CUDA could start); nothing to set here.
    import warnings

    warnings.filterwarnings("ignore")  # megatron and torch warn at every import and step
    import torch

    from graphdoctor.harness.train import LoopState, run_steps, strip_wrappers

    emit({"event": "env", **_env_info(spec)})
    state = LoopState()
    names: dict[int, str] = {}
    started = time.perf_counter()
    try:
        from graphdoctor.harness.build import build_setup, release_graphs
        from graphdoctor.harness.culprit import sync_errors_during_capture
        from graphdoctor.harness.observers import make_observers

        if spec.config.get("deterministic", True):
            # Atomics-based kernels (embedding backward, index_add) make eager differ from eager;
            # graphdoctor must not blame graphs for that. Uninitialised memory stays unfilled so
            # graphs are not given extra fill kernels.
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        setup = build_setup(spec)
        names = {id(m): strip_wrappers(n) for n, m in setup.model.named_modules()}
        observers = make_observers(spec, setup.model, names)
        taps, taps_failed = _install_taps(spec, setup, names)
        undo_align = _align(spec)
        t0 = time.perf_counter()
        hunt = sync_errors_during_capture() if spec.hunt_culprit else contextlib.nullcontext()
        with hunt:
            compare_s = run_steps(spec, setup, state, emit, observers, taps)
        train_s = time.perf_counter() - t0 - compare_s
        extra: dict[str, Any] = {}
        for obs in observers:
            extra.update(obs.finish())
        if taps is not None:
            extra["forensics"] = _close_taps(taps)
        elif taps_failed is not None:
            extra["forensics"] = taps_failed
        undo_align()
        # Peak and reserved while the graphs (and their pools) are alive; allocated once they are not.
        extra["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        extra["end_reserved_bytes"] = int(torch.cuda.memory_reserved())
        release_graphs(setup)
        extra["end_allocated_bytes"] = int(torch.cuda.memory_allocated())
        emit({"event": "end", "train_s": train_s, "compare_s": compare_s,
              "setup_s": t0 - started, **extra})
        return EXIT_OK
    except BaseException as exc:  # noqa: BLE001 - every failure must become an event
        from graphdoctor.errors import MissingDependencyError
        from graphdoctor.harness.culprit import root_exception

        root = root_exception(exc)
        tb = root.__traceback__

        emit({
            "event": "error",
            "error_type": type(root).__name__,
            "message": str(root)[:4000],
            "final_error": None if root is exc else f"{type(exc).__name__}: {exc}"[:1000],
            "frames": _frames(tb),
            "module": _module_on_stack(tb, names),
            "step": state.step,
            "phase": state.phase,
            "unavailable": isinstance(exc, MissingDependencyError),
        })
        return EXIT_ERROR


def main() -> None:
    """CLI entry: exit without running atexit/NCCL teardown, which can hang after a CUDA error."""
    if len(sys.argv) != 2:
        print("usage: python -m graphdoctor.harness.child SPEC.json", file=sys.stderr)
        os._exit(2)
    code = run(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
