"""Benchmark: cost of bitwise fingerprints (graphdoctor.compare.bitprint) on a synthetic model layout.

Usage (from the repository root, on whatever device is available):
    python tests/benchmarks/bitprint_cost.py [--num-params N] [--num-tensors 300] [--repeats 5] [--budgets default,64]

For bf16 and fp32 it builds N parameters split into --num-tensors tensors (one of them a
non-contiguous view), fingerprints them --repeats times per device budget (--budgets: `default`, the
fingerprinter's own, or MiB) and prints the median and min time per call (CUDA calls are timed with
events after a warm-up call; host_ms is the wall until the call returned, before the GPU finished), the
chunk count and the computed extra bytes against the model's bytes; on CUDA also the measured peak extra
bytes of one call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from graphdoctor.compare.bitprint import BitFingerprinter


def _layout(num_params: int, num_tensors: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    size = num_params // num_tensors
    tensors = [torch.empty(size, dtype=dtype, device=device).normal_() for _ in range(num_tensors - 1)]
    rows = max(1, (num_params - size * (num_tensors - 1)) // 1024)
    tensors.append(torch.empty(1024, rows, dtype=dtype, device=device).normal_().t())  # non-contiguous
    return tensors


def _time_call(fp: BitFingerprinter, tensors: list[torch.Tensor]) -> tuple[float, float]:
    """(milliseconds until the result is ready, milliseconds until the call returned)."""
    begin = time.perf_counter()
    if fp.device.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fp.fingerprint(tensors)
        host = (time.perf_counter() - begin) * 1e3
        stop.record()
        stop.synchronize()
        return float(start.elapsed_time(stop)), host
    fp.fingerprint(tensors)
    host = (time.perf_counter() - begin) * 1e3
    return host, host


def _measure(dtype: torch.dtype, args: argparse.Namespace, device: torch.device, budget_mib: int | None) -> str:
    tensors = _layout(args.num_params, args.num_tensors, dtype, device)
    budget = None if budget_mib is None else budget_mib << 20
    fp = BitFingerprinter([(f"p{i}", t.numel(), t.dtype) for i, t in enumerate(tensors)], device,
                          budget_bytes=budget)
    fp.fingerprint(tensors)  # warm-up
    measured = ""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fp.fingerprint(tensors)
        torch.cuda.synchronize()
        call_bytes = torch.cuda.max_memory_allocated() - before
        measured = f" measured_call_extra_bytes={call_bytes}"
    timed = [_time_call(fp, tensors) for _ in range(args.repeats)]
    times = [t for t, _ in timed]
    plan = fp.plan
    budget_name = "default" if budget_mib is None else f"{budget_mib}MiB"
    return (f"{str(dtype).removeprefix('torch.'):9s} budget={budget_name} params={plan.total_numel} "
            f"tensors={plan.num_tensors} median_ms={statistics.median(times):.1f} min_ms={min(times):.1f} "
            f"host_ms={statistics.median(h for _, h in timed):.1f} "
            f"chunks={plan.num_chunks} chunk_numel={plan.chunk_numel} model_bytes={plan.model_bytes} "
            f"extra_bytes={plan.extra_bytes} ({100 * plan.extra_bytes / plan.model_bytes:.3f}% of model)"
            f"{measured} model_GB_per_s={plan.model_bytes / statistics.median(times) / 1e6:.3f}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-params", type=float, default=None,
                        help="parameters in the synthetic layout. Default: 1.3e9 on CUDA, 5e7 on CPU")
    parser.add_argument("--num-tensors", type=int, default=300, help="tensors in the layout. Default: 300")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per dtype. Default: 5")
    parser.add_argument("--budgets", default="default",
                        help="comma-separated device budgets: `default` (the fingerprinter's) or MiB. Default: default")
    parser.add_argument("--device", default=None, help="cuda or cpu. Default: cuda when visible, else cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.num_params is None:
        args.num_params = 1.3e9 if device.type == "cuda" else 5e7
    args.num_params = int(args.num_params)
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()}")
    budgets = [None if b == "default" else int(b) for b in args.budgets.split(",")]
    for dtype in (torch.bfloat16, torch.float32):
        for budget in budgets:
            print(_measure(dtype, args, device, budget), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
