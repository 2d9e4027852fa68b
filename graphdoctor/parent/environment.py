"""Failures of the machine, not of the user's model: a child that fails before its first step with an NCCL or
CUDA initialisation error, out of memory, a busy or lost GPU, or a taken port says nothing about the model; nor
does a child that ran out of memory at any step while other children of its diff shared its GPU (their memory was
planned from a first estimate, graphdoctor.parent.gpus.child_bytes, which can fall short).

ChildSession retries such a child once, alone (graphdoctor.parent.turns). A second failure of the
machine's makes the run `environment-failed` (compare.verdict: the row's verdict, never `reference-failed` or
`setup-failed`), with the likely cause read from the GPU at that moment (graphdoctor processes, other processes,
free memory) and the fix; a retry that ran alone and ran out of memory after its first step is the model's own
failure, and its record stands.
"""

from __future__ import annotations

import dataclasses
import os
import re

from graphdoctor.protocol.record import ENVIRONMENT_FAILED, RunRecord

_OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED",
                            re.IGNORECASE)

SHARED_OUT_OF_MEMORY = ("out of memory while other children of this run shared the GPU (the first estimate of "
                        "their memory fell short); not yet a result of the model")

_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"NCCL error.*(unhandled cuda error|unhandled system error|internal error)|ncclUnhandledCudaError"
                r"|ncclSystemError", re.IGNORECASE | re.DOTALL),
     "NCCL could not set up its communicator (on one GPU this is most often too many processes on it at once, "
     "or its memory exhausted)"),
    (_OUT_OF_MEMORY,
     "out of memory before the first step (other processes held the GPU's memory, or the model does not fit "
     "in it alone)"),
    (re.compile(r"busy or unavailable|cudaErrorDevicesUnavailable|devices are busy", re.IGNORECASE),
     "the GPU is busy (another process holds it in exclusive mode)"),
    (re.compile(r"no CUDA GPUs are available|cudaErrorNoDevice|CUDA driver initialization failed"
                r"|cudaErrorInitializationError|cudaErrorDeviceUninitialized|CUDA error: unknown error",
                re.IGNORECASE),
     "the GPU was lost or could not be initialised"),
    (re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE),
     "a port the run needed was taken"),
)

FIX = ("run fewer graphdoctor diffs or other GPU jobs at once on this GPU (graphdoctor's own children queue for "
       "the GPU's slots; GRAPHDOCTOR_SLOTS_PER_GPU lowers their number), free its memory, then run the diff again")


def environment_cause(record: RunRecord, *, shared: bool = False) -> str | None:
    """The likely cause when `record` failed for the machine's sake: an error (or a crash) before its first step
    whose message or traceback names NCCL's or CUDA's set-up, memory, a busy or lost device, or a taken port; or,
    where it `shared` its GPU with other children of its run, out of memory at any step."""
    if record.status not in ("error", "crashed") or record.diagnosis is None:
        return None
    diagnosis = record.diagnosis
    text = "\n".join([diagnosis.error_type, diagnosis.message, diagnosis.cuda_error or ""])
    if any(step.step >= 0 for step in record.steps):
        return SHARED_OUT_OF_MEMORY if shared and _OUT_OF_MEMORY.search(text) else None
    for pattern, cause in _CAUSES:
        if pattern.search(text):
            return cause
    return None


def gpu_now(devices: list[str]) -> str:
    """What is on the GPUs now, for the diagnosis: `GPU 0: 3 graphdoctor processes, 2 others (12.0 GiB), 41.3
    GiB free of 139.8 GiB` (what nvidia-smi can say)."""
    from graphdoctor.parent.gpus import gpu_memory, gpu_processes

    parts = []
    mine = os.getpid()
    for device in devices:
        memory = gpu_memory(device)
        processes = gpu_processes(device)
        ours = [p for p in processes if _is_descendant(p[0], mine)]
        others = [p for p in processes if p not in ours]
        said = f"GPU {device}: {len(ours)} graphdoctor process{'es' if len(ours) != 1 else ''}, {len(others)} " \
               f"other{'s' if len(others) != 1 else ''}"
        if others:
            said += f" ({sum(b for _, b in others) / 2**30:.1f} GiB)"
        if memory is not None:
            total, used = memory
            said += f", {(total - used) / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"
        parts.append(said)
    return "; ".join(parts) if parts else "nvidia-smi could not say what is on the GPU"


def _is_descendant(pid: int, ancestor: int) -> bool:
    """`pid` is `ancestor` or one of its descendants (/proc; False where it cannot be read)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                stat = handle.read()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


def environment_failed(record: RunRecord, cause: str, devices: list[str], first: RunRecord) -> RunRecord:
    """`record`, the retry that failed for the machine again, as `environment-failed`: its diagnosis says the
    likely cause, what was on the GPU, both attempts and the fix."""
    diagnosis = record.diagnosis
    assert diagnosis is not None
    before = first.diagnosis.message if first.diagnosis is not None else ""
    meaning = f"{cause}; not a result of the model: it failed so again when retried alone ({gpu_now(devices)})"
    if before and before != diagnosis.message:
        meaning += f"; the first attempt said: {before[:300]}"
    return dataclasses.replace(record, status=ENVIRONMENT_FAILED,
                               diagnosis=dataclasses.replace(diagnosis, meaning=meaning, fix=FIX),
                               wall_s=record.wall_s + first.wall_s)


__all__ = ["ENVIRONMENT_FAILED", "FIX", "SHARED_OUT_OF_MEMORY", "environment_cause", "environment_failed", "gpu_now"]
