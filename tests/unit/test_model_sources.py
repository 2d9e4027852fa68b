"""The model's other sources, on the CPU: a Megatron-LM functional test's model_config.yaml and a Megatron-Bridge
ConfigContainer YAML, read into the same description as a launch line, through `check` and `diff --plan`; the
shrink of per-layer patterns; set-up failures that `--plan` catches without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import diff_config_from, load_run_file
from graphdoctor.config.bridge import read_bridge
from graphdoctor.config.child_model import child_model
from graphdoctor.config.functional_test import read_functional_test
from graphdoctor.config.shrink import keep_kinds, shrink_hybrid_pattern, shrink_moe_layer_freq
from graphdoctor.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
TEST = REPO / "fixtures" / "functional_tests" / "moe_scoped_cudagraph.yaml"
BRIDGE = REPO / "fixtures" / "bridge" / "llama_te_graphs.yaml"
LLAMA = REPO / "fixtures" / "megatron_lines" / "llama3_8b.txt"
SHRUNK = {"num_layers": 2, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
          "expert_model_parallel_size": 1, "num_microbatches": 2}


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_functional_test_is_its_harness_flags() -> None:
    test = read_functional_test(TEST)
    uses = {u.flag: u for u in test.uses}
    assert uses["--untie-embeddings-and-output-weights"].values == ()  # true: the bare flag
    assert uses["--cuda-graph-modules"].values == ("attn", "mlp", "moe_router", "moe_preprocess")  # [a b]: items
    assert uses["--moe-layer-freq"].values == ("([0]*4+[1]*9)",)  # ( ): one word
    assert uses["--tensorboard-dir"].unresolved == ("${TENSORBOARD_PATH}",)  # set by the harness, not the file
    assert uses["--num-layers"].where == f"{TEST}:12"
    assert test.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_functional_test_shrinks_to_one_gpu_keeping_its_kinds_of_layer() -> None:
    config = diff_config_from(load_run_file(TEST), **SHRUNK)
    assert config.model is not None and config.model.source == f"functional test {TEST}"
    assert config.model.value("moe_layer_freq") == [0, 1]  # one dense, one MoE layer, as 4 + 9 were
    assert config.model.value("mtp_num_layers") == 1 and config.model.value("pipeline_model_parallel_layout") is None
    assert (config.impls, config.cuda_graph_modules) == (("transformer_engine",),
                                                        ("attn", "mlp", "moe_router", "moe_preprocess"))
    assert config.env["NCCL_ALGO"] == "Ring"
    notes = " | ".join(config.launch_notes)
    assert "--moe-layer-freq shrunk to [0,1] for 2 layers" in notes
    assert "--pipeline-model-parallel-layout dropped with the pipeline" in notes
    assert "Disabling sequence parallelism" in notes  # validate_args at tensor-parallel size 1


def test_a_functional_test_that_needs_more_gpus_is_refused_naming_the_placement() -> None:
    refused = diff_config_from(load_run_file(TEST))
    assert (refused.placement_refusal or "").startswith("placement: the line's model parallelism (tensor 2 x pipeline "
                                                        "2, expert 2) needs a multiple of 4 processes, diff starts 1")
    fitted = diff_config_from(load_run_file(TEST), fit=True)
    assert fitted.placement_refusal is None and (fitted.tensor_model_parallel_size,
                                                 fitted.pipeline_model_parallel_size,
                                                 fitted.expert_model_parallel_size) == (1, 1, 1)
    assert any(n.startswith("--fit: pipeline 2 -> 1") and "the pipeline layout dropped" in n
               for n in fitted.launch_notes)
    with pytest.raises(UsageError, match="--num-layers 1: --moe-layer-freq has 2 kinds of layer"):
        diff_config_from(load_run_file(TEST), **{**SHRUNK, "num_layers": 1})
    raised = diff_config_from(load_run_file(TEST), **{**SHRUNK, "num_layers": 1}, fit=True)
    assert raised.num_layers == 2  # --fit keeps a dense and an MoE layer
    assert "--fit: --num-layers 1 raised to 2, one layer of each kind the model has" in raised.launch_notes


def test_a_bridge_config_is_read_with_safe_yaml_into_the_same_description() -> None:
    bridge = read_bridge(BRIDGE)
    assert bridge.kind == "gpt" and bridge.transformer["transformer_impl"] == "transformer_engine"  # Bridge's spec
    assert bridge.graph == {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn", "mlp"]}  # by _name_
    assert "model.hf_model_id" in bridge.not_applied and "optimizer" in bridge.not_applied
    config = diff_config_from(load_run_file(BRIDGE))
    model = config.model
    assert model is not None and model.source == f"Megatron-Bridge {BRIDGE}"
    assert (model.value("activation_func"), model.value("position_embedding_type"), model.value("rotary_base")) == \
        ("torch.nn.functional.silu", "rope", 500000)
    assert (config.impls, config.cuda_graph_modules, config.num_microbatches, config.seed) == \
        (("transformer_engine",), ("attn", "mlp"), 2, 1234)
    assert config.overlap_grad_reduce and config.use_distributed_optimizer and config.eval_interval == 0
    graphed = child_model(config, "transformer_engine", config.dropout)
    assert graphed.te_rng_tracker and graphed.value("cuda_graph_impl") == "transformer_engine"


def test_a_bridge_name_outside_torch_and_megatron_is_refused(tmp_path: Path) -> None:
    text = BRIDGE.read_text(encoding="utf-8").replace("torch.nn.functional.silu", "os.system")
    path = tmp_path / "bridge.yaml"
    path.write_text(text, encoding="utf-8")
    code, _, err = invoke("diff", "--plan", "--config", str(path))
    assert code == 2 and "model.activation_func: _target_ 'os.system' is outside what graphdoctor reads" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("path", [TEST, BRIDGE])
def test_check_reads_both_with_their_lines(path: Path) -> None:
    code, out, _ = invoke("check", str(path), "--output-format", "json")
    assert code in (0, 1)
    data = json.loads(out)
    findings = data["findings"] + data["not_checked"]
    assert findings and all(f["input"] == str(path) for f in findings)
    assert any(loc.startswith(f"{path}:") for f in findings for loc in f["locations"])


@pytest.mark.parametrize(("path", "flags", "source"), [
    (TEST, ["--num-layers", "2", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--expert-model-parallel-size", "1", "--num-microbatches", "2"], "functional test"),
    (BRIDGE, [], "Megatron-Bridge"),
])
def test_diff_plan_reads_both(path: Path, flags: list[str], source: str) -> None:
    code, out, _ = invoke("diff", "--plan", "--config", str(path), *flags)
    assert code == 0, out
    lines = [line for line in out.splitlines() if not line.startswith(("launch line:", "config:"))]
    assert lines[0].startswith("graphdoctor diff --plan: GPTModel 2x")
    assert lines[1].startswith("  model: 2 layers") and f"; from {source} {path}" in lines[1]
    assert "transformer_engine" in out  # the row the source graphs


def test_plan_refuses_a_set_up_failure_before_any_gpu(tmp_path: Path) -> None:
    """Megatron-LM's Llama-3 8B line on the local spec: --apply-layernorm-1p asks torch's LayerNorm for what it
    cannot do. On the H200 the eager reference failed in set-up after 84 s; the plan shows the model and lists it
    among the refusals, once, in Megatron's words. (--no-rope-fusion: this CPU machine has no Transformer Engine for rotary fusion.)"""
    line = tmp_path / "llama.txt"
    line.write_text(LLAMA.read_text(encoding="utf-8").replace("pretrain_gpt.py \\", "pretrain_gpt.py --no-rope-fusion \\"),
                    encoding="utf-8")
    code, out, _ = invoke("diff", "--plan", "--megatron-args", f"@{line}", "--num-layers", "2", "--nproc-per-node",
                          "1", "--num-microbatches", "2", "--layer-spec", "local")
    assert code == 1
    assert "graphdoctor diff --plan: GPTModel 2x4096" in out and "  model: 2 layers x 4096" in out
    block = out[out.index("refused here ("):].splitlines()[1:]
    (said,) = [x for x in block if "zero_centered_gamma" in x]
    assert "every child's set-up would fail building the model" in said
    assert "zero_centered_gamma not supported by torch LayerNorm" in said
    assert "megatron/core/transformer/torch_norm.py:" in said


