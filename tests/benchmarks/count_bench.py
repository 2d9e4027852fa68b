"""Benchmark: `graphdoctor count --trace FILE` vs a bare `json.load` of the same >= 100 MB trace.

The big trace is built from real events: a fixture trace's events replicated with shifted
timestamps, correlation ids, External ids and step numbers, so the event mix (cpu_op,
python_function, cuda_runtime, kernel, ...) is the fixture's. Whole commands are timed (process
start included), best-of and median of --repeat runs.

    python tests/benchmarks/count_bench.py [--source TRACE] [--size-mb 100] [--repeat 3] [--keep PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DEFAULT_SOURCES = (
    ROOT / "fixtures" / "data" / "launches" / "megatron" / "trace-local-graphed-d0.1.json.gz",
    ROOT / "fixtures" / "data" / "launches" / "h200" / "trace_toy.json.gz",
    ROOT / "fixtures" / "data" / "launches" / "synthetic_kineto_trace.json",
)


def _shift(event: dict[str, Any], copy_index: int, span_us: float, id_span: int) -> dict[str, Any]:
    out = copy.copy(event)
    if "ts" in out:
        out["ts"] = round(float(out["ts"]) + copy_index * span_us, 3)
    args = out.get("args")
    if isinstance(args, dict):
        args = out["args"] = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += copy_index * id_span
    if out.get("ph") in ("s", "f") and isinstance(out.get("id"), int):
        out["id"] += copy_index * id_span
    name = out.get("name", "")
    if name.startswith("ProfilerStep#"):
        out["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy_index * 1000}"
    elif name.startswith("graphdoctor/"):
        head, _, step = name.rpartition("/")
        out["name"] = f"{head}/{int(step) + copy_index * 1000}"
    return out


def build_big_trace(source: Path, target: Path, size_mb: float) -> int:
    """Write a trace of at least size_mb MB replicating source's events; returns copies made."""
    from graphdoctor.launches.trace import load_trace_document

    document = load_trace_document(source)
    events = [e for e in document["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in document["traceEvents"] if e.get("ph") == "M"]
    stamps = [float(e["ts"]) + float(e.get("dur", 0)) for e in events if "ts" in e]
    span_us = max(stamps) - min(stamps) + 1000.0
    ids = [v for e in events for k, v in (e.get("args") or {}).items()
           if k in ("correlation", "External id") and isinstance(v, int)]
    id_span = max(ids) + 1
    one_copy = len(json.dumps(events, indent=1))
    copies = max(1, int(size_mb * 1e6 / one_copy) + 1)
    big = dict(document)
    big["traceEvents"] = meta + [_shift(e, k, span_us, id_span) for k in range(copies) for e in events]
    with open(target, "w") as handle:
        json.dump(big, handle, indent=1)
    return copies


def _time(cmd: list[str], repeat: int) -> list[float]:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        runs.append(time.perf_counter() - start)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=next((p for p in DEFAULT_SOURCES if p.exists()), None))
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="keep the big trace at this path")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gd-count-bench-"))
    try:
        trace = args.keep or tmp / "big_trace.json"
        copies = build_big_trace(args.source, trace, args.size_mb)
        script = Path(sys.executable).with_name("graphdoctor")
        count_cmd = [str(script)] if script.exists() else [sys.executable, "-c", "from graphdoctor.cli import main; main()"]
        count_cmd += ["count", "--trace", str(trace)]
        base_cmd = [sys.executable, "-c", f"import json; json.load(open({str(trace)!r}))"]
        # interleave so machine noise hits both sides alike
        base, ours = [], []
        for _ in range(args.repeat):
            base += _time(base_cmd, 1)
            ours += _time(count_cmd, 1)
        result = {
            "source": str(args.source),
            "copies": copies,
            "trace_mb": round(os.path.getsize(trace) / 1e6, 1),
            "json_load_s": {"min": round(min(base), 3), "median": round(statistics.median(base), 3)},
            "count_s": {"min": round(min(ours), 3), "median": round(statistics.median(ours), 3)},
            "ratio_min": round(min(ours) / min(base), 3),
            "ratio_median": round(statistics.median(ours) / statistics.median(base), 3),
            "target_ratio": 1.5,
        }
        print(json.dumps(result, indent=2))
        return 0 if result["ratio_median"] <= 1.5 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
