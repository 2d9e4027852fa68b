"""Concurrency from measured memory (graphdoctor/parent/sizing.py): the first estimate sizes the first children, an
ended child's own figures re-size the rest, with the figures of a recorded H200 diff of a full-width 2-layer
Llama-3 8B launch line (seq 8192, bf16): its estimate ran the children in series, its children measured 44-46 GiB."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.parent.children import ChildRequest, ChildSession
from graphdoctor.parent.gpus import MEMORY_HEADROOM, Gpu, child_bytes, plan_jobs
from graphdoctor.parent.sizing import (
    MEASURED_HEADROOM,
    MEASURED_MARGIN,
    OUTSIDE_ALLOCATOR_BYTES,
    ChildMemory,
    SlotPool,
    kind_of,
    measured_bytes,
)
from graphdoctor.parent.slots import RUNTIME_ENV, Busy, HostSlots, Slot
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import Role

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "fixtures" / "data" / "diff" / "h200_llama3_8b_line_schema2.json"
GIB = 1 << 30
H200 = Gpu(device_id="0", total_bytes=143771 << 20, used_bytes=4 << 20)
CARD_100 = Gpu(device_id="0", total_bytes=100 << 30, used_bytes=0)
H100 = Gpu(device_id="0", total_bytes=81079 << 20, used_bytes=4 << 20)
"""An idle H200 as nvidia-smi reports it (memory.total 143771 MiB)."""


@pytest.fixture(scope="module")
def llama() -> dict:
    return json.loads(LLAMA.read_text(encoding="utf-8"))


def _records(report: dict) -> tuple[RunRecord, RunRecord]:
    """The eager reference and the transformer_engine child of the recorded diff."""
    return RunRecord.from_dict(report["reference"]), RunRecord.from_dict(report["impls"][0]["runs"][0])


def test_a_childs_figure_is_its_largest_reserved_because_reserved_holds_the_graph_pools(llama: dict) -> None:
    eager, graphed = _records(llama)
    # eager: reserved 45566918656 (= its peak reserved), peak allocated 39933444096, no graph pools
    assert measured_bytes(eager) == 45566918656 + OUTSIDE_ALLOCATOR_BYTES
    # transformer_engine: reserved 46217035776 with its pool's 7639924736 inside it; its peak allocated
    # 39933444096 counts the blocks in that pool too, so the two are not added
    assert graphed.memory is not None and graphed.memory.report is not None
    pools = sum(p.reserved_bytes for p in graphed.memory.report.graph_pools)
    assert pools == 7639924736
    assert measured_bytes(graphed) == 46217035776 + OUTSIDE_ALLOCATOR_BYTES
    assert graphed.peak_allocated_bytes is not None and graphed.end_reserved_bytes is not None
    assert graphed.peak_allocated_bytes + pools > graphed.end_reserved_bytes  # the sum would over-count


@pytest.mark.parametrize("name", ["h100_gpu_init_forked.json.gz", "h100_readme_default.json.gz"])
def test_every_recorded_graphed_child_reserved_less_than_peak_allocated_plus_pools(name: str) -> None:
    """The allocator's reserved figure already holds the pools: each recorded graphed child's peak reserved lies
    between its peak allocated and that sum, and is what measured_bytes takes."""
    report = json.loads(gzip.decompress((LLAMA.parent / name).read_bytes()))
    seen = 0
    for row in report["impls"]:
        for data in row["runs"]:
            record = RunRecord.from_dict(data)
            if record.memory is None or record.memory.report is None or not record.memory.report.graph_pools:
                continue
            peak_reserved = record.memory.stats.peak_reserved_bytes
            pools = sum(p.reserved_bytes for p in record.memory.report.graph_pools)
            assert record.peak_allocated_bytes is not None and peak_reserved is not None
            assert record.peak_allocated_bytes <= peak_reserved < record.peak_allocated_bytes + pools
            assert measured_bytes(record) == max(peak_reserved, record.end_reserved_bytes or 0) + OUTSIDE_ALLOCATOR_BYTES
            seen += 1
    assert seen >= 2


def test_a_child_without_memory_figures_measures_nothing() -> None:
    assert measured_bytes(RunRecord(impl="local", dropout=0.0, status="error")) is None


def test_the_largest_measured_figure_with_its_margin_replaces_the_estimate(llama: dict) -> None:
    eager, graphed = _records(llama)
    memory = ChildMemory(100 * GIB)
    assert (memory.need().bytes, memory.need().measured, memory.need().headroom) == (100 * GIB, False,
                                                                                      MEMORY_HEADROOM)
    first = memory.observe(eager)
    assert first is not None and first.measured and first.headroom == MEASURED_HEADROOM
    assert first.bytes == int(measured_bytes(eager) * MEASURED_MARGIN)  # type: ignore[operator]
    larger = memory.observe(graphed)
    assert larger is not None and larger.bytes == int(measured_bytes(graphed) * MEASURED_MARGIN)  # type: ignore[operator]
    assert memory.observe(eager) is None  # a smaller figure changes nothing
    assert memory.measured_by == graphed.name or graphed.impl


def test_a_multi_gpu_childs_estimate_is_shared_out_but_its_rank_figures_are_per_gpu(llama: dict) -> None:
    eager, _ = _records(llama)
    memory = ChildMemory(100 * GIB, num_processes=2)
    assert memory.need().bytes == 50 * GIB
    measured = memory.observe(eager)
    assert measured is not None and measured.bytes == int(measured_bytes(eager) * MEASURED_MARGIN)  # type: ignore[operator]


def test_the_recorded_llama_diffs_children_fit_two_at_a_time_by_estimate_and_by_measure(llama: dict) -> None:
    """The recorded diff of two full-width Llama-3 8B layers ran in series: the estimate then said 117 GiB, against
    the 44-45 GiB its children measured. Without the unfused attention's terms for Transformer Engine's fused
    attention, and with the logits, the estimate is 48 GiB (eager) and 52 GiB (graphed): two at once on an H200."""
    config = DiffConfig.from_dict(llama["config"])
    assert llama["jobs"].startswith("children run in series: one needs about 117 GiB")
    plan = plan_jobs(config.replace(jobs=4), [H200])
    assert (plan.jobs, plan.gpus, plan.shared, plan.most) == (2, ("0",), True, 4)
    assert plan.reason == ("up to 2 children at a time on one GPU (about 48 GiB per eager child and 52 GiB per "
                           "graphed one of 119 GiB free)")
    eager, graphed = _records(llama)
    assert measured_bytes(eager) < child_bytes(config, graphed=False)  # type: ignore[operator]
    assert measured_bytes(graphed) < child_bytes(config)  # type: ignore[operator]
    memory = ChildMemory(child_bytes(config), 1, child_bytes(config, graphed=False))
    need = memory.observe(graphed)
    assert need is not None and need.fits(plan.total_bytes, plan.used_bytes, plan.most) == 2
    assert need.fits(plan.total_bytes, plan.used_bytes, 1) == 1  # --jobs stays the ceiling


def test_jobs_one_still_runs_in_series_without_re_sizing() -> None:
    plan = plan_jobs(DiffConfig(jobs=1), [H200])
    assert (plan.jobs, plan.shared, plan.most) == (1, False, 1)


def test_the_pool_grows_at_once_and_shrinks_as_slots_in_use_come_back() -> None:
    pool = SlotPool(["0"], 1)
    first = pool.get()
    pool.resize(3)
    assert pool.size == 3 and [pool.get(), pool.get()] == ["0", "0"]
    pool.resize(1)  # all three in use: each one that comes back is dropped until one is left
    pool.put(first)
    pool.put("0")
    assert pool._queue.qsize() == 0
    pool.put("0")
    assert pool._queue.qsize() == 1 and pool.size == 1


def test_a_session_re_sizes_its_memory_slots_from_the_first_measured_child(llama: dict, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "runtime"))
    # Four sequences a micro-batch: the estimate (81 GiB) runs one at a time; the recorded child's figure fits two.
    config = DiffConfig.from_dict(llama["config"]).replace(jobs=4, micro_batch_size=4)
    session = ChildSession(config, tmp_path, plan=plan_jobs(config, [H200]))
    assert session.memory_gated and session._slots.size == 1 and session.starts >= 4
    _, graphed = _records(llama)
    session.measured(graphed)
    assert session._slots.size == 2
    assert session.jobs_line.endswith(f"; 2 at a time once {graphed.name or graphed.impl} measured about "
                                      f"{int(measured_bytes(graphed) * MEASURED_MARGIN) / GIB:.1f} GiB per child")  # type: ignore[operator]
    turn = session.host_turn(ChildRequest(impl="local", dropout=0.0, role=Role.GRAPHED, ref_dir=tmp_path), "0")
    assert (turn._need, turn._headroom) == (session.memory.need().bytes, MEASURED_HEADROOM)
    assert turn._need < child_bytes(config)


def test_an_ungated_session_keeps_its_plan(llama: dict, tmp_path: Path) -> None:
    session = ChildSession(DiffConfig(), tmp_path)
    _, graphed = _records(llama)
    session.measured(graphed)
    assert session._slots.size == 1 and session.resized is None


def test_a_measured_need_may_use_more_of_the_gpu_beside_other_holders(tmp_path: Path) -> None:
    slots = HostSlots("0", memory=lambda: (H200.total_bytes, 0), root=tmp_path, limit=4)
    need = 55 * GIB
    first = slots.try_take(need, "eager reference")
    assert isinstance(first, Slot)
    assert isinstance(slots.try_take(need, "local graphed", MEMORY_HEADROOM), Slot)  # 110 GiB < 0.85 of 140
    assert isinstance(slots.try_take(need, "local tapped", MEMORY_HEADROOM), Busy)
    second = slots.try_take(10 * GIB, "full_iteration graphed", MEASURED_HEADROOM)  # 120 GiB < 0.95 of 140
    assert isinstance(second, Slot)


def test_a_gpu_other_processes_fill_is_said_as_what_they_hold_not_a_negative_free() -> None:
    """A GPU whose memory another process holds beyond the headroom (the H100 environment test: 77.7 of 79.6 GiB)
    plans one child at a time and says what is free and what others hold, never a negative figure."""
    hogged = Gpu(device_id="0", total_bytes=81559 << 20, used_bytes=79565 << 20)
    plan = plan_jobs(DiffConfig(hidden_size=4096, num_attention_heads=32, vocab_size=128256, seq_length=4096),
                     [hogged])
    assert plan.jobs == 1
    assert "-" not in plan.reason.split("GiB of", 1)[1], plan.reason
    assert "1.9 GiB free: other processes hold 77.7 GiB of 79.6 GiB" in plan.reason, plan.reason


SIZE_054B = DiffConfig(num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=2048, micro_batch_size=2,
                       dtype="bf16", vocab_size=32000)
"""tests/benchmarks/diff_cost.py's 0.54 B size."""


