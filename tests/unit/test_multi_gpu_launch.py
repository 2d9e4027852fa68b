"""Multi-GPU diff on the CPU: placement refusals, the GPU plan, the launcher's command line and
environment, each rank's events folded into one record and judged rank by rank, the one-line CLI
behaviour under a user's torchrun, and a real torch.distributed.run launch of two child ranks (which
fail where CUDA is first needed, each into its own events file)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphdoctor.child.entry import ChildRun
from graphdoctor.child.loop import LoopState
from graphdoctor.cli import main
from graphdoctor.compare.bitprint import BitFingerprinter, host_lanes
from graphdoctor.compare.verdict import judge
from graphdoctor.config import DiffConfig, diff_config_from
from graphdoctor.errors import UsageError
from graphdoctor.installed import apex_importable
from graphdoctor.parent.children import ChildSession
from graphdoctor.parent.gpus import Gpu, plan_jobs
from graphdoctor.parent.launch import (
    MULTICAST_OFF_ENV,
    fold_launch,
    launch_command,
    launch_env,
    multi_gpu_placement,
    run_launched,
)
from graphdoctor.parent.ranks import RANK_STATUS_ORDER
from graphdoctor.parent.runner import ProcessResult
from graphdoctor.parent.static import installation_refusals
from graphdoctor.protocol import EAGER, ChildSpec, EventWriter, Role, RunRecord, run_name
from graphdoctor.protocol.events import End, RunEnv, Started, Step, Tensors
from graphdoctor.protocol.record import split_rank
from graphdoctor.protocol.spec import rank_path
from graphdoctor.protocol.steps import StepPrints, StepRecord
from graphdoctor.report.diff import placement_line
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.types import Verdict

TP2 = {"nproc_per_node": 2, "tensor_model_parallel_size": 2}


@pytest.mark.parametrize(("values", "message"), [
    ({"nproc_per_node": 2, "tensor_model_parallel_size": 4}, "4 x pipeline_model_parallel_size 1 = 4 does not divide "
                                                            "nproc_per_node 2"),
    ({"nproc_per_node": 3, "tensor_model_parallel_size": 3}, "num_attention_heads 8 is not divisible by "
                                                            "tensor_model_parallel_size 3"),
    ({**TP2, "transformer": {"num_query_groups": 1}}, "num_query_groups 1 is not divisible"),
    ({"nproc_per_node": 2, "pipeline_model_parallel_size": 2, "num_layers": 3}, "num_layers 3 is not divisible"),
    ({"nproc_per_node": 2, "sequence_parallel": True}, "sequence_parallel needs tensor_model_parallel_size > 1"),
    ({"nproc_per_node": 0}, "nproc_per_node: got 0, expected an integer >= 1"),
    ({"ddp_bucket_size": 0}, "ddp_bucket_size: got 0"),
])
def test_bad_placements_are_refused_in_one_line(values: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        DiffConfig(**values)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_a_bad_placement_exits_2_before_any_gpu_work() -> None:
    result = CliRunner().invoke(main, ["diff", "--nproc-per-node", "2", "--tensor-model-parallel-size", "2",
                                       "--pipeline-model-parallel-size", "2", "-q"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1].endswith("= 4 does not divide nproc_per_node 2")


def test_good_placements_and_run_file_keys(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("run:\n  nproc_per_node: 2\n  pipeline_model_parallel_size: 2\n  num_microbatches: 2\n"
                   "  use_distributed_optimizer: true\n  overlap_grad_reduce: true\n  ddp_bucket_size: 100000\n",
                   encoding="utf-8")
    from graphdoctor.config import load_run_file

    config = diff_config_from(load_run_file(run))
    assert (config.nproc_per_node, config.pipeline_model_parallel_size, config.ddp_bucket_size) == (2, 2, 100000)
    assert config.use_distributed_optimizer and config.overlap_grad_reduce
    assert DiffConfig.from_dict(config.to_dict()) == config
    assert placement_line(config).startswith("  2 processes per run: TP 1, PP 2, DP 1, overlap_grad_reduce, "
                                             "distributed optimizer, bucket 100000;")
    # fewer microbatches than stages: Megatron's non-interleaved schedule warms up min(P - rank - 1, M)
    assert DiffConfig(nproc_per_node=2, pipeline_model_parallel_size=2, num_microbatches=1).num_microbatches == 1


def gpus(count: int) -> list[Gpu]:
    return [Gpu(device_id=str(i), total_bytes=140 << 30, used_bytes=0) for i in range(count)]


def test_gpu_plan_gives_each_multi_gpu_child_its_own_gpus() -> None:
    config = DiffConfig(**TP2)  # type: ignore[arg-type]
    two = plan_jobs(config, gpus(2))
    assert (two.jobs, two.gpus, two.shared) == (1, ("0,1",), False)
    four = plan_jobs(config, gpus(4))
    assert (four.jobs, four.gpus) == (2, ("0,1", "2,3"))
    assert four.reason == "2 children at a time, 2 processes each on GPUs 0,1 and GPUs 2,3"
    assert plan_jobs(config.replace(jobs=1), gpus(4)).gpus == ("0,1",)
    with pytest.raises(UsageError, match="nproc_per_node 2 needs 2 GPUs, 1 visible"):
        plan_jobs(config, gpus(1))


def test_launch_command_and_every_ranks_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = launch_command(tmp_path / "spec.json", 2)
    # torch.distributed.run through graphdoctor.child.stacks, so the launcher dumps its stack at a timeout
    assert argv == [sys.executable, "-P", "-m", "graphdoctor.child.stacks", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", "-m", "graphdoctor.child", str(tmp_path / "spec.json")]
    monkeypatch.setenv("RANK", "0")  # an outer torchrun's variables never reach our own launch
    monkeypatch.setenv("MASTER_PORT", "1234")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    env = launch_env({"NCCL_DEBUG": "INFO", "NVSHMEM_DISABLE_NVLS": "0"}, "2,3")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["NCCL_DEBUG"] == "INFO"
    assert env["NVSHMEM_DISABLE_NVLS"] == "0"  # the run file's env: wins
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == MULTICAST_OFF_ENV["TORCH_SYMM_MEM_DISABLE_MULTICAST"]
    assert env["PYTHONSAFEPATH"] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "RANK" not in env and "MASTER_PORT" not in env


def multi_spec(tmp_path: Path, impl: str, role: Role, config: DiffConfig) -> ChildSpec:
    name = run_name(impl, config.dropout, role)
    return ChildSpec(impl=impl, dropout=config.dropout, config=config, role=role, name=name,
                     events_path=str(tmp_path / f"events-{name}.jsonl"), reference_dir=str(tmp_path),
                     placement=multi_gpu_placement(2, 2, 1))


def shard_prints(weights: list[torch.Tensor]) -> tuple[int, ...]:
    fingerprinter = BitFingerprinter([(f"t{i}", w.numel(), w.dtype) for i, w in enumerate(weights)],
                                     torch.device("cpu"))
    return tuple(v for pair in host_lanes(fingerprinter.fingerprint(weights)) for v in pair)


NAMES = ("decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.0.mlp.linear_fc2.weight")


def write_rank(spec: ChildSpec, rank: int, shards: list[list[torch.Tensor]], losses: list[float]) -> None:
    """One rank's events as the child writes them: its own tensors' fingerprints every step."""
    events = EventWriter(rank_path(spec.events_path, rank, 2))
    events.emit(Started(env=RunEnv(torch=torch.__version__, pid=os.getpid(), rank=rank, world_size=2)))
    events.emit(Tensors(names=NAMES, num_parameters=sum(t.numel() for t in shards[0])))
    for step, (weights, loss) in enumerate(zip(shards, losses, strict=True)):
        prints = StepPrints(grads=shard_prints(weights), params=shard_prints(weights))
        events.emit(Step(record=StepRecord(step=step, phase="eager" if spec.impl == EAGER else "replay", loss=loss,
                                           step_time_ms=10.0 + rank, prints=prints)))
    events.emit(End(train_s=1.0, compare_s=0.0, setup_s=0.5, peak_allocated_bytes=(rank + 1) << 20))
    events.close()


def tensor_parallel_run(tmp_path: Path, impl: str, role: Role, bump_rank: int | None) -> RunRecord:
    """Two tensor-parallel ranks training Megatron-style column shards of one real weight; in the graphed
    run one element of `bump_rank`'s shard moves by one ulp from step 3 on."""
    config = DiffConfig(dropout=0.0, **TP2)  # type: ignore[arg-type]
    spec = multi_spec(tmp_path, impl, role, config)
    torch.manual_seed(0)
    full = [torch.nn.Linear(16, 32).weight.detach(), torch.nn.Linear(32, 16).weight.detach()]
    for rank in range(2):
        steps = []
        for step in range(6):
            shard = [full[0].chunk(2, dim=0)[rank] * (1 + step), full[1].chunk(2, dim=1)[rank] * (1 + step)]
            if rank == bump_rank and step >= 3:
                shard[1] = shard[1].clone()
                shard[1][0, 0] = torch.nextafter(shard[1][0, 0], torch.tensor(math.inf))
            steps.append([s.contiguous() for s in shard])
        losses = [math.nan] * 6 if rank == 0 else [5.0 - 0.1 * s for s in range(6)]  # a first stage has no loss
        write_rank(spec, rank, steps, losses)
    return fold_launch(spec, ProcessResult(returncode=0, timed_out=False, wall_s=7.0, log_tail=""))


