"""The one table of CUDA capture errors and the error texts graphdoctor recognises, with their
meanings and catalogue rules; pure Python, no torch.

Read by the child (probe captures, the culprit hunt), by the parent (diagnoses of failed runs) and by
the probe analysis. Where a text maps to a catalogue rule, the fix comes from the rule
(graphdoctor.parent.diagnose); `fix` here is only for errors no rule covers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graphdoctor.errors import exception_chain


@dataclass(frozen=True, slots=True)
class KnownError:
    """A recognisable error text and what it means."""

    pattern: str
    """Substring of the error message (case-sensitive)."""

    meaning: str
    """Plain-language meaning."""

    cuda_error: str | None = None
    """CUDA error name, when it is one."""

    number: int | None = None
    """CUDA error number (the capture errors are 900-908)."""

    rule: str | None = None
    """Code in the checks catalogue; the diagnosis takes its fix from there."""

    fix: str | None = None
    """What to do, for errors no catalogue rule covers."""


KNOWN_ERRORS: tuple[KnownError, ...] = (
    KnownError("operation not permitted when stream is capturing",
               "an operation that cannot be captured ran while the stream was capturing (a host sync "
               "such as .item(), .cpu(), .tolist(), bool(tensor), nonzero or torch.cuda.synchronize)",
               "cudaErrorStreamCaptureUnsupported", 900, "GD501"),
    KnownError("operation failed due to a previous error during capture",
               "the capture had already been invalidated by an earlier unsupported operation; this "
               "call site is not the culprit", "cudaErrorStreamCaptureInvalidated", 901, "GD510"),
    KnownError("would result in a merge of two capture sequences",
               "work from two separate captures was joined", "cudaErrorStreamCaptureMerge", 902,
               fix="Keep each capture's streams apart"),
    KnownError("capture was not initiated in this stream",
               "capture began and ended on different streams", "cudaErrorStreamCaptureUnmatched", 903,
               fix="End the capture on the stream that began it"),
    KnownError("capturing stream has unjoined work",
               "a side stream forked from the capturing stream was not joined back before capture "
               "ended", "cudaErrorStreamCaptureUnjoined", 904,
               fix="Make the capturing stream wait on every side stream before the capture ends"),
    KnownError("dependency created on uncaptured work in another stream",
               "captured work waited on an event recorded outside the capture",
               "cudaErrorStreamCaptureIsolation", 905,
               fix="Record the event inside the captured region or synchronise before capture"),
    KnownError("would make the legacy stream depend on a capturing blocking stream",
               "work on the legacy default stream met the capturing stream; with full_iteration this "
               "is DDP built off the capture stream (AccumulateGrad nodes on another stream)",
               "cudaErrorStreamCaptureImplicit", 906, "GD503"),
    KnownError("not permitted on an event last recorded in a capturing stream",
               "an event recorded during capture was queried or synchronised",
               "cudaErrorCapturedEvent", 907,
               fix="Do not query or synchronise on events recorded inside the capture"),
    KnownError("capture sequence initiated in a different thread",
               "a thread other than the capturing one launched work into the capture",
               "cudaErrorStreamCaptureWrongThread", 908,
               fix="Launch captured work from the thread that began the capture"),
    KnownError("Attempt to increase offset for a CUDA generator not in capture mode",
               "a random op used a CUDA generator that is not registered with the graph", rule="GD505"),
    KnownError("unless the CPU tensor is pinned",
               "a pageable host tensor was copied to the device during capture", rule="GD504"),
    KnownError("called a synchronizing CUDA operation",
               "a synchronizing operation ran under torch.cuda.set_sync_debug_mode('error')",
               rule="GD501"),
    KnownError("has no attribute 'main_grad'",
               "the local implementation adds weight gradients into param.main_grad, which Megatron "
               "DDP creates", fix="Wrap the model in megatron.core.distributed.DistributedDataParallel"),
    KnownError("RNG tracker does not support cudagraphs", "the RNG tracker is not graph-safe",
               fix="Call model_parallel_cuda_manual_seed(..., use_cudagraphable_rng=True, "
                   "force_reset_rng=True) before building the model"),
    KnownError("has no attribute 'is_moe_layer'",
               "Megatron could not build the layer: `local` graphs with an `mlp`-only scope make "
               "create_mcore_cudagraph_manager read is_moe_layer (transformer_layer.py:566) before "
               "TransformerLayer.__init__ sets it (megatron-core 0.19.2; Megatron-Bridge#4583)", rule="GD240"),
    KnownError("CUDA graph argument mismatch",
               "a graphed layer was called with a different shape, dtype or non-tensor argument than "
               "at capture", fix="Keep sequence length, micro-batch size and argument types fixed"),
    KnownError("no matching cudagraph runners",
               "no captured graph matches the call (different shapes or training mode)",
               fix="Keep shapes and training mode fixed between capture and replay"),
    KnownError("out of memory",
               "the GPU ran out of memory (graphs pin every intermediate buffer for the life of the "
               "graph)", "cudaErrorMemoryAllocation",
               fix="Reduce micro-batch size or graph scope, or run `graphdoctor triage` on a snapshot"),
)
"""Every recognised error text, most specific first."""

CUDA_CAPTURE_ERRORS: dict[int, KnownError] = {e.number: e for e in KNOWN_ERRORS
                                              if e.number is not None and 900 <= e.number <= 908}
"""The CUDA stream-capture errors by number."""

_NUMBER = re.compile(r"\berror(?: code)?[:= ]+(9\d\d)\b", re.IGNORECASE)


def match_known(text: str) -> KnownError | None:
    """The first known error whose pattern or CUDA error name occurs in `text`."""
    for known in KNOWN_ERRORS:
        if known.pattern in text or (known.cuda_error is not None and known.cuda_error in text):
            return known
    return None


def cuda_error_number(text: str) -> int | None:
    """The capture error (900-908) a message names, by enum name, message text or number."""
    known = match_known(text)
    if known is not None and known.number in CUDA_CAPTURE_ERRORS:
        return known.number
    match = _NUMBER.search(text)
    if match and int(match.group(1)) in CUDA_CAPTURE_ERRORS:
        return int(match.group(1))
    return None


def rule_of_text(text: str) -> str | None:
    """The catalogue rule an error text names by itself, for texts that are not a bare CUDA capture
    error (those need a recording to tell which operation caused them)."""
    known = match_known(text)
    if known is None or known.rule is None:
        return None
    if known.number is not None and known.number != 906:
        return None
    return known.rule


__all__ = ["CUDA_CAPTURE_ERRORS", "KNOWN_ERRORS", "KnownError", "cuda_error_number", "exception_chain",
           "match_known", "rule_of_text"]