def test_plan_builds_the_model_on_the_meta_device() -> None:
    code, out, _ = invoke("diff", "--plan", "--megatron-args", f"@{REPO / 'examples/megatron/pretrain_gpt_small.sh'}")
    assert code == 0, out
    assert "  model built on the meta device: 0.0148 B parameters" in out.splitlines()


def test_the_lines_own_te_checks_make_its_rows_unavailable_here_not_refused() -> None:
    """The Llama-3 line on this CPU machine without Transformer Engine (or Apex): planned, every row unavailable
    with Megatron's reason; diff itself refuses it in one line. As written, its default gradient_accumulation_fusion
    is refused first (no Apex kernel here): the fix goes over the file."""
    shrink = ["--num-layers", "2", "--nproc-per-node", "1", "--num-microbatches", "2"]
    code, out, _ = invoke("diff", "--plan", "--megatron-args", f"@{LLAMA}", *shrink)
    assert code == 1 and "fix: --no-gradient-accumulation-fusion on the line" in out.split("refused here (")[1]
    args = ["--megatron-args", f"@{LLAMA} --no-gradient-accumulation-fusion", *shrink]
    code, out, _ = invoke("diff", "--plan", *args)
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith(("local", "full_iteration", "transformer_engine"))]
    assert len(rows) == 3 and all("unavailable" in row for row in rows)
    code, _, err = invoke("diff", *args, "-q")
    assert code == 2 and "apply_rope_fusion is not available" in err.strip().splitlines()[-1]


