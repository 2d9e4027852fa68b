"""Benchmark: wall time of `graphdoctor diff` against the training runs it performs, run plainly.

Usage (on a CUDA machine, from the repository root):
    python tests/benchmarks/diff_overhead.py [extra graphdoctor diff flags...]

It runs `graphdoctor diff` once (keeping its child specs), then re-runs every child it made as a
plain training run (`role=plain`: same process start, model, steps; no reference tensors saved or
compared, no orchestration), one after another, and prints both wall times and the overhead ratio.
Target: diff wall <= 1.15 x the plain runs' wall. Set GD_BENCH_KEEP=DIR to keep the diff's text
and JSON report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from graphdoctor.protocol.spec import ChildSpec, free_port


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="gd-bench-"))
    report = work / "report.json"
    keep = os.environ.get("GD_BENCH_KEEP")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "graphdoctor.cli", "diff", "--json", str(report),
                           "--workdir", str(work / "diff"), *sys.argv[1:]], check=False,
                          stdout=subprocess.PIPE, text=True)
    diff_wall = time.perf_counter() - start
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "diff.txt").write_text(proc.stdout, encoding="utf-8")
        shutil.copy(report, Path(keep) / "diff.json")
    plain_wall = 0.0
    specs = sorted((work / "diff").glob("spec-*.json"))
    for path in specs:
        spec = ChildSpec.from_json(path.read_text(encoding="utf-8"))
        plain = dataclasses.replace(
            spec, role="plain", events_path=str(work / f"plain-{path.stem}.jsonl"),
            placement=dataclasses.replace(spec.placement, master_port=free_port()))
        plain_path = plain.write(work / f"plain-{path.name}")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "graphdoctor.child.entry", str(plain_path)],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        plain_wall += time.perf_counter() - t0
    data = json.loads(report.read_text(encoding="utf-8"))
    verdicts = {entry["impl"]: entry["verdict"] for entry in data["impls"]}
    ratio = diff_wall / plain_wall if plain_wall else float("nan")
    print(json.dumps({"children": len(specs), "diff_wall_s": round(diff_wall, 2),
                      "plain_children_wall_s": round(plain_wall, 2),
                      "ratio": round(ratio, 3), "overhead_pct": round(100 * (ratio - 1), 1),
                      "verdicts": verdicts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
