"""MoE experts compared one by one (graphdoctor/compare/experts.py) on the experts Megatron places: two gloo
processes build the dropless MoE run file's GPT model with expert parallel 2 on the CPU (megatron-core's own
initialize_model_parallel and MoELayer decide which rank holds which experts); their parameters, fingerprinted as a
child fingerprints them, make an eager and a graphed two-rank run, and the graphed run moves one element of rank
1's first local expert by one ulp. The diff names that expert by its global number, its rank and its local index, in
the terminal, the JSON and the HTML report's grid of experts."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from graphdoctor.compare.bitprint import BitFingerprinter, host_lanes
from graphdoctor.compare.experts import ExpertRow, ExpertsDiff, compare_experts
from graphdoctor.compare.verdict import ImplResult, judge
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.parent.launch import fold_launch, multi_gpu_placement
from graphdoctor.parent.runner import ProcessResult
from graphdoctor.protocol import EAGER, ChildSpec, EventWriter, Role, RunRecord, run_name
from graphdoctor.protocol.events import End, RunEnv, Started, Step, Tensors, decode, encode
from graphdoctor.protocol.experts import ExpertShard, expert_of
from graphdoctor.protocol.spec import rank_path
from graphdoctor.protocol.steps import StepPrints, StepRecord
from graphdoctor.report.diff import render_text
from graphdoctor.report.html import render_report
from graphdoctor.types import Verdict

REPO = Path(__file__).resolve().parents[2]

BUILD = textwrap.dedent("""
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    from megatron.core import parallel_state
    from graphdoctor.child.megatron_setup import build_probe_model
    from graphdoctor.child.names import expert_shards, strip_wrappers
    from graphdoctor.config import diff_config_from, load_run_file
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    config = diff_config_from(load_run_file(sys.argv[1]), hidden_size=64, num_attention_heads=4, seq_length=32,
                              vocab_size=128, num_layers=2)
    model, _ = build_probe_model(config, device="cpu")
    params = [(strip_wrappers(n), p.detach().clone()) for n, p in model.named_parameters() if p.requires_grad]
    torch.save({"shards": [s.to_dict() for s in expert_shards(model)], "params": params},
               os.path.join(sys.argv[2], f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()
""")


@pytest.fixture(scope="module")
def ep2(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's expert shards and parameters (name, tensor) as Megatron built them with EP = 2."""
    out = tmp_path_factory.mktemp("ep2")
    script = out / "build.py"
    script.write_text(BUILD, encoding="utf-8")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(REPO / "fixtures/runfiles/moe_dropless_allgather.yaml"), str(out)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


def test_megatron_places_two_experts_of_each_layer_on_each_rank(ep2: list[dict[str, Any]]) -> None:
    for rank, built in enumerate(ep2):
        shards = tuple(ExpertShard.from_dict(s) for s in built["shards"])
        assert [(s.layer, s.experts, s.num_experts, s.layer_number) for s in shards] == [
            (f"decoder.layers.{layer}.mlp", (2 * rank, 2 * rank + 1), 4, layer + 1) for layer in range(2)]
        names = [n for n, _ in built["params"]]
        experts = {n: expert_of(n, shards) for n in names}
        owned = {n: (ref.shard.layer, ref.expert) for n, ref in experts.items() if ref is not None}
        assert owned["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"] == (
            "decoder.layers.1.mlp", 2 * rank + 1)
        assert len(owned) == 2 * 2 * 2  # 2 layers x 2 local experts x (fc1, fc2)
        assert experts["decoder.layers.0.mlp.router.weight"] is None
        assert experts["decoder.layers.0.self_attention.linear_qkv.weight"] is None


def test_grouped_and_shared_expert_names() -> None:
    """TEGroupedMLP keeps a weight per local expert (`linear_fc1.weight1`); shared experts belong to none."""
    shards = (ExpertShard("rank1:decoder.layers.3.mlp", (6, 7), 8),)
    ref = expert_of("rank1:decoder.layers.3.mlp.experts.linear_fc1.weight1", shards)
    assert ref is not None and (ref.local, ref.expert) == (1, 7)
    whole = expert_of("rank1:decoder.layers.3.mlp.experts.something_else", shards)
    assert whole is not None and whole.expert is None
    assert expert_of("rank1:decoder.layers.3.mlp.shared_experts.linear_fc1.weight", shards) is None
    assert expert_of("rank0:decoder.layers.3.mlp.experts.linear_fc1.weight1", shards) is None
    assert expert_of("rank1:decoder.layers.3.mlp.experts.linear_fc1.weight2", shards) is None  # no local 2


def _prints(tensors: list[torch.Tensor]) -> tuple[int, ...]:
    fingerprinter = BitFingerprinter([(f"t{i}", t.numel(), t.dtype) for i, t in enumerate(tensors)],
                                     torch.device("cpu"))
    return tuple(v for pair in host_lanes(fingerprinter.fingerprint(tensors)) for v in pair)


def _run(tmp_path: Path, ep2: list[dict[str, Any]], impl: str, bump: tuple[int, str, int] | None) -> RunRecord:
    """A two-rank run whose parameters move by a step-dependent factor every step; `bump` (rank, name, step)
    moves one element of that parameter by one ulp from that step on (its main_grad too)."""
    config = DiffConfig(dropout=0.0, nproc_per_node=2, expert_model_parallel_size=2)  # type: ignore[arg-type]
    role = Role.REFERENCE if impl == EAGER else Role.GRAPHED
    name = run_name(impl, 0.0, role)
    spec = ChildSpec(impl=impl, dropout=0.0, config=config, role=role, name=name,
                     events_path=str(tmp_path / f"events-{name}.jsonl"), reference_dir=str(tmp_path),
                     placement=multi_gpu_placement(2, 2, 1))
    for rank, built in enumerate(ep2):
        names = tuple(n for n, _ in built["params"])
        events = EventWriter(rank_path(spec.events_path, rank, 2))
        events.emit(Started(env=RunEnv(torch=torch.__version__, pid=os.getpid(), rank=rank, world_size=2)))
        events.emit(Tensors(names=names, num_parameters=sum(p.numel() for _, p in built["params"]),
                            experts=tuple(ExpertShard.from_dict(s) for s in built["shards"])))
        for step in range(6):
            tensors = [p * (1 + step) for _, p in built["params"]]
            if bump is not None and rank == bump[0] and step >= bump[2]:
                index = names.index(bump[1])
                tensors[index] = tensors[index].clone()
                tensors[index].view(-1)[0] = torch.nextafter(tensors[index].view(-1)[0], torch.tensor(math.inf))
            prints = StepPrints(grads=_prints(tensors), params=_prints(tensors))
            events.emit(Step(record=StepRecord(step=step, phase="eager" if impl == EAGER else "replay",
                                               loss=5.0 - 0.1 * step, step_time_ms=10.0, prints=prints)))
        events.emit(End(train_s=1.0, compare_s=0.0, setup_s=0.5, peak_allocated_bytes=1 << 20))
        events.close()
    return fold_launch(spec, ProcessResult(returncode=0, timed_out=False, wall_s=7.0, log_tail=""))


def test_a_difference_in_rank_1s_first_local_expert_is_named_global_expert_2(
        tmp_path: Path, ep2: list[dict[str, Any]]) -> None:
    (tmp_path / "eager").mkdir()
    (tmp_path / "graphed").mkdir()
    eager = _run(tmp_path / "eager", ep2, EAGER, None)
    moved = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"
    graphed = _run(tmp_path / "graphed", ep2, "local", (1, moved, 3))
    assert [s.layer for s in graphed.experts] == [f"rank{r}:decoder.layers.{layer}.mlp"
                                                  for r in range(2) for layer in range(2)]
    result = judge(eager, graphed, warmup_steps=2)
    assert result.verdict is Verdict.NUMERIC_DIVERGENCE
    assert result.divergence is not None and (result.divergence.step, result.divergence.tensor) == (3, f"rank1:{moved}")
    experts = result.experts
    assert experts is not None and experts.steps == 6 and len(experts.rows) == 2 * 2 * 2  # layers x ranks x local
    assert [(r.layer, r.rank, r.expert, r.local, r.grads_step, r.params_step) for r in experts.differing] == [
        ("decoder.layers.1.mlp", 1, 2, 0, 3, 3)]
    assert experts.line() == ("experts: 1 of 8 differ (2 layers x 4 experts on 2 ranks); first decoder.layers.1.mlp "
                              "expert 2 on rank 1 (its local expert 0): main_grads at step 3")
    assert f"local: {experts.line()}" in _text(eager, result).splitlines()
    (tmp_path / "same").mkdir()
    same = judge(eager, _run(tmp_path / "same", ep2, "local", None), warmup_steps=2)
    assert same.verdict is Verdict.MATCH
    assert same.experts is not None and same.experts.line() == (
        "experts: 2 layers x 4 experts on 2 ranks, every expert's main_grads and parameters equal at 6 steps")
    loaded = ImplResult.from_dict(result.to_dict())
    assert loaded.experts == experts
    assert RunRecord.from_dict(graphed.to_dict()).experts == graphed.experts
    page = render_report(_report(eager, result))
    assert '<section id="experts">' in page and '<figure data-experts="local">' in page
    grid = page.split('<figure data-experts="local">', 1)[1].split("</figure>", 1)[0]
    cells = re.findall(r'<text class="cell[^"]*"[^>]*>([^<]*)</text><title>([^<]*)</title>', grid)
    assert len(cells) == 2 * 4  # a row per layer, a column per global expert
    assert [c for c in cells if c[0] != "="] == [
        ("3", "decoder.layers.1.mlp expert 2 on rank 1 (its local expert 0): main_grads from step 3, "
              "parameters from step 3")]


def _report(eager: RunRecord, result: ImplResult) -> DiffReport:
    return DiffReport(config=DiffConfig(dropout=0.0, nproc_per_node=2,  # type: ignore[arg-type]
                                        expert_model_parallel_size=2), reference=eager, results=(result,))


def _text(eager: RunRecord, result: ImplResult) -> str:
    return render_text(_report(eager, result))


def test_pipeline_stages_sharing_module_names_and_data_parallel_copies_in_the_grid() -> None:
    """P = 2: both stages name their first layer `decoder.layers.0.mlp` (layer_number 1 and 2): two grid rows, each
    with its rank. D = 2 without expert parallel: both ranks hold every expert of the same layer: one row, a cell
    per expert holding both copies, the differing copy deciding the cell."""
    stages = ExpertsDiff(steps=6, rows=tuple(
        ExpertRow(layer="decoder.layers.0.mlp", rank=rank, expert=e, local=e, tensors=2, layer_number=rank + 1)
        for rank in range(2) for e in range(4)))
    labels, experts, cells = stages.grid()
    assert labels == ("decoder.layers.0.mlp on rank 0", "decoder.layers.0.mlp on rank 1") and experts == (0, 1, 2, 3)
    assert stages.line().startswith("experts: 2 layers x 4 experts on 2 ranks, every expert")
    copies = ExpertsDiff(steps=6, rows=tuple(
        ExpertRow(layer="decoder.layers.0.mlp", rank=rank, expert=e, local=e, tensors=2, layer_number=1,
                  params_step=4 if (rank, e) == (1, 1) else None)
        for rank in range(2) for e in range(4)))
    labels, _, cells = copies.grid()
    assert labels == ("decoder.layers.0.mlp",)
    assert [(r.rank, r.params_step) for r in cells[("decoder.layers.0.mlp", 1)]] == [(0, None), (1, 4)]
    assert copies.line() == ("experts: 1 of 8 differ (1 layer x 4 experts on 2 ranks); first decoder.layers.0.mlp "
                             "expert 1 on rank 1 (its local expert 1): parameters at step 4")


def test_a_dense_model_has_no_expert_comparison(tmp_path: Path) -> None:
    record = RunRecord(impl="local", dropout=0.0, status="ok", tensor_names=("decoder.layers.0.mlp.linear_fc1.weight",))
    assert compare_experts(record, record) is None
    assert ExpertsDiff.from_dict(ExpertsDiff(steps=0, rows=()).to_dict()) == ExpertsDiff(steps=0, rows=())


def test_the_tensors_event_carries_the_shards() -> None:
    event = Tensors(names=("a",), experts=(ExpertShard("decoder.layers.0.mlp", (2, 3), 4),))
    assert decode(encode(event)) == event
    assert decode(encode(Tensors(names=("a",)))) == Tensors(names=("a",))