def test_ranks_fold_into_one_record_and_the_first_differing_rank_is_named(tmp_path: Path) -> None:
    eager = tensor_parallel_run(tmp_path, EAGER, Role.REFERENCE, None)
    graphed = tensor_parallel_run(tmp_path, "local", Role.GRAPHED, 1)
    assert [r.env.rank for r in graphed.ranks if r.env] == [0, 1]
    assert graphed.tensor_names[:2] == tuple(f"rank0:{n}" for n in NAMES)
    assert split_rank(graphed.tensor_names[3]) == (1, NAMES[1])
    assert graphed.steps[2].loss == pytest.approx(4.8) and graphed.steps[2].step_time_ms == 11.0
    assert graphed.peak_allocated_bytes == 1 << 20 and graphed.ranks[1].peak_allocated_bytes == 2 << 20
    assert graphed.wall_s == 7.0
    result = judge(eager, graphed, warmup_steps=2)
    assert result.verdict is Verdict.NUMERIC_DIVERGENCE
    assert result.divergence is not None
    assert (result.divergence.step, result.divergence.tensor) == (3, f"rank1:{NAMES[1]}")
    (tmp_path / "same").mkdir()
    same = tensor_parallel_run(tmp_path / "same", "local", Role.GRAPHED, None)
    assert judge(eager, same, warmup_steps=2).verdict is Verdict.MATCH
    loaded = RunRecord.from_dict(graphed.to_dict())
    assert [r.peak_allocated_bytes for r in loaded.ranks] == [1 << 20, 2 << 20]
    assert RunRecord.from_dict({k: v for k, v in eager.ranks[0].to_dict().items() if k != "ranks"}).ranks == ()