def test_an_eager_childs_estimate_leaves_out_the_graph_pools_copy_of_the_activations() -> None:
    graphed, eager = child_bytes(SIZE_054B), child_bytes(SIZE_054B, graphed=False)
    assert (round(graphed / GIB, 1), round(eager / GIB, 1)) == (34.0, 24.9)
    assert child_bytes(SIZE_054B.replace(num_layers=16)) - child_bytes(SIZE_054B.replace(num_layers=16), graphed=False) \
        == 2 * (graphed - eager)  # the activations, once


def test_the_plan_counts_slots_by_the_smaller_eager_need_and_says_both() -> None:
    plan = plan_jobs(SIZE_054B.replace(jobs=8), [H200])
    assert plan.jobs == 4  # 119 GiB free / 24.9 GiB; three at 34.0 GiB each
    assert plan.reason == ("up to 4 children at a time on one GPU (about 25 GiB per eager child and 34 GiB per "
                           "graphed one of 119 GiB free)")


def test_the_defaults_first_four_children_fit_one_h200_by_kind_and_the_next_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At dropout 0.1 a diff of local and full_iteration asks for eager, local, full_iteration, then the control
    pairs' eager, local and full_iteration (dropout 0), then the tapped pair: by kind the first four fit in 0.85 of an
    H200 (2 x 24.9 + 2 x 34.0 GiB: 117.8 GiB of 119 GiB); the next wait until one ends."""
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "runtime"))
    config = SIZE_054B.replace(jobs=8)
    session = ChildSession(config, tmp_path, plan=plan_jobs(config, [H200]))
    slots = HostSlots("0", memory=lambda: (H200.total_bytes, 0), root=tmp_path / "host", limit=8)
    order = [("eager", 0.1), ("local", 0.1), ("full_iteration", 0.1), ("eager", 0.0), ("local", 0.0),
             ("full_iteration", 0.0)]
    taken = []
    for impl, dropout in order:
        role = Role.REFERENCE if impl == "eager" else Role.GRAPHED
        turn = session.host_turn(ChildRequest(impl=impl, dropout=dropout, role=role, ref_dir=tmp_path), "0")
        taken.append(slots.try_take(turn._need, f"{impl} d{dropout}", turn._headroom))
    assert [isinstance(t, Slot) for t in taken] == [True] * 4 + [False] * 2
    assert isinstance(taken[-1], Busy) and taken[-1].memory


SIZE_108B = SIZE_054B.replace(num_layers=4, hidden_size=4096, num_attention_heads=32, seq_length=4096,
                              micro_batch_size=1)
"""tests/benchmarks/diff_cost.py's 1.08 B size."""


