"""How many children run at once, and on which GPU: the visible GPUs and their memory (read with
nvidia-smi, so the parent never creates a CUDA context), and an estimate of one child's GPU memory.

Children run at the same time on different GPUs when several are visible; on one GPU as many as the
estimate fits in its memory and the CPUs can drive (cpu_slots); otherwise in series, and diff says why in
one line.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from graphdoctor.config import DiffConfig
from graphdoctor.config.entry_points import TE_LAYER_SPECS
from graphdoctor.errors import UsageError
from graphdoctor.parent.runner import run_isolated

NVIDIA_SMI_TIMEOUT_S = 30.0
MEMORY_HEADROOM = 0.85
"""Share of a GPU's memory that concurrent children may plan to use."""

CONTEXT_BYTES = 3 << 30
"""CUDA context, cuBLAS/cuDNN workspaces and allocator slack of one child."""

CORES_PER_CHILD = 2
"""CPU cores one child keeps busy (its imports and set-up, then its Python thread launching kernels)."""

MAX_CHILDREN_PER_GPU = 8
"""Most children planned on one GPU at a time (their timed steps take turns: graphdoctor.child.gpu_turn)."""


def check_gpu_count(nproc_per_node: int, num_visible: int) -> None:
    """Refuse more processes per child than visible GPUs (nproc_per_node 1 runs anywhere).

    Raises:
        UsageError: nproc_per_node > num_visible.
    """
    if nproc_per_node > 1 and nproc_per_node > num_visible:
        raise UsageError(f"placement: nproc_per_node {nproc_per_node} needs {nproc_per_node} GPUs, "
                         f"{num_visible} visible")


