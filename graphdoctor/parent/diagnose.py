"""Turn an exception from a child run into a Diagnosis: CUDA error name, meaning, rule and fix (from
the catalogue), user file:line (or Megatron's file:line for an exception its own graph code raised).

Pure Python over plain frame tuples, so it is tested on CPU with recorded messages from the H200.
"""

from __future__ import annotations

import os
import sysconfig

from graphdoctor.cuda_errors import CUDA_CAPTURE_ERRORS, KnownError, match_known
from graphdoctor.protocol.events import Frame
from graphdoctor.rules import get_rule, rule_fix
from graphdoctor.types import Diagnosis

_LIBRARY_MARKERS = (
    f"{os.sep}torch{os.sep}", f"{os.sep}megatron{os.sep}", f"{os.sep}transformer_engine{os.sep}",
    f"{os.sep}graphdoctor{os.sep}", f"{os.sep}nvtx{os.sep}", f"{os.sep}apex{os.sep}",
    f"{os.sep}click{os.sep}", f"{os.sep}_pytest{os.sep}", f"{os.sep}pluggy{os.sep}",
)
_STDLIB_DIRS = tuple(
    d for d in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if d
)


def is_user_frame(filename: str) -> bool:
    """True for frames from the user's code: not torch, megatron, TE, graphdoctor nor the stdlib."""
    if filename.startswith("<"):
        return False
    norm = os.path.normpath(filename)
    if any(marker in norm for marker in _LIBRARY_MARKERS):
        return False
    return not any(norm.startswith(d + os.sep) for d in _STDLIB_DIRS)


def user_location(frames: list[Frame]) -> str | None:
    """`file:line` of the innermost user frame, or None when the stack is all library code."""
    for filename, line, _ in reversed(frames):
        if is_user_frame(filename):
            return f"{_short_path(filename)}:{line}"
    return None


MEGATRON_ASSERTS: dict[str, tuple[str, str]] = {
    "fwd_buffer_reuse_ref_count == 0": (
        "a tensor given to the graphed forwards of several micro-batches (one attention-mask object shared by "
        "every micro-batch) still holds its shared capture buffer when the pipeline schedule creates the "
        "first backward graph (1F1B records B0 before F1). On two H200s P=2 captured and matched once every "
        "micro-batch had its own mask, or none (megatron-core 0.19.2)",
        "Give every micro-batch its own input tensors, as Megatron-LM's dataloader does, or pass "
        "attention_mask=None with a causal mask type"),
}
"""What an assertion in Megatron's graph creation means, by a piece of its source line (its message when it
has none), with the fix: the ones seen on the H200s."""


MEGATRON_MARKER = f"{os.sep}megatron{os.sep}core{os.sep}"
"""Where a frame of megatron-core's own code is (the installed package, whatever its site directory)."""


def megatron_frame(frames: list[Frame]) -> tuple[str, str] | None:
    """(`megatron/core/...py:line`, function) of the innermost frame when it is megatron-core's own
    code, else None."""
    if not frames:
        return None
    filename, line, function = frames[-1]
    norm = os.path.normpath(filename)
    if MEGATRON_MARKER not in norm:
        return None
    return f"{norm[norm.rindex(MEGATRON_MARKER) + 1:]}:{line}", function


def raised_in_megatron_graphs(known: KnownError | None, frames: list[Frame], phase: str | None) -> bool:
    """A Python exception (an AssertionError, ...) that Megatron's own code raised while creating or
    capturing graphs: not a CUDA error, the innermost frame in megatron/core, during capture. No
    operation of the model broke the capture, so the culprit hunt (for sync errors) does not apply."""
    if known is not None or megatron_frame(frames) is None:
        return False
    return phase == "capture" or is_capture_error("", "", frames)


def _short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def known_fix(known: KnownError) -> str | None:
    """The fix of a recognised error: its rule's, from the catalogue, else the table's own."""
    return rule_fix(known.rule) if known.rule is not None else known.fix


