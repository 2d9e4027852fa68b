"""Where a child's start-up and set-up go (graphdoctor.protocol.seconds.STAGE_NAMES): the child times each stage of
the one set-up path, its end event carries them, the parent folds them into the child's seconds and the report's cost
line shows their mean per child."""

from __future__ import annotations

import types
from typing import Any

import pytest

from graphdoctor.config import DiffConfig
from graphdoctor.parent.timeline import cost_line, stage_costs
from graphdoctor.protocol.events import End, decode, encode
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.seconds import STAGE_NAMES, ChildSeconds, StageClock
from graphdoctor.protocol.spec import ChildSpec, Role


def test_a_stage_counts_its_seconds_even_when_it_raises_and_adds_up_when_run_twice() -> None:
    clock = StageClock()
    clock.add("model", 1.5)
    with pytest.raises(RuntimeError), clock.stage("model"):
        raise RuntimeError("Megatron refused it")
    clock.add("ddp", -1.0)  # a clock step backwards never counts
    assert clock.seconds["model"] >= 1.5 and clock.seconds["ddp"] == 0.0


def test_the_end_event_carries_the_stages_and_the_seconds_round_trip_and_add_up() -> None:
    end = End(train_s=1.0, compare_s=0.1, setup_s=7.0, startup_s=16.0,
              stages={"interpreter": 2.0, "imports": 14.0, "model": 5.0})
    assert decode(encode(end)) == end
    first = ChildSeconds(startup_s=16.0, setup_s=7.0, stages={"imports": 14.0, "model": 5.0})
    second = ChildSeconds(startup_s=15.0, setup_s=6.0, stages={"interpreter": 1.0, "imports": 13.0})
    assert ChildSeconds.from_dict(first.to_dict()) == first
    assert first.plus(second).stages == {"imports": 27.0, "model": 5.0, "interpreter": 1.0}
    assert ChildSeconds.from_dict({"startup_s": 3.0}).stages == {}  # reports written before stages


def _run(name: str, stages: dict[str, float]) -> RunRecord:
    return RunRecord(impl="eager", dropout=0.0, status="ok", name=name, wall_s=30.0,
                     seconds=ChildSeconds(stages=stages))


def test_the_cost_line_shows_each_stage_mean_per_child_in_set_up_order() -> None:
    runs = [_run("a", {"model": 4.0, "imports": 12.0, "interpreter": 2.0, "ddp": 0.01}),
            _run("b", {"model": 6.0, "imports": 10.0, "optimizer": 1.0})]
    assert list(stage_costs(runs)) == ["interpreter", "imports", "model", "ddp", "optimizer"]
    text = cost_line(None, runs, "")
    assert "start-up and set-up per child: interpreter 2.0 s, imports 11.0 s, model 5.0 s, optimizer 1.0 s" in text
    assert "ddp" not in text  # under 0.05 s a child
    assert "set-up per child" not in cost_line(None, [_run("c", {})], "")


def test_the_set_up_path_times_each_of_its_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphdoctor.child import megatron_setup

    fake: Any = types.SimpleNamespace(cuda_graph_warmup_steps=2)
    for name, value in {"require_transformer_engine": None, "init_distributed": None, "seed_everything": None,
                        "build_model": object(), "wrap_ddp": object(), "build_optimizer": object()}.items():
        monkeypatch.setattr(megatron_setup, name, lambda *a, _v=value, **k: _v)
    monkeypatch.setattr(megatron_setup, "restrict_graph_layers", lambda *a: None)
    monkeypatch.setattr(megatron_setup.rank_setup, "sync_hooks", lambda config, model, run: model)
    monkeypatch.setattr(megatron_setup.build, "described_transformer_config", lambda model, impl: fake)
    monkeypatch.setattr("megatron.core.pipeline_parallel.get_forward_backward_func", lambda: print)
    config = DiffConfig(impls=("local",), steps=4, gpu_init=False)  # the fake config has no init methods
    spec = ChildSpec(impl="local", dropout=0.0, config=config, role=Role.GRAPHED, name="x",
                     events_path="events.jsonl", reference_dir=".")
    clock = StageClock()
    setup = megatron_setup.build_setup(spec, clock)
    assert setup.forward_backward is print and setup.te_helper is None
    assert set(clock.seconds) == {"megatron_args", "distributed", "model", "ddp", "optimizer", "graphs"}
    assert set(clock.seconds) <= set(STAGE_NAMES)


@pytest.mark.parametrize(("forked", "stage"), [(True, "template"), (False, "interpreter")])
def test_a_forked_child_counts_its_wait_as_template_and_a_started_one_as_interpreter(
        monkeypatch: pytest.MonkeyPatch, forked: bool, stage: str) -> None:
    import time

    from graphdoctor.child import entry

    monkeypatch.setattr(entry, "FORKED", forked)
    clock = StageClock()
    now = time.time()
    entry.count_start(clock, now - 2.0, now - 11.0)
    assert set(clock.seconds) == {stage, "imports"} and set(clock.seconds) <= set(STAGE_NAMES)
    assert clock.seconds[stage] == pytest.approx(9.0) and clock.seconds["imports"] == pytest.approx(2.0, abs=0.5)
