"""Child-process entry point: `python -m graphdoctor.probes.worker SPEC_JSON OUT_JSON`.

Runs probe_layers in a fresh process (its own process group and CUDA context) and always writes
OUT_JSON, with `tool_error` set when the probe itself failed.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Read the spec, probe, write the result; exit 0 unless the output cannot be written."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m graphdoctor.probes.worker SPEC_JSON OUT_JSON\n")
        return 2
    spec_path, out_path = args
    result: dict[str, Any]
    try:
        from graphdoctor.probes.megatron import probe_layers, spec_from_config

        with open(spec_path, encoding="utf-8") as fh:
            payload = json.load(fh)
        spec = spec_from_config(payload["spec"])
        result = probe_layers(spec, payload.get("layers"))
    except Exception as exc:  # reported to the parent as a tool error, never swallowed
        tail = traceback.format_exc().strip().splitlines()[-6:]
        result = {"tool_error": f"{type(exc).__name__}: {exc}", "traceback": tail}
    finally:
        _shutdown()
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


def _shutdown() -> None:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        try:
            torch.distributed.destroy_process_group()
        except RuntimeError as exc:
            # A poisoned context can fail teardown; the result file matters more than a clean exit.
            sys.stderr.write(f"graphdoctor probe worker: teardown failed: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