def test_a_smaller_child_asked_later_takes_the_memory_a_graphed_one_cannot_use_yet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 0.54 B with dropout 0.1 on a card of 100 GiB the diff asks for eager, local and full_iteration, then the
    control pair's eager and local (dropout 0). The plan gives three slots (85 GiB / 24.9 GiB per eager child);
    eager and local claim 58.9 GiB, so full_iteration's 34.0 GiB waits. It waits without holding a slot of the
    session, and the control pair's eager child (24.9 GiB) starts beside the first two instead of a round later."""
    import threading

    from graphdoctor.parent.children import MemoryGrant
    from graphdoctor.parent.slots import HostTurn

    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "runtime"))
    config = SIZE_054B.replace(jobs=8)
    plan = plan_jobs(config, [CARD_100])
    assert plan.jobs == 3, plan.reason
    session = ChildSession(config, tmp_path, plan=plan)
    order = [("eager", 0.1), ("local", 0.1), ("full_iteration", 0.1), ("eager", 0.0), ("local", 0.0)]
    grants = []
    for number, (impl, dropout) in enumerate(order):
        role = Role.REFERENCE if impl == "eager" else Role.GRAPHED
        need = session.host_turn(ChildRequest(impl=impl, dropout=dropout, role=role, ref_dir=tmp_path), "0")
        host = HostSlots("0", memory=lambda: (CARD_100.total_bytes, 0), root=tmp_path / "host", limit=8)
        grants.append(MemoryGrant(session._slots, tmp_path / f"gate-{number}",
                                  HostTurn([host], need._need, f"{impl} d{dropout}", headroom=need._headroom)))
        grants[-1].granted.wait(2.0)  # the session asks for them one after another
    threading.Event().wait(1.5)  # three polls of the waiting grants
    assert [g.granted.is_set() for g in grants] == [True, True, False, True, False]
    grants[0].release()
    grants[1].release()  # the first two ended: one more graphed child fits beside the control eager
    threading.Event().wait(1.5)
    assert [grants[2].granted.is_set(), grants[4].granted.is_set()].count(True) == 1
    for grant in grants:
        grant.release()