def test_the_rank_that_reported_an_error_decides_the_status(tmp_path: Path) -> None:
    config = DiffConfig(dropout=0.0, **TP2)  # type: ignore[arg-type]
    spec = multi_spec(tmp_path, "local", Role.GRAPHED, config)
    EventWriter(rank_path(spec.events_path, 0, 2)).close()  # rank 0 was torn down without a word
    rank1 = EventWriter(rank_path(spec.events_path, 1, 2))
    try:
        raise RuntimeError("NCCL error: unhandled cuda error")
    except RuntimeError as exc:
        ChildRun(spec=spec.for_rank({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}), events=rank1,
                 names={}).fail(exc, LoopState(step=4, phase="replay"))
    rank1.close()
    record = fold_launch(spec, ProcessResult(returncode=1, timed_out=False, wall_s=3.0, log_tail="killed"))
    assert [r.status for r in record.ranks] == ["crashed", "error"]
    assert record.status == "error" and RANK_STATUS_ORDER[-1] == "error"
    assert record.diagnosis is not None and record.diagnosis.message.startswith("rank 1: NCCL error")


def test_session_specs_carry_the_launcher_placement(tmp_path: Path) -> None:
    from graphdoctor.parent.children import ChildRequest

    session = ChildSession(DiffConfig(**TP2), tmp_path)  # type: ignore[arg-type]
    spec = session.spec(ChildRequest(EAGER, 0.1, Role.REFERENCE, tmp_path))
    assert spec.placement.launcher and spec.placement.world_size == 2
    assert spec.placement.tensor_model_parallel_size == 2
    ranked = spec.for_rank({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "4242"})
    assert ranked.events_path.endswith("events-eager-reference-d0.1-rank1.jsonl")
    assert ranked.name == "eager-reference-d0.1-rank1"  # names the rank's trace and snapshots
    assert (ranked.placement.rank, ranked.placement.local_rank, ranked.placement.master_port) == (1, 1, 4242)


def test_under_a_users_torchrun_only_rank_0_runs_the_diff() -> None:
    env = {"WORLD_SIZE": "2", "LOCAL_RANK": "1", "RANK": "1", "MASTER_PORT": "29500"}
    other = CliRunner().invoke(main, ["diff", "-q"], env=env)
    assert other.exit_code == 0 and other.stdout == ""
    assert other.stderr.strip() == ("graphdoctor diff: rank 1 of 2 under torchrun exits; rank 0 runs the diff and "
                                    "starts every child's 2 ranks itself")
    first = CliRunner().invoke(main, ["diff", "-q", "--tensor-model-parallel-size", "3"],
                               env={**env, "LOCAL_RANK": "0", "RANK": "0"})
    assert first.exit_code == 2  # nproc_per_node 2 from WORLD_SIZE: the placement is checked as usual
    assert "rank 0 runs the diff with nproc_per_node 2" in first.stderr
    assert "tensor_model_parallel_size 3 x pipeline_model_parallel_size 1 = 3 does not divide nproc_per_node 2" \
        in first.stderr


