"""Synthetic snapshots in the exact torch 2.11 `_snapshot()` layout, built without a GPU.

SnapshotBuilder imitates the caching allocator closely enough for tests, docs and benchmarks:
segments per pool and stream, first-fit block splitting, frame dicts shared between entries, and a
device trace with `user_metadata` phase tags. The numbers are synthetic, the layout is real.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

_SMALL_LIMIT = 1 << 20
_SMALL_SEGMENT = 2 << 20
_LARGE_SEGMENT = 20 << 20
_ROUND = 512

FrameSpec = tuple[str, int, str]
"""(filename, line, function name), innermost first in a stack."""


@dataclass
class _Seg:
    raw: dict[str, Any]
    blocks: list[dict[str, Any]] = field(default_factory=list)


class SnapshotBuilder:
    """Build a snapshot dict step by step: alloc, free, set_phase, then build()."""

    def __init__(self, *, device: int = 0, base_address: int = 0x7F0000000000) -> None:
        self.device = device
        self._next_address = base_address
        self._segments: list[_Seg] = []
        self._trace: list[dict[str, Any]] = []
        self._frames: dict[FrameSpec, dict[str, Any]] = {}
        self._phase = ""
        self._time_us = 1_000_000

    def set_phase(self, name: str) -> None:
        """Tag later trace entries with user_metadata=name (as _set_memory_metadata does)."""
        self._phase = name

    def _frame_list(self, frames: list[FrameSpec]) -> list[dict[str, Any]]:
        out = []
        for spec in frames:
            if spec not in self._frames:
                self._frames[spec] = {"filename": spec[0], "line": spec[1], "name": spec[2]}
            out.append(self._frames[spec])
        return out

    def _record(self, action: str, addr: int, size: int, stream: int, frames: list[FrameSpec]) -> None:
        self._time_us += 7
        self._trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": stream,
                "time_us": self._time_us,
                "frames": self._frame_list(frames),
                "compile_context": "N/A",
                "user_metadata": self._phase,
            }
        )

    def _new_segment(self, size: int, pool: tuple[int, int], stream: int, frames: list[FrameSpec]) -> _Seg:
        small = size <= _SMALL_LIMIT
        seg_size = _SMALL_SEGMENT if small else max(_LARGE_SEGMENT, -(-size // _SMALL_SEGMENT) * _SMALL_SEGMENT)
        address = self._next_address
        self._next_address += seg_size + (1 << 21)
        raw = {
            "device": self.device,
            "address": address,
            "total_size": seg_size,
            "allocated_size": 0,
            "active_size": 0,
            "requested_size": 0,
            "stream": stream,
            "segment_type": "small" if small else "large",
            "segment_pool_id": pool,
            "is_expandable": False,
            "frames": self._frame_list(frames),
            "blocks": [],
        }
        seg = _Seg(raw, [{"address": address, "size": seg_size, "requested_size": 0, "state": "inactive", "frames": []}])
        self._segments.append(seg)
        self._record("segment_alloc", address, seg_size, stream, frames)
        return seg

    def alloc(
        self,
        size: int,
        *,
        frames: list[FrameSpec],
        pool: tuple[int, int] = (0, 0),
        stream: int = 0,
    ) -> int:
        """Allocate size bytes (rounded to 512) from pool/stream; returns the block address."""
        rounded = max(_ROUND, -(-size // _ROUND) * _ROUND)
        small = rounded <= _SMALL_LIMIT
        for seg in self._segments:
            raw = seg.raw
            if raw["segment_pool_id"] != pool or raw["stream"] != stream or (raw["segment_type"] == "small") != small:
                continue
            for i, block in enumerate(seg.blocks):
                if block["state"] == "inactive" and block["size"] >= rounded:
                    return self._place(seg, i, rounded, size, frames)
        seg = self._new_segment(rounded, pool, stream, frames)
        return self._place(seg, 0, rounded, size, frames)

    def _place(self, seg: _Seg, index: int, rounded: int, size: int, frames: list[FrameSpec]) -> int:
        block = seg.blocks[index]
        if block["size"] > rounded:
            rest = {"address": block["address"] + rounded, "size": block["size"] - rounded,
                    "requested_size": 0, "state": "inactive", "frames": []}
            seg.blocks.insert(index + 1, rest)
        block.update(size=rounded, requested_size=size, state="active_allocated", frames=self._frame_list(frames))
        self._record("alloc", block["address"], rounded, seg.raw["stream"], frames)
        return int(block["address"])

    def free(self, address: int, *, frames: list[FrameSpec] | None = None) -> None:
        """Free the live block at address (free_requested then free_completed); merges neighbours."""
        for seg in self._segments:
            for block in seg.blocks:
                if block["address"] == address and block["state"] != "inactive":
                    stream = seg.raw["stream"]
                    self._record("free_requested", address, block["size"], stream, frames or [])
                    self._record("free_completed", address, block["size"], stream, frames or [])
                    block.update(state="inactive", requested_size=0, frames=[])
                    self._merge(seg)
                    return
        raise KeyError(f"no live block at {address:#x}")

    @staticmethod
    def _merge(seg: _Seg) -> None:
        merged: list[dict[str, Any]] = []
        for block in seg.blocks:
            if merged and block["state"] == "inactive" and merged[-1]["state"] == "inactive":
                merged[-1]["size"] += block["size"]
            else:
                merged.append(block)
        seg.blocks = merged

    def build(self) -> dict[str, Any]:
        """The snapshot dict (a deep copy: the builder can keep going and build again)."""
        segments = []
        for seg in self._segments:
            raw = dict(seg.raw)
            raw["blocks"] = seg.blocks
            live = [b for b in seg.blocks if b["state"] != "inactive"]
            raw["allocated_size"] = sum(b["size"] for b in live if b["state"] == "active_allocated")
            raw["active_size"] = sum(b["size"] for b in live)
            raw["requested_size"] = sum(b["requested_size"] for b in live)
            segments.append(raw)
        snapshot = {
            "segments": segments,
            "device_traces": [self._trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
            "external_annotations": [],
        }
        # deepcopy keeps the sharing of frame dicts inside one snapshot, as torch's pickles do.
        return copy.deepcopy(snapshot)


_TORCH_LINEAR = ("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125, "forward")
_TORCH_ADAM = ("/opt/venv/lib/python3.12/site-packages/torch/optim/adam.py", 410, "_multi_tensor_adam")
_USER_MODEL = ("/work/train.py", 21, "__init__")
_USER_STEP = ("/work/train.py", 40, "train_step")
_USER_LEAK = ("/work/train.py", 52, "train_step")
_USER_MAIN = ("/work/train.py", 90, "main")


def graphed_run(*, num_replay_steps: int = 6, leak_bytes: int = 0) -> tuple[dict[str, Any], ...]:
    """Three snapshots of a synthetic graphed run: before capture, after capture, after replays.

    Args:
        num_replay_steps: Replay steps, tagged 'replay:<step>'.
        leak_bytes: When > 0, every replay step keeps one new tensor of this size alive.

    Returns:
        (before_capture, after_capture, after_replays) snapshot dicts in the torch 2.11 layout.
    """
    b = SnapshotBuilder()
    b.set_phase("eager")
    for _ in range(4):
        b.alloc(8 << 20, frames=[_TORCH_LINEAR, _USER_MODEL, _USER_MAIN])
    b.set_phase("warmup")
    for _ in range(3):
        tmp = b.alloc(6 << 20, frames=[_TORCH_LINEAR, _USER_STEP, _USER_MAIN])
        b.free(tmp)
    before = b.build()
    b.set_phase("capture")
    for _ in range(3):
        b.alloc(6 << 20, frames=[_TORCH_LINEAR, _USER_STEP, _USER_MAIN], pool=(1, 0), stream=0x5A5A)
    after_capture = b.build()
    for step in range(num_replay_steps):
        b.set_phase(f"replay:{step}")
        tmp = b.alloc(2 << 20, frames=[_TORCH_ADAM, _USER_STEP, _USER_MAIN])
        b.free(tmp)
        if leak_bytes:
            b.alloc(leak_bytes, frames=[_USER_LEAK, _USER_MAIN])
    b.set_phase("replay:last")
    b.alloc(4, frames=[_USER_STEP, _USER_MAIN])  # the last step's loss, kept for logging
    b.set_phase("")
    return before, after_capture, b.build()


__all__ = ["FrameSpec", "SnapshotBuilder", "graphed_run"]