def test_two_108b_eager_children_do_not_share_an_h100_before_one_has_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H100 80GB the 1.08 B eager reference ran out of memory at its step 1 beside another eager child of the
    same diff (38 and 41 GiB in use of 79.2 GiB, 2026-12-07): the estimate then said 33.3 GiB each, which two fit
    in 0.85 of the card. It says 44.6 GiB now, against 41.5 GiB measured on the H200, so one runs at a time."""
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "runtime"))
    config = SIZE_108B.replace(jobs=8)
    plan = plan_jobs(config, [H100])
    assert plan.jobs == 1, plan.reason
    session = ChildSession(config, tmp_path, plan=plan)
    slots = HostSlots("0", memory=lambda: (H100.total_bytes, 0), root=tmp_path / "host", limit=8)
    taken = []
    for dropout in (0.1, 0.0):
        turn = session.host_turn(ChildRequest(impl="eager", dropout=dropout, role=Role.REFERENCE, ref_dir=tmp_path),
                                 "0")
        taken.append(slots.try_take(turn._need, f"eager d{dropout}", turn._headroom))
    assert isinstance(taken[0], Slot) and isinstance(taken[1], Busy) and taken[1].memory


H100_108B = REPO / "fixtures" / "data" / "diff" / "h100_108b_defaults_after_estimate.json.gz"
"""`graphdoctor diff --impl local,full_iteration` at tests/benchmarks/diff_cost.py's 1.08 B size with the defaults
on an H100 80GB (2026-12-07), after the estimate gained the logits, the fp32 softmax and the optimizer's
temporaries: its seven children ran one at a time and every row has its verdict."""


def test_the_h100_108b_diff_ran_one_at_a_time_and_its_children_measured_within_the_estimate() -> None:
    from graphdoctor.diff import load_report

    report = load_report(H100_108B)
    assert report.jobs.startswith("one child at a time until one has measured its memory")
    assert [r.verdict.value for r in report.results] == ["rng-divergence", "match"] and report.exit_code() == 0
    runs = report.runs()
    assert len(runs) == 7 and {r.status for r in runs} == {"ok"}
    config = report.config
    for run in runs:
        estimate = child_bytes(config, graphed=kind_of(run.impl) == "graphed")
        assert measured_bytes(run) <= 1.01 * estimate, run.name  # type: ignore[operator]
    eager = max(measured_bytes(r) for r in runs if kind_of(r.impl) == "eager")  # type: ignore[type-var]
    assert 2 * eager > 0.85 * H100.total_bytes  # two eager children would not have fitted beside each other


def test_a_kind_not_measured_yet_takes_the_others_figure_scaled_up_never_down(llama: dict) -> None:
    """The Llama line's transformer_engine child measured 45 GiB while the eager estimate says 73 GiB and the graphed
    one 117 GiB: the eager need becomes the measured figure (not scaled down by 73/117, which would fall short of the
    eager child's own 44 GiB); an eager figure measured first raises the graphed need by the estimates' ratio."""
    eager, graphed = _records(llama)
    config = DiffConfig.from_dict(llama["config"])
    estimates = (child_bytes(config), 1, child_bytes(config, graphed=False))
    memory = ChildMemory(*estimates)
    memory.observe(graphed)
    assert memory.need("eager").bytes == memory.need("graphed").bytes \
        == int(measured_bytes(graphed) * MEASURED_MARGIN)  # type: ignore[operator]
    assert memory.need("eager").bytes > int(measured_bytes(eager))  # type: ignore[arg-type]
    memory.observe(eager)
    assert memory.need("eager").bytes == int(measured_bytes(eager) * MEASURED_MARGIN)  # type: ignore[operator]
    first_eager = ChildMemory(*estimates)
    first_eager.observe(eager)
    ratio = child_bytes(config) / child_bytes(config, graphed=False)
    assert first_eager.need("graphed").bytes == int(measured_bytes(eager) * ratio * MEASURED_MARGIN)  # type: ignore[operator]
    assert first_eager.smallest() == first_eager.need("eager")
