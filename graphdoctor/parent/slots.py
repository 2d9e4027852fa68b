"""Machine-wide child slots: every graphdoctor process on this host (diff, advise, count, the pytest plugin's
workers) shares one budget of children and GPU memory per GPU, so several diffs started at once queue for the GPU
instead of all starting their children and failing NCCL's or CUDA's set-up together.

A slot is a lock file, `<runtime dir>/gpu-<id>/slot-<k>.lock`, held with `flock` by the graphdoctor process whose
child uses it, for as long as the child may touch the GPU. The kernel drops the lock when its holder exits, crashed
or killed, so a slot is never lost and there is no daemon: a file left behind by a dead holder is free, whatever it
says. A holder writes what it reserved into its file (one JSON object: pid, bytes, what), which the others read.

A child may take a slot on its GPU when one of the GPU's SLOTS_PER_GPU slots is free and, where another slot is
held, the GPU's memory holds it too: max(the memory nvidia-smi sees used, the memory graphdoctor's holders
reserved) plus the child's estimate must stay within MEMORY_HEADROOM of the GPU's total. nvidia-smi's figure counts
every process on the GPU, other users' included; the reservations count graphdoctor's children that have not
allocated theirs yet. The first child on a GPU always may start, so a child larger than the estimate allows still
runs (alone) rather than waiting forever.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from graphdoctor.parent.gpus import MAX_CHILDREN_PER_GPU, MEMORY_HEADROOM

RUNTIME_ENV = "GRAPHDOCTOR_RUNTIME_DIR"
"""Where the slot files live, when set (tests; a cluster's node-local directory); else $XDG_RUNTIME_DIR/graphdoctor,
else <tmp>/graphdoctor-<uid>."""
SLOTS_ENV = "GRAPHDOCTOR_SLOTS_PER_GPU"
"""Children that may use one GPU at once, machine-wide (default SLOTS_PER_GPU)."""
SLOTS_PER_GPU = MAX_CHILDREN_PER_GPU
"""Children on one GPU at once across every graphdoctor process of the host: as many as one diff plans at most.
Six diffs of eight children each on one H200 failed NCCL's set-up together."""
POLL_S = 0.5
"""How often a waiting child looks for a free slot."""
MEMORY_POLL_S = 2.0
"""How long one reading of the GPU's used memory stands (nvidia-smi takes tens of milliseconds)."""
TAKE_LOCK = "take.lock"
"""The file whose flock makes one taker at a time read the holders and write its record (held for microseconds,
never while waiting)."""
MAX_HOLDER_BYTES = 4096
"""The most of a slot file read: what a holder writes is a short JSON object."""


def runtime_dir() -> Path:
    """This user's directory of slot files (made, owner-only, when missing)."""
    given = os.environ.get(RUNTIME_ENV)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if given:
        root = Path(given)
    elif xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
        root = Path(xdg) / "graphdoctor"
    else:
        root = Path(tempfile.gettempdir()) / f"graphdoctor-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def physical_gpus(device: str | None) -> list[str]:
    """The GPUs a child placed on `device` uses, as nvidia-smi names them: the device entry ("0", a UUID, "0,1" for
    a multi-GPU child), else the first GPU this process sees (CUDA_VISIBLE_DEVICES' first entry, or 0)."""
    if device:
        return [d.strip() for d in device.split(",") if d.strip()]
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[:1] or ["0"]


def slots_per_gpu() -> int:
    """SLOTS_ENV where it is a positive integer, else SLOTS_PER_GPU."""
    text = os.environ.get(SLOTS_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else SLOTS_PER_GPU


@dataclass(frozen=True, slots=True)
class Holder:
    """What a held slot's file says of the child that uses it."""

    pid: int
    """The graphdoctor process that holds it (the child's parent)."""
    bytes: int
    """GPU memory reserved for the child (graphdoctor.parent.gpus.child_bytes)."""
    what: str
    """The child, e.g. `local graphed`."""


@dataclass(frozen=True, slots=True)
class Busy:
    """Why no slot could be taken just now."""

    holders: tuple[Holder, ...]
    memory: bool
    """A slot was free, but the GPU's memory would not hold the child beside the others."""

    def describe(self, device: str) -> str:
        """`waiting for a GPU slot: 2 other graphdoctor runs on GPU 0 (5 children)`, for the progress line."""
        mine = os.getpid()
        others = {h.pid for h in self.holders if h.pid != mine}
        runs = f"{len(others)} other graphdoctor run{'s' if len(others) != 1 else ''}" if others else \
            "this run's other children"
        why = "memory for one more child" if self.memory else "a free slot"
        return (f"waiting for a GPU slot: {runs} on GPU {device} ({len(self.holders)} "
                f"child{'ren' if len(self.holders) != 1 else ''}; waiting for {why})")


class Slot:
    """A held slot: its file stays locked until release() (or the process's exit)."""

    def __init__(self, device: str, index: int, fd: int) -> None:
        self.device, self.index = device, index
        self._fd: int | None = fd
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_holder(fd: int) -> Holder | None:
    try:
        raw = os.pread(fd, MAX_HOLDER_BYTES, 0)
        data = json.loads(raw.decode("utf-8")) if raw else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return Holder(pid=int(data.get("pid", 0)), bytes=max(0, int(data.get("bytes", 0))),
                      what=str(data.get("what", ""))[:200])
    except (TypeError, ValueError):
        return None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class HostSlots:
    """The slots of one GPU on this host.

    Args:
        device: the GPU as nvidia-smi and CUDA_VISIBLE_DEVICES name it (an index or a UUID).
        memory: (total bytes, used bytes) of the GPU now, or None where unknown (no nvidia-smi): then only the
            slot count limits.
        limit: slots of the GPU (default slots_per_gpu()).
        root: the runtime directory (default runtime_dir()).
    """

    def __init__(self, device: str, memory: Callable[[], tuple[int, int] | None] | None = None, *,
                 limit: int | None = None, root: Path | None = None) -> None:
        self.device = str(device)
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.device) or "0"
        self.folder = (root or runtime_dir()) / f"gpu-{safe}"
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.limit = limit or slots_per_gpu()
        self._memory = memory
        self._memory_at = 0.0
        self._memory_now: tuple[int, int] | None = None

    def _used(self) -> tuple[int, int] | None:
        if self._memory is None:
            return None
        now = time.monotonic()
        if now - self._memory_at >= MEMORY_POLL_S:
            self._memory_now, self._memory_at = self._memory(), now
        return self._memory_now

    def _open(self, index: int) -> int:
        return os.open(self.folder / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)

    def holders(self) -> list[Holder]:
        """What every held slot of the GPU says (a slot being taken this instant may read as empty)."""
        found: list[Holder] = []
        for index in range(self.limit):
            fd = self._open(index)
            try:
                if _try_lock(fd):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    continue
                holder = _read_holder(fd)
                found.append(holder if holder is not None else Holder(pid=0, bytes=0, what=""))
            finally:
                os.close(fd)
        return found

    def try_take(self, need_bytes: int, what: str, headroom: float = MEMORY_HEADROOM) -> Slot | Busy:
        """A slot for a child that needs `need_bytes` of GPU memory, or why there is none now (beside other holders,
        the need must fit in `headroom` of the GPU's total: MEMORY_HEADROOM for an estimate, more for a measured
        figure, graphdoctor.parent.sizing).

        The look at the other holders and the writing of this one's record happen under the GPU's take lock, so two
        takers (threads or processes) never each read the other's slot as empty and both fit beside it."""
        guard = os.open(self.folder / TAKE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            return self._try_take(need_bytes, what, headroom)
        finally:
            os.close(guard)  # closing the last descriptor of the open file drops its lock

    def _try_take(self, need_bytes: int, what: str, headroom: float) -> Slot | Busy:
        free: tuple[int, int] | None = None
        held: list[Holder] = []
        for index in range(self.limit):
            fd = self._open(index)
            if _try_lock(fd):
                if free is None:
                    free = (index, fd)
                    continue
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                holder = _read_holder(fd)
                held.append(holder if holder is not None else Holder(pid=0, bytes=0, what=""))
            os.close(fd)
        if free is None:
            return Busy(tuple(held), memory=False)
        index, fd = free
        memory = self._used() if held else None
        if memory is not None:
            total, used = memory
            reserved = sum(h.bytes for h in held)
            if total and max(used, reserved) + need_bytes > total * headroom:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                return Busy(tuple(held), memory=True)
        record = json.dumps({"pid": os.getpid(), "bytes": int(need_bytes), "what": what[:200],
                             "since": round(time.time(), 3)}).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        return Slot(self.device, index, fd)

    def take(self, need_bytes: int, what: str, *, cancelled: Callable[[], bool] = lambda: False,
             waiting: Callable[[str], None] | None = None, poll_s: float = POLL_S,
             headroom: float = MEMORY_HEADROOM) -> Slot | None:
        """Wait for a slot (try_take, every `poll_s`), telling `waiting` why whenever that changes; None when
        `cancelled()` turns true first."""
        said = ""
        while True:
            got = self.try_take(need_bytes, what, headroom)
            if isinstance(got, Slot):
                return got
            if cancelled():
                return None
            line = got.describe(self.device)
            if waiting is not None and line != said:
                waiting(line)
                said = line
            time.sleep(poll_s)


class HostTurn:
    """A child's slots on every GPU it uses, taken in the GPUs' order (so two children never each hold one that
    the other waits for) and held until release(); one claim serves the diff child's memory grant, an ungated
    child and a probe worker alike.

    Args:
        hosts: the slots of each GPU the child uses.
        need_bytes: the child's memory estimate on each of them.
        what: the child, as its slot file names it.
        waiting: told why the child waits, whenever that changes.
        headroom: share of each GPU's memory the holders may plan to use (HostSlots.try_take).
    """

    def __init__(self, hosts: list[HostSlots], need_bytes: int, what: str,
                 waiting: Callable[[str], None] | None = None, headroom: float = MEMORY_HEADROOM) -> None:
        self._hosts = sorted(hosts, key=lambda h: h.device)
        self._need, self._what, self._waiting, self._headroom = need_bytes, what, waiting, headroom
        self._taken: list[Slot] = []

    @classmethod
    def on(cls, devices: list[str], need_bytes: int, what: str,
           waiting: Callable[[str], None] | None = None, headroom: float = MEMORY_HEADROOM) -> HostTurn:
        """The claim on these GPUs (nvidia-smi names), their memory read by nvidia-smi."""
        from graphdoctor.parent.gpus import gpu_memory

        return cls([HostSlots(d, memory=functools.partial(gpu_memory, d)) for d in devices], need_bytes, what,
                   waiting, headroom)

    def take(self, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Wait for a slot on each GPU; False (nothing held) when `cancelled()` turns true first."""
        for host in self._hosts:
            slot = host.take(self._need, self._what, cancelled=cancelled, waiting=self._waiting,
                             headroom=self._headroom)
            if slot is None:
                self.release()
                return False
            self._taken.append(slot)
        return True

    def release(self) -> None:
        """Give every slot back (idempotent)."""
        while self._taken:
            self._taken.pop().release()


__all__ = ["RUNTIME_ENV", "SLOTS_ENV", "SLOTS_PER_GPU", "Busy", "Holder", "HostSlots", "HostTurn", "Slot",
           "physical_gpus", "runtime_dir", "slots_per_gpu"]
