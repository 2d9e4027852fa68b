"""CUDA stream-capture error numbers and the text that identifies them; pure Python, no torch.

Shared by capture.py (which raises and catches) and analyze.py (which only reads results).
"""

from __future__ import annotations

import re

from graphdoctor.errors import exception_chain

CUDA_CAPTURE_ERRORS: dict[int, tuple[str, str]] = {
    900: ("cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
    901: ("cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"),
    902: ("cudaErrorStreamCaptureMerge", "would result in a merge of two capture sequences"),
    903: ("cudaErrorStreamCaptureUnmatched", "capture was not initiated in this stream"),
    904: ("cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"),
    905: ("cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"),
    906: ("cudaErrorStreamCaptureImplicit", "would make the legacy stream depend on a capturing blocking stream"),
    907: ("cudaErrorCapturedEvent", "not permitted on an event last recorded in a capturing stream"),
    908: ("cudaErrorStreamCaptureWrongThread", "capture sequence initiated in a different thread"),
}
"""CUDA stream-capture errors: number -> (enum name, message fragment)."""

MESSAGE_CODES: tuple[tuple[str, str], ...] = (
    ("Attempt to increase offset for a CUDA generator not in capture mode", "GD505"),
    ("unless the CPU tensor is pinned", "GD504"),
    ("called a synchronizing CUDA operation", "GD501"),
    ("cudaErrorStreamCaptureImplicit", "GD503"),
    ("legacy stream depend on a capturing", "GD503"),
)
"""Error text that names the rule by itself (no recording needed)."""

_NUMBER = re.compile(r"\berror(?: code)?[:= ]+(9\d\d)\b", re.IGNORECASE)


def cuda_error_number(text: str) -> int | None:
    """The capture error (900-908) a message names, by enum name, message text or number."""
    for number, (enum_name, fragment) in CUDA_CAPTURE_ERRORS.items():
        if enum_name in text or fragment in text:
            return number
    match = _NUMBER.search(text)
    if match and int(match.group(1)) in CUDA_CAPTURE_ERRORS:
        return int(match.group(1))
    return None


__all__ = ["CUDA_CAPTURE_ERRORS", "MESSAGE_CODES", "cuda_error_number", "exception_chain"]
