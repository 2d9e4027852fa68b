"""Summary, sites, block diff, leak suspects and timeline on synthetic torch-2.11-layout snapshots.

The snapshots here are synthetic (graphdoctor.memory.synthetic); test_memory_fixtures.py runs the
same analyses on snapshots recorded on an H200.
"""

from __future__ import annotations

import pytest

from graphdoctor.errors import InputFileError
from graphdoctor.memory.blockdiff import diff_blocks, leak_suspects
from graphdoctor.memory.model import Frame, parse_snapshot
from graphdoctor.memory.phases import phase_stats, timeline
from graphdoctor.memory.sites import NO_FRAMES, SiteNamer, is_user_frame, user_frames_first
from graphdoctor.memory.summary import by_pool, largest_free_blocks, top_sites, totals
from graphdoctor.memory.synthetic import SnapshotBuilder, graphed_run

TORCH = ("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125, "forward")
USER = ("/work/train.py", 40, "step")
MAIN = ("/work/train.py", 90, "main")


@pytest.mark.parametrize(
    ("filename", "user"),
    [
        ("/work/train.py", True),
        ("/root/graphdoctor/fixtures/record_memory.py", True),
        ("/root/graphdoctor/graphdoctor/memory/recorder.py", False),
        ("/root/graphdoctor/graphdoctor/config/diff_config.py", False),
        ("/usr/lib/python3/dist-packages/numpy/core.py", False),
        ("/opt/Megatron-LM/megatron/core/transformer/attention.py", False),
        ("/venv/lib/python3.12/site-packages/torch/nn/functional.py", False),
        ("/src/pytorch/torch/cuda/graphs.py", False),
        ("/root/.pyenv/versions/3.12.1/lib/python3.12/contextlib.py", False),
        ("<frozen runpy>", False),
        ("/pytorch/c10/cuda/CUDACachingAllocator.cpp", False),
        ("??", False),
    ],
)
def test_is_user_frame(filename: str, user: bool) -> None:
    assert is_user_frame(Frame(filename, 1, "f")) is user


def test_site_folding_and_all_frames() -> None:
    frames = (Frame(*TORCH), Frame(*USER), Frame(*MAIN))
    assert SiteNamer().site(frames) == "work/train.py:40 step"
    full = SiteNamer(all_frames=True).site(frames)
    assert full.startswith("modules/linear.py:125 forward <- work/train.py:40 step")
    assert SiteNamer().site(()) == NO_FRAMES
    assert SiteNamer().site((Frame(*TORCH),)).startswith("<no user frame>")
    assert user_frames_first(frames)[0] == Frame(*USER)


def test_totals_pools_sites_free_blocks() -> None:
    _, _, after = graphed_run(num_replay_steps=3, leak_bytes=1 << 20)
    snap = parse_snapshot(after)
    t = totals(snap)
    assert t.graph_pool_reserved_bytes == 20 << 20
    assert 0 < t.allocated_over_reserved < 1
    pools = {g.key: g for g in by_pool(snap)}
    assert pools["graph 1,0"].live_bytes == 18 << 20
    assert sum(g.reserved_bytes for g in pools.values()) == t.reserved_bytes
    sites = {s.site: s for s in top_sites(snap, SiteNamer())}
    assert sites["work/train.py:52 train_step"].live_bytes == 3 << 20
    assert sites["work/train.py:52 train_step"].num_blocks == 3
    free = largest_free_blocks(snap, limit=3)
    assert [f.size_bytes for f in free] == sorted((f.size_bytes for f in free), reverse=True)


def test_block_diff_new_freed_resized_replaced() -> None:
    b = SnapshotBuilder()
    kept = b.alloc(4 << 20, frames=[TORCH, USER])
    gone = b.alloc(4 << 20, frames=[TORCH, USER])
    grows = b.alloc(2 << 20, frames=[USER])
    before = parse_snapshot(b.build())
    b.free(grows)
    assert b.alloc(3 << 20, frames=[USER]) == grows  # same address, bigger: resized
    b.free(gone)
    b.free(kept)
    assert b.alloc(4 << 20, frames=[MAIN]) == kept  # same address and size, new owner: replaced
    b.alloc(2 << 20, frames=[MAIN], pool=(0, 1))
    after = parse_snapshot(b.build())
    diff = diff_blocks(before, after, SiteNamer())
    t = diff.total
    assert (t.num_new, t.num_freed, t.num_resized) == (2, 2, 1)
    assert t.new_bytes == 6 << 20 and t.freed_bytes == 8 << 20 and t.resized_delta_bytes == 1 << 20
    assert t.net_bytes == (after_live := totals(after).live_bytes) - totals(before).live_bytes
    assert after_live > 0
    assert {g.key for g in diff.by_pool} == {"default", "graph 0,1"}
    assert diff.num_segments_new == 1


def test_leak_suspects_from_real_growth_only() -> None:
    _, captured, leaky = graphed_run(num_replay_steps=5, leak_bytes=1 << 20)
    suspects = leak_suspects(parse_snapshot(captured), parse_snapshot(leaky), SiteNamer())
    assert suspects[0].site == "work/train.py:52 train_step"
    assert suspects[0].growth_bytes == 5 << 20
    assert leak_suspects(parse_snapshot(captured), parse_snapshot(captured), SiteNamer()) == ()


def test_timeline_is_absolute_and_tagged() -> None:
    _, _, after = graphed_run(num_replay_steps=4)
    snap = parse_snapshot(after)
    tl = timeline(snap)
    assert tl.color_by == "phase"
    assert tl.labels == ("eager", "warmup", "capture", "replay")
    assert tl.allocated_bytes[-1] == totals(snap).live_bytes
    assert min(tl.allocated_bytes) >= 0
    small = timeline(snap, max_points=10)
    assert len(small.event_index) <= 10
    assert max(small.allocated_bytes) == max(tl.allocated_bytes)  # bucket maxima keep the peak
    stats = {p.phase: p for p in phase_stats(snap)}
    assert stats["capture"].alloc_bytes == 18 << 20


def test_timeline_by_pool_without_tags() -> None:
    b = SnapshotBuilder()
    b.alloc(1 << 20, frames=[USER])
    b.alloc(3 << 20, frames=[USER], pool=(1, 0))
    tl = timeline(parse_snapshot(b.build()))
    assert tl.color_by == "pool"
    assert set(tl.labels) == {"default", "graph 1,0"}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["segments"][0].pop("blocks"), r"segments\[0\]: field 'blocks' missing"),
        (lambda s: s["segments"][0].update(total_size="big"), r"segments\[0\].total_size"),
        (lambda s: s["segments"][0].update(segment_pool_id="x"), "segment_pool_id"),
        (lambda s: s["segments"][0]["blocks"][0].update(size=-1), r"blocks\[0\].size"),
        (lambda s: s.update(device_traces="no"), "device_traces"),
    ],
)
def test_parse_names_the_bad_field(mutate, message: str) -> None:  # noqa: ANN001
    b = SnapshotBuilder()
    b.alloc(512, frames=[USER])
    raw = b.build()
    mutate(raw)
    with pytest.raises(InputFileError, match=message):
        parse_snapshot(raw)
