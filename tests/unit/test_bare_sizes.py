"""The sizes of tests/benchmarks/diff_cost.py on the CPU: both sides take each size's one list of flags, and
bare_megatron.py builds from them the model `graphdoctor diff`'s children build (issue 44's full-width two-layer
Llama-3 8B and Mixtral 8x7B, and the earlier sizes unchanged); the diff's `weights_equal` is read from the digests
its report carries."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from graphdoctor.protocol.events import Weights
from graphdoctor.protocol.record import RunRecord

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "tests" / "benchmarks"
NEW_SIZES = ("llama3-8b-2l", "mixtral-8x7b-2l")


def _diff_cost() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diff_cost", BENCHMARKS / "diff_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPARE = textwrap.dedent("""
    import dataclasses, importlib.util, json, sys, warnings
    warnings.simplefilter("ignore")

    def load(name):
        spec = importlib.util.spec_from_file_location(name, f"tests/benchmarks/{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    cost, bare = load("diff_cost"), load("bare_megatron")
    GPT_MODEL = bare.GPTModel
    import torch
    import megatron.training.models.gpt as builder
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from graphdoctor.cli.diff import build_config, diff_command
    from graphdoctor.config.build import child_transformer_config, model_config
    from graphdoctor.config.build import build_model as graphdoctor_build
    from graphdoctor.config.child_model import child_model
    from graphdoctor.config.description import model_facts

    class Called(Exception):
        def __init__(self, kwargs):
            self.kwargs = kwargs

    def record(**kwargs):  # stands in for GPTModel: what each side would construct it with
        raise Called(kwargs)

    def called(build):
        try:
            build()
        except Called as call:
            return call.kwargs
        raise AssertionError("GPTModel was not called")

    def diff_config(flags):  # the diff CLI's own parse and resolve (graphdoctor/cli/diff.py)
        params = dict(diff_command.make_context("diff", ["--impl", "local,full_iteration", *flags]).params)
        config_path = params.pop("config_path")
        for key in ("settings", "json_path", "html_path", "workdir", "plan_only", "verbose", "quiet"):
            params.pop(key)
        return build_config(config_path, params)

    def plain(value):
        return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)

    def same(a, b):  # a spec holds functools.partial, equal only to itself: compared by its repr instead
        return repr(a) == repr(b)

    out = {}
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    # The alltoall dispatcher makes its host-copy stream at construction (token_dispatcher.py:469), which this
    # CPU-only torch cannot; nothing runs forward here (as tests/unit/test_moe_build.py).
    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "not created on the CPU"
    for size in sys.argv[1:]:
        flags = cost.size_flags(size)
        config = diff_config(flags)
        # Built on the meta device below: with the CPU's weights (a GPU build needs CUDA).
        parsed = bare.parse_args(["--impl", "eager", "--cpu-init", *flags])
        fields = {}
        for impl in ("eager", "local", "full_iteration"):
            for dropout in (config.dropout, 0.0):
                theirs = child_transformer_config(config, impl, dropout)
                # A gpu_init child builds on the GPU (graphdoctor/child/megatron_setup.py _gpu_init), as bare does.
                theirs.use_cpu_initialization = not config.gpu_init
                args = bare.parse_args(["--impl", impl, "--dropout", str(dropout), *flags])
                ours = bare.transformer_config(args)
                fields[f"{impl}@{dropout}"] = [f.name for f in dataclasses.fields(theirs)
                                               if repr(getattr(theirs, f.name)) != repr(getattr(ours, f.name))]
        description = child_model(config, "eager", config.dropout)
        tconfig = bare.transformer_config(parsed)
        bare.GPTModel, builder.GPTModel = record, record
        ours = called(lambda: bare.gpt_model(parsed, tconfig))
        theirs = called(lambda: graphdoctor_build(description, child_transformer_config(config, "eager",
                                                                                         config.dropout),
                                                  pg_collection=object(), pre_process=True, post_process=True))
        differ = sorted(k for k in ours if k not in ("config", "pg_collection") and not same(ours[k], theirs.get(k)))
        extra = sorted(set(theirs) - set(ours))
        bare.GPTModel = builder.GPTModel = GPT_MODEL
        with torch.device("meta"):
            model = bare.gpt_model(parsed, tconfig)
        out[size] = {
            "bare_args": {k: plain(v) for k, v in vars(parsed).items() if k != "line"},
            "bare_line": None if parsed.line is None else vars(parsed.line),
            "facts": model_facts(config.model),
            "run": {"seq_length": config.seq_length, "micro_batch_size": config.micro_batch_size,
                    "dtype": config.dtype, "cuda_graph_warmup_steps": config.cuda_graph_warmup_steps,
                    "dropout": config.dropout, "steps": config.steps},
            "te_rng_tracker": [child_model(config, impl, config.dropout).te_rng_tracker
                               for impl in ("eager", "local", "full_iteration")],
            "fields_differ": fields,
            "gpt_model_differ": differ, "gpt_model_extra": extra,
            "gpt_model": {k: plain(v) for k, v in ours.items()
                          if k not in ("config", "pg_collection", "transformer_layer_spec")},
            "layer_spec_equal": same(ours["transformer_layer_spec"], theirs["transformer_layer_spec"]),
            "layer_spec_default_equal": same(ours["transformer_layer_spec"], builder.default_layer_spec(
                model_config(description, tconfig), None)),
            "layer_spec_before": same(ours["transformer_layer_spec"], bare.get_gpt_layer_local_spec(
                normalization=tconfig.normalization)),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "experts": [type(layer.mlp).__name__ for layer in model.decoder.layers],
            "bare": {name: plain(getattr(tconfig, name)) for name in (
                "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                "gated_linear_unit", "activation_func", "normalization", "add_bias_linear", "num_moe_experts",
                "moe_router_topk", "moe_ffn_hidden_size", "moe_token_dispatcher_type", "moe_expert_capacity_factor",
                "moe_pad_expert_input_to_capacity", "moe_aux_loss_coeff", "bf16", "params_dtype",
                "cuda_graph_warmup_steps", "hidden_dropout", "transformer_impl")},
        }
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def compared() -> dict[str, Any]:
    """Every size of diff_cost.SIZES resolved by both sides, in a child process (Megatron's process group and
    model-parallel state must not leak into other tests, and bare_megatron.py sets environment variables)."""
    sizes = list(_diff_cost().SIZES)
    proc = subprocess.run([sys.executable, "-c", COMPARE, *sizes], capture_output=True, text=True, timeout=600,
                          check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(result) == sizes
    return result


EXPECTED_LINES: dict[str, dict[str, Any]] = {
    "llama3-8b-2l": {"group_query_attention": True, "num_query_groups": 8, "ffn_hidden_size": 14336, "swiglu": True,
                     "normalization": "RMSNorm", "position_embedding_type": "rope", "rotary_base": 500000,
                     "untie_embeddings_and_output_weights": True, "disable_bias_linear": True,
                     "transformer_impl": "local", "num_experts": None},
    "mixtral-8x7b-2l": {"group_query_attention": True, "num_query_groups": 8, "ffn_hidden_size": 14336,
                        "swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
                        "rotary_base": 1000000, "untie_embeddings_and_output_weights": True,
                        "disable_bias_linear": True, "transformer_impl": "local", "num_experts": 8,
                        "moe_router_topk": 2, "moe_ffn_hidden_size": 14336, "moe_token_dispatcher_type": "alltoall",
                        "moe_aux_loss_coeff": 0.01, "moe_expert_capacity_factor": 1.0,
                        "moe_pad_expert_input_to_capacity": True},
}
VOCAB = {"llama3-8b-2l": 128256, "mixtral-8x7b-2l": 32000}


@pytest.mark.parametrize("size", NEW_SIZES)
def test_bare_megatron_parses_each_full_width_size(compared: dict[str, Any], size: str) -> None:
    """bare_megatron's parse_args on the size's flags: diff's own flags for the shape, the launch line for the
    rest, and the warm-up of the other sizes."""
    args, line = compared[size]["bare_args"], compared[size]["bare_line"]
    assert {k: args[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                 "micro_batch_size", "dtype", "vocab_size", "ffn_hidden_size",
                                 "cuda_graph_warmup_steps", "steps", "dropout")} == {
        "num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 4096, "micro_batch_size": 1,
        "dtype": "bf16", "vocab_size": VOCAB[size], "ffn_hidden_size": 14336, "cuda_graph_warmup_steps": 2,
        "steps": 8, "dropout": 0.1}
    assert {k: line[k] for k in EXPECTED_LINES[size]} == EXPECTED_LINES[size]
    assert not (line["masked_softmax_fusion"] or line["apply_rope_fusion"] or line["gradient_accumulation_fusion"]
                or line["persist_layer_norm"])


@pytest.mark.parametrize("size", NEW_SIZES)
def test_graphdoctor_resolves_the_model_bare_megatron_builds(compared: dict[str, Any], size: str) -> None:
    """The diff CLI's own resolution of the size (its model facts, the plan's and the report's `model`) against
    the TransformerConfig bare_megatron constructs: layers, width, GQA, FFN, experts, vocabulary, sequence,
    normalization, activation, position embedding, untied embeddings."""
    row = compared[size]
    facts, bare, moe = row["facts"], row["bare"], size.startswith("mixtral")
    assert {k: facts[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                  "attention", "ffn_hidden_size", "normalization", "activation",
                                  "position_embedding", "rotary_base", "tied_embeddings", "vocab_size",
                                  "layer_spec", "dtype")} == {
        "num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8, "attention": "GQA",
        "ffn_hidden_size": 14336, "normalization": "RMSNorm", "activation": "silu gated", "position_embedding": "rope",
        "rotary_base": 1000000 if moe else 500000, "tied_embeddings": False, "vocab_size": VOCAB[size],
        "layer_spec": "local", "dtype": "bf16"}
    assert facts["source"] == "launch line --megatron-args" and facts["unavailable"] is None
    assert row["run"] == {"seq_length": 4096, "micro_batch_size": 1, "dtype": "bf16", "cuda_graph_warmup_steps": 2,
                          "dropout": 0.1, "steps": 8}
    assert (bare["num_layers"], bare["hidden_size"], bare["num_attention_heads"], bare["num_query_groups"],
            bare["ffn_hidden_size"], bare["normalization"], bare["gated_linear_unit"]) == (
        facts["num_layers"], facts["hidden_size"], facts["num_attention_heads"], facts["num_query_groups"],
        facts["ffn_hidden_size"], facts["normalization"], True)
    assert "silu" in bare["activation_func"] and bare["add_bias_linear"] is False and bare["bf16"] is True
    gpt = row["gpt_model"]
    assert (gpt["vocab_size"], gpt["max_sequence_length"], gpt["position_embedding_type"], gpt["rotary_base"],
            gpt["share_embeddings_and_output_weights"]) == (
        facts["vocab_size"], row["run"]["seq_length"], "rope", facts["rotary_base"], False)
    if moe:
        assert facts["moe"] == {"num_experts": 8, "topk": 2, "dispatcher": "alltoall", "layer_freq": 1,
                                "ffn_hidden_size": 14336, "shared_expert_size": None}
        assert (bare["num_moe_experts"], bare["moe_router_topk"], bare["moe_ffn_hidden_size"],
                bare["moe_token_dispatcher_type"], bare["moe_expert_capacity_factor"],
                bare["moe_pad_expert_input_to_capacity"]) == (8, 2, 14336, "alltoall", 1.0, True)
        assert row["experts"] == ["MoELayer", "MoELayer"]
    else:
        assert facts["moe"] is None and bare["num_moe_experts"] is None and row["experts"] == ["MLP", "MLP"]


def test_every_transformer_config_field_agrees_at_every_size(compared: dict[str, Any]) -> None:
    """Field by field, for each implementation at the run's dropout and at a control pair's 0, the TransformerConfig
    bare_megatron constructs is the one graphdoctor builds for that child (graphdoctor.config.build
    child_transformer_config); neither side asks for Transformer Engine's RNG tracker."""
    for size, row in compared.items():
        assert all(not differ for differ in row["fields_differ"].values()), (size, row["fields_differ"])
        assert len(row["fields_differ"]) == 6
        assert row["te_rng_tracker"] == [False, False, False], size


def test_both_sides_construct_gptmodel_alike_at_every_size(compared: dict[str, Any]) -> None:
    """GPTModel's arguments as bare_megatron passes them and as Megatron's GPTModelBuilder passes them from the
    child's GPTModelConfig (vocabulary, sequence, embeddings, position embedding, layer spec); the layer spec is
    Megatron's default_layer_spec, and at the earlier sizes the local spec bare_megatron used before."""
    for size, row in compared.items():
        assert row["gpt_model_differ"] == [] and row["gpt_model_extra"] == [], size
        assert row["layer_spec_equal"] and row["layer_spec_default_equal"], size
        if size not in NEW_SIZES:
            assert row["layer_spec_before"] and row["bare_line"] is None, size
            assert row["gpt_model"]["position_embedding_type"] == "learned_absolute"
            assert row["gpt_model"]["share_embeddings_and_output_weights"] is False


def test_the_earlier_sizes_build_what_they_built(compared: dict[str, Any]) -> None:
    """The sizes of issue 32 keep bare_megatron's defaults: no line, ffn 4 x hidden, warm-up 2, LayerNorm, gelu,
    biases, learned positions, the vocabulary unpadded; their parameter counts are the recorded H200 run's
    (fixtures/data/benchmarks/h200_diff_cost.json)."""
    recorded = {row["size"]: row["bare"][0]["num_parameters"]
                for row in json.loads((REPO / "fixtures/data/benchmarks/h200_diff_cost.json").read_text())}
    for size in ("default", "0.54b", "1.08b"):
        row = compared[size]
        args, bare = row["bare_args"], row["bare"]
        assert args["megatron_args"] is None and args["ffn_hidden_size"] == 4 * args["hidden_size"]
        assert args["cuda_graph_warmup_steps"] == 2 and bare["normalization"] == "LayerNorm"
        assert "gelu" in bare["activation_func"] and bare["add_bias_linear"] is True
        assert row["gpt_model"]["vocab_size"] == args["vocab_size"]
        assert row["num_parameters"] == recorded[size], size


def test_the_full_width_sizes_have_their_parameter_counts(compared: dict[str, Any]) -> None:
    """Built on the meta device by bare_megatron: 2 x 4096 Llama-3 8B layers with its 128256-token embedding and
    output layer (1.49 B), and 2 Mixtral 8x7B layers of 8 experts with its 32000-token ones (3.16 B)."""
    h, kv, ffn = 4096, 1024, 14336
    attention = h * (h + 2 * kv) + h * h + h  # QKV, projection, RMSNorm
    llama = 2 * 128256 * h + 2 * (attention + 3 * h * ffn + h) + h
    mixtral = 2 * 32000 * h + 2 * (attention + 8 * h + 8 * 3 * h * ffn + h) + h
    assert compared["llama3-8b-2l"]["num_parameters"] == llama == 1_486_901_248
    assert compared["mixtral-8x7b-2l"]["num_parameters"] == mixtral == 3_164_688_384


def test_both_sides_take_each_size_as_one_list_of_flags(tmp_path: Path) -> None:
    """size_flags gives one list; the bare command and the diff command carry it whole, and a launch line stays
    one argument."""
    cost = _diff_cost()
    for size in cost.SIZES:
        flags = cost.size_flags(size)
        bare = cost.bare_argv(size, "local", 0.1, 8, tmp_path / "bare.json")
        diff = cost.diff_argv(size, [], "local,full_iteration", tmp_path / "diff.json")
        assert bare[len(bare) - len(flags):] == flags and diff[len(diff) - len(flags):] == flags
    line = cost.size_flags("mixtral-8x7b-2l")
    assert line[line.index("--megatron-args") + 1] == cost.MIXTRAL_LINE


def _record(name: str, digest: str | None) -> dict[str, Any]:
    weights = None if digest is None else Weights(digest=digest, num_seeded=12)
    record = RunRecord(impl="local" if "graphed" in name else "eager", dropout=0.1, status="ok", name=name,
                       weights=weights)
    return record.to_dict()


def _report(digests: dict[str, str | None]) -> dict[str, Any]:
    """A diff report's run records as graphdoctor writes them (RunRecord.to_dict under `reference` and each row's
    `runs`): constructed here from the schema."""
    names = list(digests)
    return {"reference": _record(names[0], digests[names[0]]), "control_reference": None,
            "impls": [{"impl": "local", "verdict": "match", "runs": [_record(n, digests[n]) for n in names[1:]]}]}


def test_weights_equal_reads_the_digests_the_report_carries() -> None:
    """True when every child that reported its weights reported the same digest, False when one differs, None
    when no record carries one (CPU initialisation): here on records constructed from the schema."""
    cost = _diff_cost()
    same = {"eager-reference-0.1": "ab12", "local-graphed-0.1": "ab12", "local-graphed-0.0": "ab12"}
    assert cost.weights_equal(_report(same)) is True
    assert cost.weights_equal(_report({**same, "local-graphed-0.0": "ff00"})) is False
    assert cost.weights_equal(_report(dict.fromkeys(same))) is None
    assert cost.weights_equal({}) is None


def test_weights_equal_is_none_on_a_recorded_report_without_gpu_init() -> None:
    """A report recorded on the H200 with CPU initialisation: its records say `weights: null`, so nothing is
    claimed."""
    cost = _diff_cost()
    report = json.loads((REPO / "fixtures/data/diff/h200_mixtral_8x7b_line_schema2.json").read_text())
    runs = cost._runs(report)
    assert len(runs) >= 2 and all(run.get("weights") is None for run in runs)
    assert cost.weights_equal(report) is None


def test_the_summary_says_weights_and_leaves_out_a_side_by_side_that_failed() -> None:
    """The summary table's row of a full-width size whose bare processes did not fit side by side: no /together
    figure, the weights column from weights_equal, long size and flag names aligned."""
    cost = _diff_cost()
    run = {"flags": "dropout0", "process_s": 300.0, "ratio": 1.2, "ratio_together": None,
           "ratio_slowest": 2.5, "before_first_child_s": 0.4, "after_last_child_s": None, "weights_equal": True,
           "verdicts": {"local": "match"}}
    rows = [{"size": "mixtral-8x7b-2l", "bare_s": 250.0, "bare_together_s": None, "bare_slowest_s": 120.0,
             "diffs": [run, {**run, "flags": "cpu_init_dropout0", "weights_equal": None}]}]
    header, first, second = cost.summary_lines(rows)
    assert header.index("flags") == first.index("dropout0") == second.index("cpu_init_dropout0")
    assert "equal" in first and "{'local': 'match'}" in first and " - " in first
    assert "  -        {'local'" in second