def test_torch_distributed_run_starts_two_ranks_each_with_its_own_events(tmp_path: Path) -> None:
    """A real launch: the ranks read their placement from the launcher, write their own events files, and
    fail where CUDA is first needed (this machine has none). The launcher tears the other rank down once
    one has failed, so a slower rank may end `crashed` before its first event; the error decides."""
    config = DiffConfig(dropout=0.0, timeout_s=200.0, **TP2)  # type: ignore[arg-type]
    spec = multi_spec(tmp_path, EAGER, Role.REFERENCE, config)
    spec_path = spec.write(tmp_path / f"spec-{spec.name}.json")
    record = run_launched(spec, spec_path, tmp_path / "log.txt", launch_env(None, None))
    log = (tmp_path / "log.txt").read_text(encoding="utf-8")[-3000:]
    assert len(record.ranks) == 2 and record.status == "error", log
    failed = [rank for rank, r in enumerate(record.ranks) if r.status == "error"]
    assert failed, log
    for rank, ranked in enumerate(record.ranks):
        if ranked.status == "error":
            assert ranked.env is not None and (ranked.env.rank, ranked.env.world_size) == (rank, 2)
            assert Path(rank_path(spec.events_path, rank, 2)).is_file()
        else:
            assert ranked.status == "crashed", ranked
    assert record.diagnosis is not None and record.diagnosis.message.startswith(f"rank {failed[0]}: ")
    assert not list(tmp_path.glob("events-*-rank2.jsonl")) and not Path(spec.events_path).exists()


def test_megatron_configs_carry_the_placement_and_ddp_settings() -> None:
    """The TransformerConfig and DistributedDataParallelConfig a rank builds (Megatron's own classes)."""
    from graphdoctor.child.distributed import ddp_config
    from graphdoctor.config.build import child_transformer_config as transformer_config
    from graphdoctor.config.child_model import one_gpu

    config = DiffConfig(nproc_per_node=4, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                        num_microbatches=2, sequence_parallel=True, use_distributed_optimizer=True,
                        overlap_grad_reduce=True, ddp_bucket_size=1000)
    tconfig = transformer_config(config, "local", 0.0)
    assert (tconfig.tensor_model_parallel_size, tconfig.pipeline_model_parallel_size) == (2, 2)
    assert tconfig.sequence_parallel and tconfig.pipeline_dtype == torch.float32
    ddp = ddp_config(config)
    assert (ddp.overlap_grad_reduce, ddp.use_distributed_optimizer, ddp.bucket_size) == (True, True, 1000)
    assert ddp.grad_reduce_in_fp32
    one = transformer_config(DiffConfig(), "local", 0.0)
    assert (one.tensor_model_parallel_size, one.pipeline_model_parallel_size, one.sequence_parallel) == (1, 1, False)
    assert not ddp_config(None).overlap_grad_reduce
    assert one_gpu(config).tensor_model_parallel_size == 1 and not one_gpu(config).sequence_parallel


def test_environment_rules_are_checked_on_the_ranks_environment() -> None:
    """The run file's env: reaches every rank; the catalogue's environment rules judge that environment."""
    from graphdoctor.compare.verdict import ImplResult
    from graphdoctor.parent.static import with_static_findings

    risky = DiffConfig(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, **TP2)  # type: ignore[arg-type]
    (note,) = with_static_findings(ImplResult(impl="local", verdict=Verdict.MATCH), risky).notes
    assert note.startswith("static GD301 expandable-segments-with-nccl-graph-register: PYTORCH_CUDA_ALLOC_CONF has "
                           "expandable_segments:True but NCCL_GRAPH_REGISTER=None")
    safe = risky.replace(env={**risky.env, "NCCL_GRAPH_REGISTER": "0"})
    assert with_static_findings(ImplResult(impl="local", verdict=Verdict.MATCH), safe).notes == ()
    one_gpu = risky.replace(nproc_per_node=1, tensor_model_parallel_size=1)
    assert with_static_findings(ImplResult(impl="local", verdict=Verdict.MATCH), one_gpu).notes == ()


