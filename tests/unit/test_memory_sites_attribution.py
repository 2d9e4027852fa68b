"""Memory growth names the user's site, not graphdoctor's (issue 15, deliver 6).

The stacks are real: taken from the Megatron snapshot recorded on the H200 by diff's child
(fixtures/data/memory/megatron/snapshot-local-d0.1-after_replays.pickle.gz), where graphdoctor's own
frames (then under graphdoctor/harness/) drive Megatron. None of the recorded snapshots holds a
planted leak under diff's child, so the leak is constructed in the same torch 2.11 snapshot layout
(graphdoctor.memory.synthetic.SnapshotBuilder) as diff's memory observer records it: history over
two replay steps tagged `replay:<step>`; per step graphdoctor's synthetic batch (2 MiB, real stack)
and the user's forward hook (1 MiB: the real Megatron stack under a user hook frame) stay alive.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.memory.blockdiff import leak_suspects
from graphdoctor.memory.leaks import analyze_run
from graphdoctor.memory.loader import load_snapshot
from graphdoctor.memory.model import Frame, frames_from_raw, parse_snapshot
from graphdoctor.memory.sites import (
    GRAPHDOCTOR_SITE,
    NO_USER_FRAME,
    SiteNamer,
    frame_kind,
    is_graphdoctor_site,
)
from graphdoctor.memory.summary import top_sites
from graphdoctor.memory.synthetic import FrameSpec, SnapshotBuilder

SNAPSHOT = (Path(__file__).resolve().parents[2]
            / "fixtures/data/memory/megatron/snapshot-local-d0.1-after_replays.pickle.gz")
HOOK = ("/work/proj/leaky_hook.py", 14, "keep_activation")
HOOK_SITE = "proj/leaky_hook.py:14 keep_activation"


def recorded_stacks() -> dict[tuple[str, ...], tuple[Frame, ...]]:
    """One replay-step allocation stack per combination of frame kinds, from the H200 snapshot."""
    raw = load_snapshot(SNAPSHOT)
    stacks: dict[tuple[str, ...], tuple[Frame, ...]] = {}
    for entry in raw["device_traces"][0]:
        if entry["action"] == "alloc" and str(entry.get("user_metadata") or "").startswith("replay"):
            frames = frames_from_raw(entry.get("frames") or [])
            stacks.setdefault(tuple(sorted({frame_kind(f) for f in frames})), frames)
    return stacks


def spec(frames: tuple[Frame, ...]) -> list[FrameSpec]:
    return [(f.filename, f.line, f.name) for f in frames]


@pytest.fixture(scope="module")
def stacks() -> dict[tuple[str, ...], tuple[Frame, ...]]:
    return recorded_stacks()


def test_recorded_stacks_are_graphdoctor_driving_megatron(stacks: dict) -> None:
    own, megatron = stacks[("graphdoctor", "runtime")], stacks[("graphdoctor", "library", "runtime")]
    assert any("graphdoctor/harness/" in f.filename for f in own)
    namer = SiteNamer()
    # no user frame in either; Megatron's allocation is Megatron's site, graphdoctor's is labelled so
    assert namer.site(megatron) == "pipeline_parallel/schedules.py:749 forward_backward_no_pipelining"
    assert namer.site(own) == f"{GRAPHDOCTOR_SITE} harness/build.py:206 synthetic_batch"
    assert is_graphdoctor_site(namer.site(own)) and not is_graphdoctor_site(namer.site(megatron))


def diff_child_run(stacks: dict, *, leak: bool) -> tuple[dict, dict, dict]:
    own = spec(stacks[("graphdoctor", "runtime")])
    megatron = spec(stacks[("graphdoctor", "library", "runtime")])
    b = SnapshotBuilder()
    b.set_phase("warmup:0")
    b.alloc(8 << 20, frames=megatron)
    before = b.build()
    b.set_phase("capture:2")
    b.alloc(6 << 20, frames=megatron, pool=(1, 0), stream=0x5A5A)
    captured = b.build()
    for step in (3, 4):
        b.set_phase(f"replay:{step}")
        tmp = b.alloc(4 << 20, frames=megatron)
        b.free(tmp)
        b.alloc(2 << 20, frames=own)  # graphdoctor's batch of this step, still referenced
        if leak:
            b.alloc(1 << 20, frames=[HOOK, *megatron])
    return before, captured, b.build()


def analyze(snaps: tuple[dict, dict, dict]):
    return analyze_run(*snaps, num_replay_steps=2, eager_peak_allocated_bytes=None,
                       eager_peak_reserved_bytes=None, peak_allocated_bytes=20 << 20,
                       peak_reserved_bytes=40 << 20)


def test_summary_and_first_site_are_the_users_hook(stacks: dict) -> None:
    report = analyze(diff_child_run(stacks, leak=True))
    assert report.verdict == "growth"
    first = report.unfreed_replay_sites[0]
    assert (first.site, first.is_suspect, first.num_steps, first.live_bytes) == (HOOK_SITE, True, 2, 2 << 20)
    assert f"top {HOOK_SITE}" in report.summary()
    assert NO_USER_FRAME not in report.summary()
    last = report.unfreed_replay_sites[-1]
    assert is_graphdoctor_site(last.site) and last.live_bytes == 4 << 20  # larger, yet never first


def test_graphdoctor_own_growth_never_leads(stacks: dict) -> None:
    report = analyze(diff_child_run(stacks, leak=False))
    assert all(is_graphdoctor_site(s.site) for s in report.unfreed_replay_sites)
    assert "of graphdoctor's own" in report.summary()
    assert "top" not in report.summary()


def test_triage_ranks_the_users_site_first(stacks: dict) -> None:
    _, captured, after = diff_child_run(stacks, leak=True)
    namer = SiteNamer()
    suspects = leak_suspects(parse_snapshot(captured), parse_snapshot(after), namer)
    assert suspects[0].site == HOOK_SITE
    assert is_graphdoctor_site(suspects[-1].site)
    top = top_sites(parse_snapshot(after), namer)
    assert not is_graphdoctor_site(top[0].site)
    assert is_graphdoctor_site(top[-1].site)


def test_two_recorded_steps_without_growth_flag_nothing(stacks: dict) -> None:
    # a buffer alive from both steps while the run's live bytes do not grow: not a leak
    before, captured, after = diff_child_run(stacks, leak=True)
    report = analyze_run(before, captured, after, num_replay_steps=2, eager_peak_allocated_bytes=None,
                         eager_peak_reserved_bytes=None, peak_allocated_bytes=1, peak_reserved_bytes=1,
                         replay_live_bytes=[100 << 20, 100 << 20, 100 << 20])
    assert report.verdict == "ok"
    assert not any(s.is_suspect for s in report.unfreed_replay_sites)
