"""Benchmark: one dropout mask's draw fingerprint, counted in integers (graphdoctor.compare.fingerprint.mask_counts)
against a cast to bfloat16 and three float32 sums (the count before), at Megatron's mask shapes.

Usage (on a CUDA machine, from the repository root):
    python tests/benchmarks/fingerprint_cost.py [--repeats 20]

Per shape: median milliseconds per fingerprint of each way, eager and replayed from a CUDA graph of 10
fingerprints (CUDA events), and the extra device bytes one call allocates. Shapes: the attention-probability
mask of the 0.54 B size ([mbs 2, heads 16, seq 2048, seq 2048]) and of the 1.08 B size ([1, 32, 4096, 4096]),
and a hidden-state mask ([seq 2048, mbs 2, hidden 2048]). Prints a JSON object; a line per row on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from graphdoctor.compare.fingerprint import fingerprint

SHAPES = {"attention 0.54b": (2, 16, 2048, 2048), "attention 1.08b": (1, 32, 4096, 4096),
          "hidden 0.54b": (2048, 2, 2048)}


def _cast_sums(mask: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    flat = mask.reshape(-1).to(torch.bfloat16)
    torch.sum(flat, dim=None, dtype=torch.float32, out=out[0])
    torch.sum(flat[1::3], dim=None, dtype=torch.float32, out=out[1])
    torch.sum(flat[2::7], dim=None, dtype=torch.float32, out=out[2])
    return out


def _counts(mask: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return fingerprint(mask, "dropout", out=out)


def _median_ms(run, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _measure(way, mask: torch.Tensor, repeats: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out = torch.zeros(3, device=mask.device)
    way(mask, out)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    way(mask, out)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    eager_ms = _median_ms(lambda: way(mask, out), repeats)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        way(mask, out)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(10):
            way(mask, out)
    graph_ms = _median_ms(graph.replay, repeats) / 10
    return {"eager_ms": round(eager_ms, 4), "graph_ms": round(graph_ms, 4), "extra_bytes": int(extra),
            "stats": out.tolist()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("fingerprint_cost: needs a CUDA device", file=sys.stderr)
        return 2
    rows = []
    for name, shape in SHAPES.items():
        mask = torch.rand(shape, device="cuda") < 0.9
        before, now = _measure(_cast_sums, mask, args.repeats), _measure(_counts, mask, args.repeats)
        row = {"shape": name, "numel": mask.numel(), "cast_sums": before, "counts": now,
               "graph_speedup": round(before["graph_ms"] / now["graph_ms"], 2)}
        rows.append(row)
        print(f"{name}: cast+sums {before['graph_ms']:.3f} ms ({before['extra_bytes'] / 2**20:.0f} MiB), counts "
              f"{now['graph_ms']:.3f} ms ({now['extra_bytes'] / 2**20:.1f} MiB) per replayed fingerprint, "
              f"{row['graph_speedup']}x", file=sys.stderr)
        del mask
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