def test_report_text_json_and_page_of_a_two_rank_diff(tmp_path: Path) -> None:
    from graphdoctor.diff import DiffReport, load_report
    from graphdoctor.report.diff import render_text, write_json
    from graphdoctor.report.html import render_payload

    eager = tensor_parallel_run(tmp_path, EAGER, Role.REFERENCE, None)
    graphed = tensor_parallel_run(tmp_path, "local", Role.GRAPHED, 1)
    config = DiffConfig(impls=("local",), dropout=0.0, **TP2)  # type: ignore[arg-type]
    report = DiffReport(config=config, results=(judge(eager, graphed, warmup_steps=2),), reference=eager)
    text = render_text(report)
    assert "  2 processes per run: TP 2, PP 1, DP 1; every rank compared" in text
    assert f"step 3 grads (rank1:{NAMES[1]})" in text
    assert report.exit_code() == 1
    path = write_json(report, tmp_path / "report.json")
    loaded = load_report(path)
    (row,) = loaded.results
    assert row.divergence is not None and row.divergence.tensor == f"rank1:{NAMES[1]}"
    assert [r.env.rank for r in row.runs[0].ranks if r.env] == [0, 1]
    assert loaded.config.nproc_per_node == 2 and loaded.reference.ranks[1].peak_allocated_bytes == 2 << 20
    assert "rank1:" in render_payload(report.to_dict())


@pytest.mark.skipif(apex_importable(), reason="Apex imports here: the local spec then supports sequence parallel")
def test_sequence_parallel_with_the_local_spec_and_no_apex_exits_2_before_any_gpu_work() -> None:
    result = CliRunner().invoke(main, ["diff", "--nproc-per-node", "2", "--tensor-model-parallel-size", "2",
                                       "--sequence-parallel", "-q"])
    assert result.exit_code == 2
    line, = result.stderr.strip().splitlines()
    assert "sequence_parallel with the local layer spec" in line and "no Apex" in line and "(GD308)" in line
    assert "Transformer Engine layer spec" in line and "install Apex" in line


def test_sequence_parallel_is_refused_only_for_the_local_spec_without_apex() -> None:
    def refused(config: DiffConfig, apex: bool) -> list[str]:
        facts = EnvironmentFacts.unknown_machine().with_overrides({"apex_installed": apex, "te_version": "2.20.2"})
        return [f.code for f in installation_refusals(config, facts)]

    sp = DiffConfig(nproc_per_node=2, tensor_model_parallel_size=2, sequence_parallel=True)
    assert refused(sp, apex=False) == ["GD308"]
    assert refused(sp.replace(layer_spec="local"), apex=False) == ["GD308"]
    assert refused(sp, apex=True) == []  # FusedLayerNorm supports it
    assert refused(sp.replace(layer_spec="te"), apex=False) == []  # TE's norms do
    assert refused(sp.replace(sequence_parallel=False), apex=False) == []


def test_check_flags_sequence_parallel_with_the_local_spec_where_the_target_has_no_apex(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("transformer:\n  tensor_model_parallel_size: 2\n  sequence_parallel: true\nrun:\n"
                   "  layer_spec: local\n", encoding="utf-8")
    flagged = CliRunner().invoke(main, ["check", str(run), "--target", "apex=false", "--format", "json"])
    assert flagged.exit_code == 1, flagged.output
    assert '"GD308"' in flagged.output
    clean = CliRunner().invoke(main, ["check", str(run), "--target", "apex=true", "--format", "json"])
    assert '"GD308"' not in clean.output


def test_a_child_spec_carries_its_resolved_model_once(tmp_path: Path) -> None:
    """The parent resolves each (impl, dropout)'s model once and hands it to the child in its spec, which builds
    from it (graphdoctor.child.megatron_setup) instead of resolving it again."""
    from graphdoctor.config.child_model import child_model
    from graphdoctor.parent.children import ChildRequest

    config = DiffConfig(impls=("local",), dropout=0.1)
    session = ChildSession(config, tmp_path)  # type: ignore[arg-type]
    eager = session.spec(ChildRequest(EAGER, 0.0, Role.REFERENCE, tmp_path))
    graphed = session.spec(ChildRequest("local", 0.1, Role.GRAPHED, tmp_path))
    assert eager.model == child_model(config, EAGER, 0.0)
    assert eager.model is not None and eager.model.value("hidden_dropout") == 0.0
    assert graphed.model is not None and graphed.model.value("cuda_graph_impl") == "local"
    assert ChildSpec.from_json(graphed.to_json()).model == graphed.model
    assert session.spec(ChildRequest("local", 0.1, Role.GRAPHED, tmp_path)).model is graphed.model
