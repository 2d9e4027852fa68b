"""Benchmark: the GPU memory a child holds outside torch's caching allocator, stage by stage of its set-up.

A diff sizes its children from their allocator figures plus what a process holds outside the allocator
(graphdoctor.parent.sizing.OUTSIDE_ALLOCATOR_BYTES). This runs a child's first set-up stages alone on the GPU,
one process, and after each reads the device's used memory (cudaMemGetInfo, which counts every allocation of
this process) against the allocator's reserved bytes:
1. the CUDA context (torch.cuda.set_device and one tiny tensor);
2. the process group (graphdoctor.child.megatron_setup.init_distributed: NCCL with the device bound, then
   Megatron's model-parallel groups);
3. the seeds (Megatron's RNG tracker);
4. one NCCL all-reduce on the world group (a child's DDP reduces its gradients through it).

    python tests/benchmarks/child_memory_stages.py          # on a CUDA machine with nothing else on the GPU
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import torch

    from graphdoctor.child.megatron_setup import init_distributed, seed_everything
    from graphdoctor.config import DiffConfig
    from graphdoctor.protocol.spec import Placement

    began = time.perf_counter()
    free, total = torch.cuda.mem_get_info(0)  # creates the context on device 0
    rows = []

    def mark(stage: str) -> None:
        nonlocal began
        torch.cuda.synchronize()
        seconds, began = time.perf_counter() - began, time.perf_counter()
        now_free, _ = torch.cuda.mem_get_info(0)
        used = total - now_free
        reserved = torch.cuda.memory_reserved()
        rows.append({"stage": stage, "seconds": round(seconds, 3), "device_used_gib": round(used / 2**30, 3),
                     "allocator_reserved_gib": round(reserved / 2**30, 3),
                     "outside_allocator_gib": round((used - reserved) / 2**30, 3)})
        print(f"{stage:<28} {seconds:6.2f} s, device used {used / 2**30:7.3f} GiB, allocator {reserved / 2**30:7.3f} GiB, "
              f"outside {(used - reserved) / 2**30:7.3f} GiB", file=sys.stderr)

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    mark("context")
    init_distributed(Placement(), DiffConfig())
    mark("process group + groups")
    seed_everything(1234, "local")
    mark("seeds")
    x = torch.ones(1024, device="cuda")
    torch.distributed.all_reduce(x)
    mark("one all-reduce")
    print(json.dumps({"device": torch.cuda.get_device_name(0), "total_gib": round(total / 2**30, 2),
                      "used_before_gib": round((total - free) / 2**30, 3), "rows": rows}, indent=1))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
