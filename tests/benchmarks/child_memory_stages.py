"""Benchmark: the GPU memory and seconds a child's set-up takes outside torch's caching allocator, stage by stage.

A diff sizes its children from their allocator figures plus what a process holds outside the allocator
(graphdoctor.parent.sizing.OUTSIDE_ALLOCATOR_BYTES). This runs a child's first set-up stages alone on the GPU and
after each reads the device's used memory (cudaMemGetInfo, which counts every allocation of this process) against
the allocator's reserved bytes:
1. the CUDA context (torch.cuda.set_device and one tiny tensor);
2. the process group and Megatron's model-parallel groups;
3. the seeds (Megatron's RNG tracker);
4. one NCCL all-reduce on the world group and one on Megatron's data-parallel and model-parallel groups (a
   one-GPU child's DDP and optimizer reduce through them).

Two variants, each in a process of its own, side by side in one run:
- `bound`: NCCL with the device bound (`device_id`): every group's communicator is created as the group is;
- `lazy`: graphdoctor.child.megatron_setup.init_distributed, as a one-GPU child sets up: no device bound (as
  Megatron-LM's initialize.py binds none), so a communicator is created at its group's first collective.

    python tests/benchmarks/child_memory_stages.py          # on a CUDA machine with nothing else on the GPU
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def stages(variant: str) -> dict:
    import torch

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
        print(f"{variant:<6} {stage:<24} {seconds:6.2f} s, device used {used / 2**30:7.3f} GiB, allocator "
              f"{reserved / 2**30:7.3f} GiB, outside {(used - reserved) / 2**30:7.3f} GiB", file=sys.stderr)

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    mark("context")
    if variant == "bound":
        from megatron.core import parallel_state

        torch.distributed.init_process_group(backend="nccl", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1, device_id=torch.device("cuda", 0))
        parallel_state.initialize_model_parallel()
    else:
        from graphdoctor.child.megatron_setup import init_distributed
        from graphdoctor.config import DiffConfig
        from graphdoctor.protocol.spec import Placement

        init_distributed(Placement(), DiffConfig())
    mark("process group + groups")
    from graphdoctor.child.megatron_setup import seed_everything

    seed_everything(1234, "local")
    mark("seeds")
    x = torch.ones(1024, device="cuda")
    torch.distributed.all_reduce(x)
    mark("all-reduce, world")
    from megatron.core import parallel_state

    torch.distributed.all_reduce(x, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    torch.distributed.all_reduce(x, group=parallel_state.get_model_parallel_group())
    mark("all-reduce, dp + mp")
    result = {"variant": variant, "device": torch.cuda.get_device_name(0), "total_gib": round(total / 2**30, 2),
              "used_before_gib": round((total - free) / 2**30, 3), "rows": rows}
    torch.distributed.destroy_process_group()
    return result


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--variant":
        print(json.dumps(stages(sys.argv[2])))
        return 0
    results, code = [], 0
    for variant in ("bound", "lazy"):
        done = subprocess.run([sys.executable, __file__, "--variant", variant], stdout=subprocess.PIPE, text=True,
                              timeout=120, env=dict(os.environ))
        if done.returncode:
            print(f"{variant}: exit {done.returncode}", file=sys.stderr)
            code = 1
            continue
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps({"variants": results}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
