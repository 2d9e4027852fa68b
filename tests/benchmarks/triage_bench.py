"""Benchmark `graphdoctor triage` against a bare `pickle.load` of the same large snapshot.

    python tests/benchmarks/triage_bench.py [--source SNAPSHOT] [--target-mb 220]

Builds a large snapshot by replicating a real snapshot's segments and trace entries with shifted
addresses (frame dicts stay shared, as in torch's own pickles), then runs each as a whole command
and reports wall time and peak RSS (os.wait4 rusage). Targets for plain `graphdoctor triage`
(segments only): time <= 2x pickle.load, peak RSS <= 3x the file size. `--trace` and `--html`
unpickle the whole trace and are reported for comparison. Not a CI test.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from graphdoctor.memory.loader import load_snapshot  # noqa: E402
from graphdoctor.memory.synthetic import graphed_run  # noqa: E402

DEFAULT_SOURCE = REPO / "fixtures" / "data" / "memory" / "megatron" / "snapshot-local-d0.1-after_replays.pickle.gz"
SEGMENT_COPIES = 40
ADDRESS_STRIDE = 1 << 36


def _shift_segment(seg: dict[str, Any], offset: int) -> dict[str, Any]:
    out = dict(seg)
    out["address"] = seg["address"] + offset
    out["blocks"] = [{**b, "address": b["address"] + offset} for b in seg["blocks"]]
    return out


def build_large(source: dict[str, Any], target_bytes: int) -> dict[str, Any]:
    """Replicate source's segments (SEGMENT_COPIES times) and trace entries until the pickle is big enough."""
    trace = max(source.get("device_traces") or [[]], key=len)
    if not trace:
        raise SystemExit("source snapshot has no trace entries to replicate")
    # Cost of one more copy: its entry dicts are new, their frame lists are memo references.
    one = len(pickle.dumps([source["segments"], trace], protocol=4))
    two = len(pickle.dumps([source["segments"], trace, [dict(e) for e in trace]], protocol=4))
    num_copies = max(1, -(-target_bytes // max(1, two - one)))
    segments = [_shift_segment(s, k * ADDRESS_STRIDE) for k in range(SEGMENT_COPIES) for s in source["segments"]]
    big_trace = []
    span = (trace[-1].get("time_us", 0) - trace[0].get("time_us", 0)) + 1
    for k in range(num_copies):
        offset = (k % SEGMENT_COPIES) * ADDRESS_STRIDE
        for entry in trace:
            big_trace.append({**entry, "addr": entry.get("addr", 0) + offset,
                              "time_us": entry.get("time_us", 0) + k * span})
    out = copy.copy(source)
    out["segments"] = segments
    out["device_traces"] = [big_trace]
    return out


def run_measured(cmd: list[str], repeats: int) -> tuple[float, int, int]:
    """Best wall time (s), peak RSS (bytes, max over runs) and the last exit code."""
    best, peak, code = float("inf"), 0, 0
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        best = min(best, time.perf_counter() - start)
        peak = max(peak, usage.ru_maxrss * 1024)  # Linux reports KiB
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        if code not in (0, 1):
            raise SystemExit(f"{cmd[:3]} failed with {code}: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    return best, peak, code


def write_large(source_path: Path, target_mb: float, path: Path) -> dict[str, Any]:
    """Build the large snapshot, write it to path, return what was built (run in a child process)."""
    if source_path.exists():
        source = load_snapshot(source_path)
        label = str(source_path.relative_to(REPO) if source_path.is_relative_to(REPO) else source_path)
    else:
        source, label = graphed_run(num_replay_steps=40, leak_bytes=1 << 20)[2], "synthetic graphed_run (no fixture)"
    big = build_large(source, int(target_mb * 1e6))
    with open(path, "wb") as fh:
        pickle.dump(big, fh, protocol=4)
    return {"label": label, "num_entries": len(big["device_traces"][0]), "num_segments": len(big["segments"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE,
                        help="snapshot whose entries are replicated (synthetic graphed_run if absent)")
    parser.add_argument("--target-mb", type=float, default=220.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="write the large snapshot here and keep it")
    parser.add_argument("--build-only", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only is not None:
        print(json.dumps(write_large(args.source, args.target_mb, args.build_only)))
        return 0
    tmpdir = tempfile.mkdtemp(prefix="gd-bench-")
    path = args.keep or Path(tmpdir) / "large.pickle"
    # Build in a child: the kernel charges a child's peak RSS with this process's RSS at spawn
    # (ru_maxrss survives exec), so this process must stay small for the figures to be the commands'.
    built = json.loads(subprocess.run(
        [sys.executable, __file__, "--source", str(args.source), "--target-mb", str(args.target_mb),
         "--build-only", str(path)], check=True, capture_output=True, text=True).stdout)
    label, num_entries, num_segments = built["label"], built["num_entries"], built["num_segments"]
    size = path.stat().st_size
    exe = str(Path(sys.executable).parent / "graphdoctor")
    cases = {
        "pickle.load": [sys.executable, "-c", f"import pickle; pickle.load(open({str(path)!r}, 'rb'))"],
        "graphdoctor triage": [exe, "triage", str(path)],
        "graphdoctor triage --trace": [exe, "triage", str(path), "--trace"],
        "graphdoctor triage --html": [exe, "triage", str(path), "--html", os.devnull],
    }
    print(f"source: {label}; file {size / 1e6:.1f} MB, {num_entries} trace entries, {num_segments} segments")
    results = {name: run_measured(cmd, args.repeats) for name, cmd in cases.items()}
    base_s = results["pickle.load"][0]
    print(f"{'command':28} {'wall s':>8} {'x pickle':>9} {'peak RSS MB':>12} {'x file':>7}")
    for name, (secs, rss, _) in results.items():
        print(f"{name:28} {secs:8.2f} {secs / base_s:9.2f} {rss / 1e6:12.1f} {rss / size:7.2f}")
    fast_s, fast_rss, _ = results["graphdoctor triage"]
    ok = fast_s <= 2 * base_s and fast_rss <= 3 * size
    print(f"plain triage targets (time <= 2x pickle.load, peak RSS <= 3x file): {'met' if ok else 'NOT met'}")
    if args.keep is None:
        path.unlink()
        os.rmdir(tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