def is_capture_error(error_type: str, message: str, frames: list[Frame]) -> bool:
    """True when the failure happened while capturing (by message or by the functions on the stack)."""
    known = match_known(message)
    if known is not None and known.number in CUDA_CAPTURE_ERRORS:
        return True
    capture_functions = {"create_fwd_graph", "create_bwd_graph", "_create_cudagraphs",
                         "capture_begin", "capture_end", "make_graphed_callables",
                         "_make_graphed_callables", "create_cudagraphs"}
    return any(fn in capture_functions for _, _, fn in frames)


def culprit_meaning(rule: str, operator: str | None, known: KnownError | None) -> str:
    """What a classified culprit means: the operation, its rule's name and summary, then what CUDA
    reported (the error text alone only says that *some* unsupported operation ran)."""
    entry = get_rule(rule)
    what = f"{operator} " if operator else ""
    text = f"the first unsafe operation was {what}({entry.code} {entry.name}): {entry.summary()}"
    if known is not None:
        text += f"; CUDA reported: {known.meaning}"
    return text


def diagnose(
    error_type: str,
    message: str,
    frames: list[Frame],
    *,
    module: str | None = None,
    step: int | None = None,
    phase: str | None = None,
    culprit_rule: str | None = None,
    culprit_operator: str | None = None,
    culprit_location: str | None = None,
    culprit_module: str | None = None,
) -> Diagnosis:
    """Build a Diagnosis from an exception's type, message and frames (outermost first).

    Args:
        error_type: exception class name.
        message: full exception message.
        frames: traceback frames, outermost first.
        module: qualified name of the innermost module on the stack, when known.
        step: step at which it failed.
        phase: phase at which it failed.
        culprit_rule: rule of the operation a culprit hunt classified as the cause; it decides the
            rule and fix (the message alone cannot tell a host sync from nonzero or the legacy stream).
        culprit_operator: that operation, for the meaning.
        culprit_location: where the user's code issued it: the location when the stack has no user frame
            (an error raised at capture_end, such as legacy-stream work, names no operation of its own).
        culprit_module: the module it ran in, for the same case.

    Returns:
        The diagnosis with CUDA error name, meaning and fix where the message is recognised, and the
        user's file:line when the stack reaches user code.
    """
    known = match_known(message)
    if culprit_rule is not None:
        rule: str | None = culprit_rule
        meaning: str | None = culprit_meaning(culprit_rule, culprit_operator, known)
        fix: str | None = rule_fix(culprit_rule)
    else:
        rule = known.rule if known else None
        meaning = known.meaning if known else None
        fix = known_fix(known) if known else None
    first_line = next((ln.strip() for ln in message.splitlines() if ln.strip()), error_type)
    tail = [f"{_short_path(f)}:{ln} in {fn}" for f, ln, fn in frames[-8:]]
    location = user_location(frames)
    if location is None and culprit_rule is not None and culprit_location is not None:
        location = culprit_location
        module = culprit_module or module
    inside = megatron_frame(frames)
    if location is None and culprit_rule is None and inside and raised_in_megatron_graphs(known, frames, phase):
        location = inside[0]
        meaning = (f"{error_type} raised by Megatron's own CUDA-graph code ({inside[0]} in {inside[1]}) while "
                   "creating or capturing the graphs: not a CUDA capture error, no operation of the model "
                   "broke the capture")
        specific = next((known_assert for piece, known_assert in MEGATRON_ASSERTS.items() if piece in message), None)
        if specific is not None:
            meaning = f"{meaning}; {specific[0]}"
            fix = specific[1]
    return Diagnosis(
        error_type=error_type,
        message=first_line[:400],
        cuda_error=known.cuda_error if known else None,
        meaning=meaning,
        fix=fix,
        rule=rule,
        module=module,
        location=location,
        step=step,
        phase=phase,
        traceback_tail=tail,
    )


__all__ = ["MEGATRON_MARKER", "culprit_meaning", "diagnose", "is_capture_error", "is_user_frame", "known_fix",
           "megatron_frame", "raised_in_megatron_graphs", "user_location"]
