"""How much GPU memory one child of a session needs, from measurement: a first estimate before any child ran
(graphdoctor.parent.gpus.child_bytes: the parameters, with optimizer state and activations bounded from the config),
then the figure the children that ended measured (their allocator's peak reserved, which holds the graph pools, plus
the memory a process holds outside the allocator), with a margin. The session sizes its memory slots from it
(graphdoctor.parent.children.SlotPool)."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from graphdoctor.config.impl import MEGATRON_EAGER, Impl
from graphdoctor.parent.gpus import MEMORY_HEADROOM, JobPlan, needs_in_words
from graphdoctor.protocol.record import RunRecord

OUTSIDE_ALLOCATOR_BYTES = 2 << 30
"""What a child's process holds on the GPU outside torch's caching allocator: the CUDA context with its loaded
kernels, NCCL's and cuBLAS's own buffers. The allocator's figures cannot see it; nvidia-smi counts it. Measured on an
H100 (tests/benchmarks/child_memory_stages.py): 0.6 GiB of context and 1.9 GiB once the communicators of a one-GPU
step exist, which a one-GPU child creates at first use (graphdoctor.child.megatron_setup._bound_device)."""

MEASURED_MARGIN = 1.10
"""Over the largest measured child: the children of one diff differ (a graphed child's pools, a tapped child's
saved tensors, the eager reference's smaller peak) and the allocator may fragment differently beside others."""

MEASURED_HEADROOM = 0.95
"""Share of a GPU's memory that children sized from a measured figure may plan to use (the margin above stands
for what the estimate's MEMORY_HEADROOM stood for)."""


def measured_bytes(record: RunRecord) -> int | None:
    """The GPU memory one ended child needed, by its own figures: the largest of its reserved bytes while its
    graphs were alive, the allocator's peak reserved and its peak allocated, plus OUTSIDE_ALLOCATOR_BYTES; None
    where the child reported no memory figures (it failed before its end event).

    Reserved bytes already hold the graph pools: the caching allocator counts a private pool's segments in its
    reserved figure, and the blocks allocated inside a pool in its allocated figure, so adding the pools' reserved
    bytes to the peak allocated would count pool memory twice (every recorded H100 and H200 child reserved less at
    its peak than that sum)."""
    figures = [int(value) for value in (record.end_reserved_bytes, record.peak_allocated_bytes) if value]
    if record.memory is not None and record.memory.stats.peak_reserved_bytes:
        figures.append(int(record.memory.stats.peak_reserved_bytes))
    if not figures:
        return None
    return max(figures) + OUTSIDE_ALLOCATOR_BYTES


@dataclass(frozen=True, slots=True)
class Need:
    """One child's memory need as the session plans it now."""

    bytes: int
    """Per child (per GPU it uses)."""
    measured: bool
    """From an ended child's figures (MEASURED_MARGIN included); False: the first estimate."""
    headroom: float
    """Share of the GPU's memory children sized from this figure may plan to use."""

    def fits(self, total_bytes: int, used_bytes: int, ceiling: int) -> int:
        """Children that fit beside `used_bytes` (other processes) in `headroom` of a GPU of `total_bytes`: at
        least 1, at most `ceiling`."""
        room = int(total_bytes * self.headroom) - used_bytes
        return max(1, min(ceiling, room // self.bytes if self.bytes > 0 else ceiling))


def kind_of(impl: str) -> str:
    """The memory kind of a child of `impl`: "eager" (no graph pools) or "graphed"."""
    return "eager" if impl in (Impl.EAGER, MEGATRON_EAGER) else "graphed"


class ChildMemory:
    """A session's need per child, by kind (kind_of: an eager child holds no graph pools, so it needs less): the
    kind's first estimate until a child of that kind ends with memory figures, then the largest figure that kind
    measured so far times MEASURED_MARGIN. A kind none of whose children measured yet, once another kind has,
    takes that kind's measured figure, scaled up by the two kinds' estimates where its own is the larger: a
    measurement replaces every estimate, which may fall short or far over (thread-safe; children end on the
    session's worker threads).

    Args:
        estimate: the first estimate of a graphed child (graphdoctor.parent.gpus.child_bytes).
        num_processes: processes of each child (its need is shared out over their GPUs).
        eager_estimate: the first estimate of an eager child (child_bytes(..., graphed=False)); default `estimate`.
    """

    def __init__(self, estimate: int, num_processes: int = 1, eager_estimate: int | None = None) -> None:
        self._lock = threading.Lock()
        self._estimates = {"graphed": int(estimate),
                           "eager": int(estimate if eager_estimate is None else eager_estimate)}
        self._nproc = max(1, num_processes)
        self._largest: dict[str, int] = {}
        """The largest measured figure so far of each kind, per GPU (margin not included)."""
        self.measured_by: str | None = None
        """The child whose figure raised a need last (None: the estimates still size the session)."""

    def need(self, kind: str = "graphed") -> Need:
        """Per child of `kind` and per GPU: its kind's measured figure with its margin; else, once another kind has
        measured, that kind's figure (scaled up where this kind's estimate is the larger) with the margin; else its
        estimate."""
        with self._lock:
            return self._need(kind)

    def _need(self, kind: str) -> Need:
        own = self._largest.get(kind)
        if own is not None:
            return Need(bytes=int(own * MEASURED_MARGIN), measured=True, headroom=MEASURED_HEADROOM)
        if not self._largest:
            return Need(bytes=self._estimates[kind] // self._nproc, measured=False, headroom=MEMORY_HEADROOM)
        # From another kind's measurement, scaled up where the estimates say this kind needs more (never down:
        # Transformer Engine's graph pools hold far less than the estimate's second copy of the activations)
        scaled = max(figure * max(1.0, self._estimates[kind] / self._estimates[other])
                     for other, figure in self._largest.items())
        return Need(bytes=int(scaled * MEASURED_MARGIN), measured=True, headroom=MEASURED_HEADROOM)

    def smallest(self) -> Need:
        """The smaller kind's need: how many children the session's slots admit at most (each then waits for its
        own kind's need to fit: graphdoctor.parent.slots)."""
        with self._lock:
            return min((self._need(kind) for kind in self._estimates), key=lambda need: need.bytes)

    def observe(self, record: RunRecord) -> Need | None:
        """Take an ended child's figures; its kind's new need where they raised that kind's measured figure (or
        gave its first), else None. A multi-GPU child's figures are its rank 0's: already per GPU."""
        found = measured_bytes(record)
        if found is None:
            return None
        kind = kind_of(record.impl)
        with self._lock:
            largest = self._largest.get(kind)
            if largest is not None and found <= largest:
                return None
            self._largest[kind] = found
            self.measured_by = record.name or record.impl
            return self._need(kind)


class SlotPool:
    """A session's memory slots: one device entry (None: the child's default device) per child that may hold GPU
    memory at once, taken while a child runs and given back after; resize() grows or shrinks the pool as the need is
    measured (a slot in use when the pool shrinks is dropped when it comes back).

    Args:
        devices: the GPUs the entries are spread over, round-robin ([None]: the default device).
        size: entries at first (at least 1).
    """

    def __init__(self, devices: list[str | None], size: int) -> None:
        self._devices = devices or [None]
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._size = 0
        self._surplus = 0
        """Entries to drop as they come back (the pool shrank while they were in use)."""
        self.resize(size)

    @property
    def size(self) -> int:
        """Children that may hold GPU memory at once now."""
        with self._lock:
            return self._size

    def get(self) -> str | None:
        """Wait for a free entry and take it."""
        return self._queue.get()

    def put(self, device: str | None) -> None:
        """Give an entry back (dropped while the pool is larger than its size)."""
        with self._lock:
            if self._surplus:
                self._surplus -= 1
                return
        self._queue.put(device)

    def resize(self, size: int) -> None:
        """Hold `size` entries from now on (at least 1)."""
        size = max(1, size)
        with self._lock:
            for index in range(self._size, size):
                if self._surplus:
                    self._surplus -= 1
                else:
                    self._queue.put(self._devices[index % len(self._devices)])
            for _ in range(size, self._size):
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._surplus += 1
            self._size = size


def resize(pool: SlotPool, memory: ChildMemory, plan: JobPlan) -> str:
    """Size a shared GPU's pool for the smallest kind's need, up to the plan's ceiling; the line that says so."""
    jobs = memory.smallest().fits(plan.total_bytes, plan.used_bytes, plan.most)
    pool.resize(jobs)
    upto, each = needs_in_words(memory.need("eager").bytes, memory.need("graphed").bytes, digits=1, alike="per child")
    return f"{upto}{jobs} at a time once {memory.measured_by} measured about {each}"


__all__ = ["MEASURED_HEADROOM", "MEASURED_MARGIN", "OUTSIDE_ALLOCATOR_BYTES", "ChildMemory", "Need", "SlotPool",
           "kind_of", "measured_bytes", "resize"]