def cpu_slots() -> int:
    """Children this machine's CPUs can start and drive at once (at least 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(2, min(MAX_CHILDREN_PER_GPU, cores // CORES_PER_CHILD))


@dataclass(frozen=True, slots=True)
class Gpu:
    """One visible GPU."""

    device_id: str
    """What CUDA_VISIBLE_DEVICES names it by (the user's own entry when they set the variable)."""
    total_bytes: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class JobPlan:
    """How a diff's children are scheduled."""

    jobs: int
    """Children at a time."""
    gpus: tuple[str, ...]
    """CUDA_VISIBLE_DEVICES entries the children are spread over (round-robin); () keeps each
    child's default device."""
    shared: bool
    """Several children may use one GPU at a time (they then take turns for their timed steps)."""
    reason: str
    """One line: why this many at a time."""
    ceiling: int = 0
    """Most children at a time once a child's measured memory allows more than `jobs` (--jobs, else what the
    CPUs drive: graphdoctor.parent.sizing); 0: `jobs` stays."""
    total_bytes: int = 0
    """The shared GPU's memory (0: unknown or not shared)."""
    used_bytes: int = 0
    """What other processes used of it when the plan was made."""

    @property
    def most(self) -> int:
        """The most children this plan may ever run at once."""
        return max(self.jobs, self.ceiling)


def _smi_rows(*args: str) -> list[tuple[str, ...]] | None:
    """nvidia-smi's CSV rows (no header, no units) for a query, each field stripped; None where nvidia-smi is
    missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    ended = run_isolated(["nvidia-smi", *args, "--format=csv,noheader,nounits"], timeout_s=NVIDIA_SMI_TIMEOUT_S,
                         capture_stdout=True)
    if ended.returncode != 0:
        return None
    return [tuple(part.strip() for part in line.split(",")) for line in ended.stdout.strip().splitlines()]


def _ints(row: tuple[str, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in row)
    except ValueError:
        return None


def visible_gpus() -> list[Gpu]:
    """The GPUs this process may use, by nvidia-smi ([] when it is missing or fails)."""
    by_index: dict[str, Gpu] = {}
    for row in _smi_rows("--query-gpu=index,memory.total,memory.used") or []:
        numbers = _ints(row)
        if numbers is None or len(numbers) != 3:
            continue
        index, total, used = numbers
        by_index[str(index)] = Gpu(device_id=str(index), total_bytes=total << 20, used_bytes=used << 20)
    if not by_index:
        return []
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if allowed is None:
        return list(by_index.values())
    # Only indices can be matched to nvidia-smi's rows; a UUID entry keeps unknown memory figures.
    return [by_index.get(entry.strip(), Gpu(device_id=entry.strip(), total_bytes=0, used_bytes=0))
            for entry in allowed.split(",") if entry.strip()]


def gpu_memory(device: str) -> tuple[int, int] | None:
    """(total bytes, used bytes) of one GPU now, by nvidia-smi's index or UUID (every process's memory on it,
    other users' too); None where nvidia-smi is missing, fails or does not know the GPU."""
    rows = _smi_rows(f"--id={device}", "--query-gpu=memory.total,memory.used")
    numbers = _ints(rows[0]) if rows else None
    if numbers is None or len(numbers) != 2:
        return None
    return numbers[0] << 20, numbers[1] << 20


def gpu_processes(device: str) -> list[tuple[int, int]]:
    """(pid, used bytes) of every compute process on one GPU ([] where nvidia-smi cannot say)."""
    found: list[tuple[int, int]] = []
    for row in _smi_rows(f"--id={device}", "--query-compute-apps=pid,used_memory") or []:
        numbers = _ints(row)
        if numbers is not None and len(numbers) == 2:
            found.append((numbers[0], numbers[1] << 20))
    return found


def num_parameters(config: DiffConfig) -> int:
    """Parameters of the built-in GPT model as Megatron-Core 0.19.2 builds it from the run's
    TransformerConfig fields: attention with grouped query heads, the dense MLP (gated or not) or, with
    `num_moe_experts`, the router, every expert (`moe_ffn_hidden_size`) and the shared experts; biases
    unless `add_bias_linear` is off (MoE runs turn it off); LayerNorm or RMSNorm; learned positions and the
    output layer (GPTModel's default leaves it untied). Tensor/pipeline parallel splits are not taken out: the whole
    model (a per-rank plan divides it)."""
    t = config.transformer
    h, layers, heads = config.hidden_size, config.num_layers, config.num_attention_heads
    kv = int(t.get("kv_channels") or h // heads)
    groups = int(t.get("num_query_groups") or heads)
    experts = int(t.get("num_moe_experts") or 0)
    bias = bool(t.get("add_bias_linear", not experts))
    gated = 2 if t.get("gated_linear_unit") or t.get("swiglu") else 1
    norm = h if t.get("normalization") == "RMSNorm" else 2 * h
    ffn = int(t.get("ffn_hidden_size") or 4 * h)

    def linear(fan_in: int, fan_out: int) -> int:
        return fan_in * fan_out + (fan_out if bias else 0)

    def mlp(width: int) -> int:
        return linear(h, gated * width) + linear(width, h)

    attention = linear(h, heads * kv + 2 * groups * kv) + linear(heads * kv, h) + norm
    if experts:
        moe_ffn = int(t.get("moe_ffn_hidden_size") or ffn)
        shared = int(t.get("moe_shared_expert_intermediate_size") or 0)
        feed_forward = h * experts + experts * mlp(moe_ffn) + (mlp(shared) if shared else 0) + norm
    else:
        feed_forward = mlp(ffn) + norm
    positions = config.seq_length * h  # GPTModel's default learned_absolute embedding
    return 2 * config.vocab_size * h + positions + layers * (attention + feed_forward) + norm


def child_bytes(config: DiffConfig, parameters: int | None = None, *, graphed: bool = True) -> int:
    """A generous first estimate of one child's peak GPU memory, before any child measured it
    (graphdoctor.parent.sizing): weights, fp32 main_grads, Adam state (and fp32 master weights in bf16/fp16),
    activations (twice over for a `graphed` child: its graph pools keep a copy; once for an eager one), the
    logits, the transients of the peak, a context. `parameters`: the count the skeleton built
    (graphdoctor.parent.skeleton), else num_parameters.

    Activations per layer are Korthikanti et al.'s 34sbh at 16 bits, and where the attention is Megatron's unfused
    one (every spec but Transformer Engine's, whose attention is fused) its 5as^2b plus the fp32 softmax output it
    saves in bf16/fp16 (attention_softmax_in_fp32). The logits are held in 16 bits, in fp32 for the loss and as
    its fp32 gradient. The transients are the optimizer step's fp32 temporaries (torch's foreach Adam, which
    Megatron falls back to without Transformer Engine or Apex: one fp32 value per parameter) and, unfused, one
    layer's fp32 softmax gradient. Against the measured eager children (peak allocated or reserved plus the
    1.9 GiB a process holds outside the allocator): 21.3 GiB at 0.54 B on the H200 (8 x 2048, seq 2048, mbs 2;
    estimate 24.9 GiB); 41.5 GiB at 1.08 B on the H200 and 44.7 GiB on an H100 at dropout 0.1 (4 x 4096, seq
    4096; estimate 44.6 GiB); 44.4 GiB for two full-width Llama-3 8B layers with Transformer Engine's spec (seq
    8192, vocab 128256; estimate 48.2 GiB). Without the softmax, the logits and the transients the 1.08 B estimate
    would be 33.3 GiB, which lets two eager children share an H100 80GB, where they run out of memory."""
    params = num_parameters(config) if parameters is None else parameters
    per_param = 16 if config.dtype == "fp32" else 18
    width = 4 if config.dtype == "fp32" else 2
    s, b, h = config.seq_length, config.micro_batch_size, config.hidden_size
    unfused = config.layer_spec not in TE_LAYER_SPECS
    scores = config.num_attention_heads * s * s * b if unfused else 0  # one layer's attention scores, elements
    softmax_fp32 = 0 if config.dtype == "fp32" else 2 * scores  # beside the formula's 16-bit copy
    layer = s * b * h * 17 * width + scores * 5 * width // 2 + softmax_fp32
    activations = config.num_layers * layer * config.num_microbatches
    logits = s * b * config.vocab_size * (width + 8)
    transients = 4 * params + 4 * scores
    copies = 2 if graphed else 1
    return params * per_param + copies * activations + logits + transients + CONTEXT_BYTES


def plan_jobs(config: DiffConfig, gpus: list[Gpu] | None = None, *, parameters: int | None = None) -> JobPlan:
    """How many children of this diff run at once (config.jobs: 0 decides, N asks for N and is the ceiling). On one
    GPU the first estimate (child_bytes, of `parameters` where the skeleton counted them) sizes the first children;
    the session re-sizes from the first measured child, up to the ceiling (graphdoctor.parent.sizing).

    Raises:
        UsageError: a multi-GPU child needs more GPUs than are visible.
    """
    if config.nproc_per_node > 1:
        return plan_multi_gpu(config, visible_gpus() if gpus is None else gpus)
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return JobPlan(1, (), False, "children run in series: one rank of a torchrun job")
    gpus = visible_gpus() if gpus is None else gpus
    if config.jobs == 1:
        return JobPlan(1, (), False, "children run in series (--jobs 1)")
    if len(gpus) > 1:
        jobs = config.jobs or len(gpus)
        return JobPlan(jobs, tuple(g.device_id for g in gpus), jobs > len(gpus),
                       f"{jobs} children at a time over {len(gpus)} GPUs")
    need = child_bytes(config, parameters)
    eager_need = child_bytes(config, parameters, graphed=False)
    if not gpus or not gpus[0].total_bytes:
        if config.jobs:
            return JobPlan(config.jobs, (), True, f"{config.jobs} children at a time (--jobs; GPU memory unknown)")
        return JobPlan(1, (), False, "children run in series: GPU memory unknown (nvidia-smi found none)")
    gpu = gpus[0]
    free = int(gpu.total_bytes * MEMORY_HEADROOM) - gpu.used_bytes
    # Slots for as many of the smallest (eager) children as fit; which of them may hold memory at once is then
    # decided child by child, each by its own kind's need (graphdoctor.parent.slots.HostSlots.try_take).
    fits = max(1, free // eager_need) if eager_need else 1
    ceiling = config.jobs or cpu_slots()
    jobs = min(ceiling, fits)
    sizes = dict(ceiling=ceiling, total_bytes=gpu.total_bytes, used_bytes=gpu.used_bytes)
    if jobs == 1:
        return JobPlan(1, (gpu.device_id,), True, f"one child at a time until one has measured its memory: the "
                       f"estimate is about {need / 2**30:.0f} GiB of {_room(gpu, free)}", **sizes)
    upto, each = needs_in_words(eager_need, need, digits=0, alike="each")
    return JobPlan(jobs, (gpu.device_id,), True, f"{upto}{jobs} children at a time on one GPU (about {each} "
                                                 f"of {free / 2**30:.0f} GiB free)", **sizes)


def needs_in_words(eager_bytes: int, graphed_bytes: int, *, digits: int, alike: str) -> tuple[str, str]:
    """("up to " where the kinds' needs differ, else ""; the needs in GiB with `digits` decimals: one figure and
    `alike` where both read the same, else `E GiB per eager child and G GiB per graphed one`). The plan's line and
    the line of a re-size after a measurement say the per-kind needs this way."""
    eager, graphed = f"{eager_bytes / 2**30:.{digits}f}", f"{graphed_bytes / 2**30:.{digits}f}"
    if eager == graphed:
        return "", f"{graphed} GiB {alike}"
    return "up to ", f"{eager} GiB per eager child and {graphed} GiB per graphed one"


def _room(gpu: Gpu, free: int) -> str:
    """The memory children may plan to use on `gpu` (`free`: within MEMORY_HEADROOM), in words. Where other
    processes hold more than the headroom leaves, it says what they hold rather than a negative figure."""
    if free > 0:
        return f"the GPU's {free / 2**30:.0f} GiB free"
    left = max(0, gpu.total_bytes - gpu.used_bytes)
    return (f"the GPU's {left / 2**30:.1f} GiB free: other processes hold {gpu.used_bytes / 2**30:.1f} GiB of "
            f"{gpu.total_bytes / 2**30:.1f} GiB")


def plan_multi_gpu(config: DiffConfig, gpus: list[Gpu]) -> JobPlan:
    """Children of N processes each take N GPUs of their own (CUDA_VISIBLE_DEVICES): as many at a
    time as disjoint groups of N fit in the visible GPUs (or --jobs, when fewer), never sharing one."""
    nproc = config.nproc_per_node
    check_gpu_count(nproc, len(gpus))
    groups = tuple(",".join(g.device_id for g in gpus[i * nproc:(i + 1) * nproc]) for i in range(len(gpus) // nproc))
    jobs = min(config.jobs or len(groups), len(groups))
    where = " and ".join(f"GPUs {group}" for group in groups[:jobs])
    if jobs == 1:
        return JobPlan(1, groups[:1], False, f"children run in series, {nproc} processes each on {where}")
    return JobPlan(jobs, groups[:jobs], False, f"{jobs} children at a time, {nproc} processes each on {where}")


__all__ = ["Gpu", "JobPlan", "child_bytes", "cpu_slots", "gpu_memory", "gpu_processes", "needs_in_words", "num_parameters", "plan_jobs", "plan_multi_gpu", "visible_gpus"]
