"""Checkpoint save and resume (`--save-at S`, `--resume`) on the CPU: the options and their errors, the
specs of a run's two processes, the events of both (real encode and decode) stitched into one run
record, the verdict and the phase `resume` of a difference after the resume in the terminal and JSON
reports, and Megatron-Core's sharded state dict of a real GPT model built on the CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.compare.phases import phase_list, phases_summary, resumed_steps
from graphdoctor.compare.verdict import judge
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.diff import load_report
from graphdoctor.errors import UsageError
from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.resume import (
    RESUMED_PREFIX,
    checkpoint_dir,
    clear_checkpoint,
    first_process,
    resumed_process,
    saves,
    stitched,
)
from graphdoctor.parent.runner import ProcessResult
from graphdoctor.protocol import (
    Checkpoint,
    ChildSpec,
    End,
    Error,
    EventWriter,
    Role,
    RunRecord,
    Started,
    Step,
    decode,
    encode,
    read_events,
    run_name,
)
from graphdoctor.protocol.events import Hazard, Phase, RunEnv, Teardown
from graphdoctor.types import Verdict

REPORT = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "diff" / "h200_small_dropout0_fingerprints_schema2.json"
SAVE_AT = 4
"""The checkpoint after 4 training steps (0-based steps 0-3); the resumed process trains steps 4-6."""


def recorded(impl: str) -> RunRecord:
    """A real run of the H200 diff fixture (7 steps, dropout 0, warmup 2): eager or a graphed one."""
    report = load_report(REPORT)
    if impl == "eager":
        return report.reference
    return next(r for r in report.results if r.impl == impl).runs[0]


def spec_of(impl: str, tmp_path: Path, **changes: object) -> ChildSpec:
    config = DiffConfig(impls=("local", "full_iteration"), dropout=0.0, steps=7, save_at=SAVE_AT, resume=True)
    role = Role.REFERENCE if impl == "eager" else Role.GRAPHED
    name = run_name(impl, 0.0, role)
    spec = ChildSpec(impl=impl, dropout=0.0, config=config, role=role, name=name,
                     events_path=str(tmp_path / f"events-{name}.jsonl"), reference_dir=str(tmp_path / "ref"))
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def write_process(path: Path, run: RunRecord, steps: range, *, resumed: bool) -> None:
    """The events one process of a resumed run writes, through the real writer: its steps of `run`
    (phases as the child's loop computes them in that process), the save or the load, end, teardown."""
    from graphdoctor.child.loop import phase_of

    writer = EventWriter(path)
    writer.emit(Started(env=RunEnv(torch="2.11.0", pid=1000 + int(resumed))))
    if resumed:
        writer.emit(Phase(phase="resume", step=SAVE_AT))
        writer.emit(Checkpoint(action="load", iteration=SAVE_AT, seconds=0.25))
    for s in (s for s in run.steps if s.step in steps):
        phase = phase_of(run.impl, s.step - steps.start, 2)
        writer.emit(Step(record=dataclasses.replace(s, phase=phase, resumed=resumed)))
    if not resumed:
        writer.emit(Phase(phase="checkpoint", step=SAVE_AT - 1))
        writer.emit(Checkpoint(action="save", iteration=SAVE_AT, seconds=0.5))
    writer.emit(Hazard(rule="GD511", module="decoder.layers.0", message="seen in both processes"))
    writer.emit(End(train_s=1.0, compare_s=0.1, setup_s=2.0))
    writer.emit(Teardown(rank=0, seconds=0.01, since_last_step_s=0.02))
    writer.close()


def ended(wall_s: float) -> ProcessResult:
    return ProcessResult(returncode=0, timed_out=False, wall_s=wall_s, log_tail="")


def resumed_run(impl: str, tmp_path: Path, run: RunRecord | None = None) -> RunRecord:
    """The record of a --resume run folded from its two processes' events files."""
    run = run if run is not None else recorded(impl)
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = spec_of(impl, tmp_path)
    directory = checkpoint_dir(tmp_path, spec.name)
    first = first_process(spec, directory)
    later = resumed_process(dataclasses.replace(spec, name=spec.name + "-resumed",
                                                events_path=str(tmp_path / f"events-{spec.name}-resumed.jsonl")),
                            directory)
    write_process(Path(first.events_path), run, range(0, SAVE_AT), resumed=False)
    write_process(Path(later.events_path), run, range(SAVE_AT, 7), resumed=True)
    return stitched(record_from_events(first, read_events(first.events_path), ended(10.0)),
                    record_from_events(later, read_events(later.events_path), ended(8.0)))


def test_save_at_and_resume_reach_diff_config_from_flags_and_run_files(tmp_path: Path) -> None:
    config = diff_config_from(None, save_at=4, resume=True, steps=7)
    assert (config.save_at, config.resume) == (4, True)
    assert DiffConfig.from_dict(config.to_dict()) == config
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  steps: 7\n  save_at: 3\n  resume: true\n")
    from_file = diff_config_from(load_run_file(path))
    assert (from_file.save_at, from_file.resume) == (3, True)
    assert DiffConfig().save_at == 0 and DiffConfig().resume is False


@pytest.mark.parametrize(("changes", "message"), [
    ({"save_at": 8}, "save_at: got 8, expected 0 (none) or 1 to steps - 1 (7)"),
    ({"save_at": -1}, "save_at: got -1, expected 0 (none) or 1 to steps - 1 (7)"),
    ({"save_at": True}, "save_at: got True"),
    ({"resume": True}, "resume: got true without save_at, expected --save-at S"),
])
def test_bad_save_and_resume_values_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DiffConfig(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "needle"), [
    (["diff", "--resume"], "resume: got true without save_at"),
    (["diff", "--save-at", "8"], "save_at: got 8"),
    (["diff", "--save-at", "0", "--resume"], "resume: got true without save_at"),
    (["diff", "--save-at", "x"], "'x' is not a valid integer"),
])
def test_bad_flags_are_one_line_exit_2(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert needle in result.output and "Traceback" not in result.output
    assert len([ln for ln in result.output.splitlines() if ln.strip()]) == 1, result.output


def test_run_file_range_of_save_at_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  steps: 7\n  save_at: -2\n")
    with pytest.raises(UsageError, match=r"run.yaml:3: run.save_at: expected an integer >= 0, got -2"):
        load_run_file(path)


def test_help_and_the_pytest_plugin_take_the_options() -> None:
    from graphdoctor.pytest_plugin import MARKER_KWARGS

    out = CliRunner().invoke(main, ["diff", "--help"]).output
    assert "--save-at S" in out and "--resume / --no-resume" in out
    assert {"save_at", "resume"} <= MARKER_KWARGS  # @pytest.mark.graphdoctor(save_at=4, resume=True)


def test_which_children_save_and_the_specs_of_both_processes(tmp_path: Path) -> None:
    spec = spec_of("local", tmp_path)
    assert saves(spec.config, Role.GRAPHED, None) and saves(spec.config, Role.REFERENCE, SAVE_AT)
    assert not saves(spec.config, Role.REFERENCE, SAVE_AT - 1)  # a re-run that ends before the save
    assert not saves(spec.config, Role.TAPPED, None) and not saves(spec.config, Role.COUNT, None)
    assert not saves(spec.config.replace(save_at=0, resume=False), Role.GRAPHED, None)
    directory = checkpoint_dir(tmp_path, spec.name)
    assert directory == tmp_path / "checkpoint-local-graphed-d0"
    first = first_process(spec, directory)
    assert (first.checkpoint_dir, first.stop_after, first.resumed) == (str(directory), SAVE_AT - 1, False)
    assert not first.config.launches and spec.config.launches
    saving_only = first_process(dataclasses.replace(spec, config=spec.config.replace(resume=False)), directory)
    assert saving_only.stop_after is None  # --save-at alone: save and train on in the same process
    later = resumed_process(spec, directory)
    assert later.resumed and later.stop_after is None and later.checkpoint_dir == str(directory)
    assert ChildSpec.from_json(later.to_json()) == later
    assert run_name("local", 0.0, Role.GRAPHED, resumed=True) == "local-graphed-d0-resumed"


def test_checkpoint_and_resume_events_round_trip() -> None:
    for event in (Checkpoint(action="save", iteration=4, seconds=0.5), Phase(phase="resume", step=4)):
        assert decode(encode(event)) == event
    step = dataclasses.replace(recorded("local").steps[5], resumed=True)
    line = encode(Step(record=step))
    assert '"resumed": true' in line and decode(line) == Step(record=step)


def test_two_processes_are_one_run_with_every_step_in_order(tmp_path: Path) -> None:
    run = resumed_run("full_iteration", tmp_path)
    assert run.status == "ok" and run.name == "full_iteration-graphed-d0"
    assert [s.step for s in run.steps] == list(range(7))
    assert [s.phase for s in run.steps] == ["warmup", "warmup", "capture", "replay", "warmup", "warmup", "capture"]
    assert [s.step for s in resumed_steps(run)] == [4, 5, 6]
    assert [(c.action, c.iteration) for c in run.checkpoints] == [("save", 4), ("load", 4)]
    assert run.wall_s == 18.0 and run.train_s == 2.0 and len(run.teardown) == 2 and len(run.hazards) == 1
    assert phase_list(run) == ("warmup", "capture", "replay", "checkpoint", "resume")
    assert phases_summary(run)["steps_after_resume"] == {"warmup": 2, "capture": 1}
    again = RunRecord.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again.checkpoints == run.checkpoints and [s.resumed for s in again.steps] == [s.resumed for s in run.steps]


def test_a_failed_first_process_is_the_run_and_a_failed_resume_names_its_step(tmp_path: Path) -> None:
    spec = spec_of("local", tmp_path)
    path = tmp_path / "events-first.jsonl"
    writer = EventWriter(path)
    writer.emit(Error(error_type="CheckpointError", message="checkpoint directory is not empty", step=3,
                      phase="checkpoint"))
    writer.close()
    failed = record_from_events(spec, read_events(path), ProcessResult(returncode=3, timed_out=False, wall_s=1.0,
                                                                        log_tail=""))
    ok = resumed_run("local", tmp_path)
    assert stitched(failed, ok) is failed
    load_failed = dataclasses.replace(failed, diagnosis=dataclasses.replace(failed.diagnosis, phase="resume"))  # type: ignore[arg-type]
    run = stitched(ok, load_failed)
    assert run.status == "error" and run.diagnosis is not None and run.diagnosis.phase == "resume"
    assert run.diagnosis.message.startswith(f"{RESUMED_PREFIX} 4: checkpoint directory")


@pytest.mark.parametrize("impl", ["local", "full_iteration"])
def test_resumed_runs_that_agree_match(impl: str, tmp_path: Path) -> None:
    eager = resumed_run("eager", tmp_path / "eager")
    graphed = resumed_run(impl, tmp_path / impl)
    result = judge(eager, graphed, warmup_steps=2)
    assert result.verdict == Verdict.MATCH, result
    assert "resume" in result.to_dict()["phases"] and "checkpoint" in result.to_dict()["phases"]


def test_a_difference_after_the_resume_names_phase_resume(tmp_path: Path) -> None:
    eager = resumed_run("eager", tmp_path / "eager")
    real = recorded("local")
    changed = dataclasses.replace(real, steps=tuple(dataclasses.replace(s, loss=s.loss + 0.25) if s.step == 5 else s
                                                    for s in real.steps))
    result = judge(eager, resumed_run("local", tmp_path / "local", changed), warmup_steps=2)
    assert result.verdict == Verdict.NUMERIC_DIVERGENCE
    assert result.divergence is not None and (result.divergence.step, result.divergence.what) == (5, "loss")
    note = next(n for n in result.notes if n.startswith("phase resume"))
    assert "at step 5 (replay in the new process), 2 step(s) into the process resumed from the checkpoint " \
           "saved after step 3" in note
    before = dataclasses.replace(real, steps=tuple(dataclasses.replace(s, loss=s.loss + 0.25) if s.step == 2 else s
                                                   for s in real.steps))
    early = judge(eager, resumed_run("local", tmp_path / "early", before), warmup_steps=2)
    assert not any(n.startswith("phase resume") for n in early.notes)


def test_terminal_and_json_reports_list_the_checkpoint_and_the_resume(tmp_path: Path) -> None:
    from graphdoctor.report.diff import render_text, write_json

    report = load_report(REPORT)
    reference = resumed_run("eager", tmp_path / "eager")
    results = tuple(dataclasses.replace(r, runs=(resumed_run(r.impl, tmp_path / r.impl), *r.runs[1:]))
                    for r in report.results)
    report = dataclasses.replace(report, reference=reference, results=results,
                                 config=report.config.replace(save_at=SAVE_AT, resume=True))
    text = render_text(report)
    assert ("  phases local: capture 2, replay 5; checkpoint after step 3 (0.50 s); resume at step 4 "
            "(load 0.25 s; capture 1, replay 2 in the new process)") in text
    assert "  phases full_iteration: warmup 4, capture 2, replay 1; checkpoint after step 3" in text
    path = write_json(report, tmp_path / "report.json")
    payload = json.loads(path.read_text())
    impl = payload["impls"][0]
    assert impl["phases"] == ["capture", "replay", "checkpoint", "resume"]
    steps = impl["runs"][0]["steps"]
    assert [s["resumed"] for s in steps] == [False] * 4 + [True] * 3
    assert [(s["step"], s["phase"]) for s in steps if s["resumed"]] == [(4, "capture"), (5, "replay"), (6, "replay")]
    assert impl["runs"][0]["checkpoints"] == [{"action": "save", "iteration": 4, "seconds": 0.5},
                                              {"action": "load", "iteration": 4, "seconds": 0.25}]


def test_clear_checkpoint_removes_only_what_dist_checkpointing_writes(tmp_path: Path) -> None:
    ours = tmp_path / "checkpoint-local-graphed-d0"
    ours.mkdir()
    for name in ("__0_0.distcp", "common.pt", ".metadata", "metadata.json"):
        (ours / name).write_bytes(b"x")
    clear_checkpoint(ours)
    assert not ours.exists()
    theirs = tmp_path / "checkpoint-eager-reference-d0"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    clear_checkpoint(theirs)
    assert (theirs / "notes.txt").read_text() == "mine"
    clear_checkpoint(tmp_path / "missing")


SHARDED = textwrap.dedent("""
    import os, sys, torch
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    from graphdoctor.child import checkpoint
    from graphdoctor.child.megatron_setup import build_probe_model
    from graphdoctor.config import DiffConfig
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    config = DiffConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=128)
    model, _ = build_probe_model(config, device="cpu")
    state = checkpoint.sharded_state(model, None, iteration=4, loading=False)
    print("keys", sorted(state))
    names = {n for n, p in model.named_parameters()}
    print("params", len(names), sum(1 for k, v in state["model"].items() if k in names and isinstance(v, ShardedTensor)))
    print("layers", state["model"]["decoder.layers.1.mlp.linear_fc1.weight"].key,
          state["model"]["decoder.layers.1.mlp.linear_fc1.weight"].global_offset[0])
    rng = state["rng_state"]
    print("rng", isinstance(rng, ShardedObject), rng.key, rng.global_shape, rng.global_offset, sorted(rng.data[0]))
    target = sys.argv[1]
    os.makedirs(target)
    open(os.path.join(target, "input.txt"), "w").write("x")
    try:
        checkpoint.save(target, model, None, iteration=4)
    except checkpoint.CheckpointError as exc:
        print("refused", str(exc).startswith("checkpoint directory"), os.listdir(target))
    import random
    saved = checkpoint.rng_state()
    drawn = (random.random(), torch.rand(3))
    checkpoint.restore_rng_state(saved)
    print("restored", random.random() == drawn[0] and torch.equal(torch.rand(3), drawn[1]))
    other, _ = build_probe_model(config.replace(seed=7), device="cpu")
    loading = checkpoint.sharded_state(other, None, iteration=4, loading=True)
    print("missing", sorted(set(other.state_dict()) - set(loading["model"])))
    checkpoint.load_model_state(other, {k: v.data for k, v in state["model"].items()
                                        if isinstance(v, ShardedTensor)})
    print("loaded", all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values())
                        if isinstance(a, torch.Tensor)))
    try:
        checkpoint.load_model_state(other, {k: v.data for k, v in state["model"].items()
                                            if isinstance(v, ShardedTensor) and not k.startswith("output_layer")})
    except checkpoint.CheckpointError as exc:
        print("unfit", str(exc))
    import multiprocessing
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    with checkpoint._write_queue_stopped():
        filesystem_async.get_write_results_queue()  # what the save's writer starts (a spawned server)
        print("during", len(multiprocessing.active_children()))
    print("after", len(multiprocessing.active_children()), filesystem_async._results_queue)
""")


def test_megatron_sharded_state_of_a_real_gpt_model_on_the_cpu(tmp_path: Path) -> None:
    # A process of its own: the process group and model-parallel state must not leak into other tests.
    # dist_checkpointing.save itself needs CUDA (its writer calls torch.cuda.synchronize before
    # writing), so the save and load run in tests/gpu/test_schedule_gpu.py.
    proc = subprocess.run([sys.executable, "-c", SHARDED, str(tmp_path / "target")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["keys"] == "['checkpoint_version', 'iteration', 'model', 'rng_state']"
    count, matched = lines["params"].split()
    assert int(count) > 0 and matched == count
    assert lines["layers"] == "decoder.layers.mlp.linear_fc1.weight 1"  # layers stacked, as Megatron saves them
    assert lines["rng"] == "True rng_state (1, 1) (0, 0) ['cpu', 'cuda', 'random', 'tracker']"
    assert lines["refused"] == "True ['input.txt']"
    assert lines["restored"] == "True"
    # what a strict load of the sharded state dict would trip on, and what the load accepts
    assert lines["missing"] == "['output_layer._extra_state']"
    assert lines["loaded"] == "True"
    assert lines["unfit"] == "checkpoint does not fit the model: missing ['output_layer.weight'], unexpected []"
    # the writer's Manager process is stopped after the save: a child ends with os._exit
    assert (lines["during"], lines["after"]) == ("1", "0 None")


def test_the_resumed_load_lets_te_read_its_own_fp8_extra_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transformer Engine refuses the pickled delayed-scaling state of a checkpoint unless its opt-in variable is 1
    (TE 2.20, _extra_state.py); the resumed process's load sets it for the load alone and puts it back after."""
    from graphdoctor.child.checkpoint import TE_PICKLED_STATE_ENV, own_extra_state

    monkeypatch.delenv(TE_PICKLED_STATE_ENV, raising=False)
    with own_extra_state():
        assert os.environ[TE_PICKLED_STATE_ENV] == "1"
    assert TE_PICKLED_STATE_ENV not in os.environ
    monkeypatch.setenv(TE_PICKLED_STATE_ENV, "0")
    with pytest.raises(RuntimeError), own_extra_state():
        raise RuntimeError("a load that fails")
    assert os.environ[TE_PICKLED_STATE_ENV] == "0"