def test_shrinking_keeps_every_kind_of_layer() -> None:
    assert keep_kinds([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2, "--moe-layer-freq") == [0, 1]
    assert keep_kinds([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], 3, "--moe-layer-freq") == [0, 0, 1]
    assert shrink_moe_layer_freq(2, 3) == 2  # every second layer: the same rule for fewer layers
    assert shrink_hybrid_pattern("M-M-M*-|M-M-M*-/M*", 4) == "M-M*/M*"  # Mamba, MLP, attention kept
    with pytest.raises(UsageError, match="has 3 kinds of layer"):
        shrink_hybrid_pattern("M-*M-*", 2)
    with pytest.raises(UsageError, match="diff shrinks a pattern, it does not grow one"):
        keep_kinds([0, 1], 3, "--moe-layer-freq")


def test_a_hybrid_line_without_mamba_ssm_is_unavailable_in_one_line() -> None:
    line = ("--num-layers 4 --hybrid-layer-pattern M*M- --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
            "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1024 --transformer-impl local "
            "--no-persist-layer-norm --no-gradient-accumulation-fusion "
            "--spec megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec --cuda-graph-impl local")
    code, out, _ = invoke("diff", "--plan", "--megatron-args", line)
    assert code == 0 and out.startswith("graphdoctor diff --plan: HybridModel 4x256"), out
    assert "hybrid M*M-" in out and "need mamba_ssm" in out


def test_expert_parallel_placements_are_refused_in_one_line() -> None:
    from graphdoctor.config import DiffConfig
    from graphdoctor.report.diff import placement_line

    moe = {"num_moe_experts": 4, "moe_router_topk": 2}
    placed = DiffConfig(nproc_per_node=2, expert_model_parallel_size=2, transformer=moe)
    assert placed.expert_model_parallel_size == 2
    assert placement_line(placed).startswith("  2 processes per run: TP 1, PP 1, EP 2, DP 2;")
    assert "EP" not in placement_line(DiffConfig(nproc_per_node=2, transformer=moe))
    with pytest.raises(UsageError, match=r"expert_model_parallel_size 4 x expert_tensor_parallel_size 1 = 4 does not "
                                         r"divide the 2 ranks of a pipeline stage"):
        DiffConfig(nproc_per_node=2, expert_model_parallel_size=4, transformer=moe)
    with pytest.raises(UsageError, match="num_moe_experts 4 is not divisible by expert_model_parallel_size 3"):
        DiffConfig(nproc_per_node=3, expert_model_parallel_size=3, transformer=moe)
    code, _, err = invoke("diff", "--plan", "--expert-model-parallel-size", "2")
    assert code == 2 and "does not divide the 1 ranks" in err and len(err.strip().splitlines()) == 1
