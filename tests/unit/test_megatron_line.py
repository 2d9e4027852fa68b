"""`graphdoctor diff --megatron-args`: a Megatron-LM launch line or script, read by Megatron-LM's own parser and
validation -> DiffConfig and the model description, on the CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.config.build import padded_vocab_size
from graphdoctor.config.child_model import child_model
from graphdoctor.config.from_megatron import UNSET_EVAL_INTERVAL
from graphdoctor.config.launch_scan import scan_launch_line
from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.parent.static import refuse_what_cannot_build
from graphdoctor.rules import parse_megatron_args

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "examples" / "megatron" / "pretrain_gpt_small.sh"
MOE = REPO / "examples" / "megatron" / "pretrain_moe_small.sh"
GPT_FLAGS = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
             "--micro-batch-size 1 --vocab-size 128 --transformer-impl local --no-gradient-accumulation-fusion")
"""A whole Megatron-LM model on the local spec, small."""


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_gpt_example_is_read_by_megatron_lm() -> None:
    config = diff_config_from(None, megatron_args=f"@{GPT}")
    assert (config.impls, config.num_layers, config.hidden_size, config.num_attention_heads, config.seq_length) == \
        (("local",), 4, 512, 8, 256)
    assert (config.micro_batch_size, config.num_microbatches, config.vocab_size, config.dtype, config.dropout) == \
        (2, 2, 4096, "bf16", 0.0)
    assert (config.seed, config.cuda_graph_warmup_steps, config.layer_spec) == (1234, 2, "local")
    assert (config.eval_interval, config.eval_iters) == (1000, 10)
    model = config.model
    assert model is not None and model.kind == "gpt" and model.source == f"launch line {GPT}"
    # Megatron-LM's own values: --ffn-hidden-size, --init-method-std, what validate_args derives (kv channels)
    assert (model.value("ffn_hidden_size"), model.value("init_method_std"), model.value("kv_channels")) == \
        (2048, 0.02, 64)
    assert model.value("transformer_impl") == "local" and model.value("gradient_accumulation_fusion") is False
    note = next(n for n in config.launch_notes if n.startswith("flags that do not apply"))
    for flag in ("--lr", "--clip-grad", "--weight-decay", "--train-iters", "--mock-data", "--save-interval",
                 "--tokenizer-type", "--split", "--master-addr", "--master-port"):
        assert len(re.findall(rf"{flag}(?=[,;]|$)", note)) == 1, flag
    assert "checkpointing: --save-interval" in note
    # applied: the model, the batch, evaluation, the graphs, the launcher's processes
    for flag in ("--eval-iters", "--eval-interval", "--max-position-embeddings", "--attention-backend",
                 "--ffn-hidden-size", "--cuda-graph-impl", "--vocab-size", "--nproc_per_node", "--nnodes"):
        assert flag not in note, flag


def test_moe_example_is_the_model_megatron_lm_builds() -> None:
    config = diff_config_from(None, megatron_args=f"@{MOE}")
    model = config.model
    assert model is not None
    assert {k: model.value(k) for k in ("add_bias_linear", "num_moe_experts", "moe_router_topk",
                                        "moe_token_dispatcher_type", "gated_linear_unit", "activation_func",
                                        "num_query_groups", "normalization", "moe_ffn_hidden_size")} == {
        "add_bias_linear": False, "num_moe_experts": 4, "moe_router_topk": 2, "moe_token_dispatcher_type": "alltoall",
        "gated_linear_unit": True, "activation_func": "torch.nn.functional.silu", "num_query_groups": 2,
        "normalization": "RMSNorm", "moe_ffn_hidden_size": 1024}
    # GPTModel's arguments: rotary positions, untied embeddings (the default), Megatron-LM's padded vocabulary
    assert (model.value("position_embedding_type"), model.value("rotary_base")) == ("rope", 1000000)
    assert model.value("share_embeddings_and_output_weights") is False and model.value("should_pad_vocab") is True
    assert (config.impls, config.cuda_graph_modules, config.eval_interval) == (("local",), ("attn",), 0)
    assert config.overlap_grad_reduce and config.use_distributed_optimizer
    assert config.transformer["num_moe_experts"] == 4  # what the rule catalogue reads
    notes = " | ".join(config.launch_notes)
    assert "--tokenizer-model ${TOKENIZER_MODEL}" in notes and "diff trains synthetic tokens over 1024" in notes


def test_explicit_flags_override_the_line_and_say_so() -> None:
    config = diff_config_from(None, megatron_args=f"@{GPT}", num_layers=2, seq_length=128, steps=6)
    assert (config.num_layers, config.seq_length, config.steps, config.hidden_size) == (2, 128, 6, 512)
    assert config.model is not None and config.model.value("num_layers") == 2
    assert config.launch_notes[-1] == ("explicit values override the launch line: num_layers 2 (line: --num-layers "
                                       "4), seq_length 128 (line: --seq-length 256)")


def test_run_file_key_sits_between_line_and_flags(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(f"run:\n  megatron_args: '@{GPT}'\n  num_layers: 3\n  dropout: 0.1\n"
                   "transformer:\n  init_method_std: 0.01\n", encoding="utf-8")
    config = diff_config_from(load_run_file(run), num_layers=2)
    assert (config.num_layers, config.dropout, config.hidden_size) == (2, 0.1, 512)
    assert config.model is not None and config.model.value("init_method_std") == 0.01
    assert child_model(config, "local", 0.0).value("init_method_std") == 0.01  # every child gets it again
    # a flag replaces the run file's launch line as a whole
    other = diff_config_from(load_run_file(run), megatron_args="--num-layers 5 --hidden-size 64 "
                                                               "--num-attention-heads 4 --transformer-impl local")
    assert (other.num_layers, other.hidden_size) == (3, 64)


def test_loss_scale_is_read_from_the_line_for_fp16_only() -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --fp16 --loss-scale 4096")
    assert (config.dtype, config.loss_scale) == ("fp16", 4096.0)
    assert not any("--loss-scale" in note for note in config.launch_notes)  # diff takes it
    assert diff_config_from(None, megatron_args=f"{GPT_FLAGS} --fp16").loss_scale is None  # dynamic
    assert diff_config_from(None, megatron_args=f"{GPT_FLAGS} --fp16 --loss-scale 0").loss_scale is None  # Megatron's
    explicit = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --fp16", loss_scale=1024.0)
    assert explicit.loss_scale == 1024.0
    over = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --fp16 --loss-scale 4096", loss_scale=512)
    assert over.loss_scale == 512.0  # the flag over the line's


@pytest.mark.parametrize(("line", "flags"), [
    ("--bf16 --loss-scale 4096", {}),  # the line's own scale, which Megatron-LM ignores beside bf16 too
    ("--bf16", {"loss_scale": 4096.0}),  # the flag over a bf16 line
    ("", {"loss_scale": 4096.0}),  # fp32
    ("--fp16", {"loss_scale": 4096.0, "dtype": "bf16"}),  # --dtype over the line's fp16
], ids=["line-bf16", "flag-over-bf16", "fp32", "dtype-over-fp16"])
def test_loss_scale_beside_another_dtype_warns_and_is_dropped(line: str, flags: dict[str, object]) -> None:
    with pytest.warns(UserWarning, match=r"^loss_scale: got 4096\.0 with dtype (bf16|fp32), expected dtype fp16 "
                                         r"\(only fp16 scales the loss\); the loss scale has no effect") as caught:
        config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} {line}", **flags)
    assert len(caught) == 1 and caught[0].filename == str(REPO / "graphdoctor" / "config" / "resolve.py")
    assert config.dtype != "fp16" and config.loss_scale is None
    assert config.to_dict()["loss_scale"] is None and config.replace(seed=2).loss_scale is None  # warned once


def test_each_child_keeps_the_lines_own_dropouts() -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --hidden-dropout 0.0 --attention-dropout 0.05")
    assert config.dropout == 0.05  # diff's control pair runs when any dropout is on
    main = child_model(config, "local", config.dropout)
    control = child_model(config, "local", 0.0)
    assert (main.value("hidden_dropout", 0.1), main.value("attention_dropout", 0.1)) == (0.0, 0.05)
    assert (control.value("hidden_dropout", 0.1), control.value("attention_dropout", 0.1)) == (0.0, 0.0)


def test_graph_flags_map_to_impls_and_modules_as_megatron_normalises_them() -> None:
    assert diff_config_from(None, megatron_args=f"{GPT_FLAGS} --external-cuda-graph").impls == ("transformer_engine",)
    assert diff_config_from(None, megatron_args=f"{GPT_FLAGS} --enable-cuda-graph").impls == ("local",)
    scoped = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --cuda-graph-impl local --cuda-graph-scope attn moe_router")
    assert scoped.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    none = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --cuda-graph-impl none")
    assert none.impls == DiffConfig().impls


def test_each_child_is_validated_by_megatron_lm_with_its_own_graphs() -> None:
    config = diff_config_from(None, megatron_args=f"@{GPT}", impls="local,full_iteration,transformer_engine")
    models = {impl: child_model(config, impl, config.dropout)
              for impl in ("eager", "local", "full_iteration", "transformer_engine")}
    assert {impl: m.value("cuda_graph_impl", "none") for impl, m in models.items()} == {
        "eager": "none", "local": "local", "full_iteration": "full_iteration", "transformer_engine": "transformer_engine"}
    # validate_args turns TE's RNG tracker on for TE graphs only (the layers are local here)
    assert {impl: m.te_rng_tracker for impl, m in models.items()} == {
        "eager": False, "local": False, "full_iteration": False, "transformer_engine": True}
    assert all(m.value("use_cpu_initialization") for m in models.values())  # the same weights for every child


def test_torchrun_line_batch_vocab_exports_and_unresolved_variables(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("export CUDA_DEVICE_MAX_CONNECTIONS=1\nexport NCCL_ALGO=Ring\n"
                      "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 "
                      "--micro-batch-size 2 --global-batch-size 64 --vocab-size 50257 --num-layers $NUM_LAYERS "
                      "--hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
                      "--data-path $DATA --transformer-impl local\n", encoding="utf-8")
    config = diff_config_from(None, megatron_args=f"@{script}")
    assert (config.nproc_per_node, config.tensor_model_parallel_size, config.num_microbatches) == (8, 2, 8)
    assert config.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_ALGO": "Ring"}  # validate_args needs the first
    assert config.model is not None and padded_vocab_size(config.model, 2) == 50432  # 128 x TP 2, as Megatron pads
    assert config.num_layers == DiffConfig().num_layers
    notes = " | ".join(config.launch_notes)
    assert "skipped (the flag is left out): --num-layers $NUM_LAYERS, --data-path $DATA" in notes
    assert "the line sets no --num-layers" in notes


def test_torchrun_line_places_ranks_and_ddp_settings() -> None:
    config = diff_config_from(None, megatron_args=(
        "torchrun --nproc_per_node 4 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --sequence-parallel --overlap-grad-reduce --use-distributed-optimizer "
        "--ddp-bucket-size 1000000 --micro-batch-size 1 --global-batch-size 4 --num-layers 4 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --transformer-impl local"),
        env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert (config.nproc_per_node, config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (4, 2, 2)
    assert config.sequence_parallel and config.overlap_grad_reduce and config.use_distributed_optimizer
    assert config.ddp_bucket_size == 1_000_000
    assert config.num_microbatches == 4  # 4 / (1 x data-parallel 1)
    notes = " | ".join(config.launch_notes)
    for flag in ("--nproc_per_node", "--tensor-model-parallel-size", "--sequence-parallel", "--overlap-grad-reduce",
                 "--use-distributed-optimizer", "--ddp-bucket-size"):
        assert flag not in notes, flag


def test_sequence_parallel_at_one_gpu_is_turned_off_as_megatron_lm_does() -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --sequence-parallel")
    assert not config.sequence_parallel
    assert any("Disabling sequence parallelism because tensor model parallelism is disabled" in n
               for n in config.launch_notes)


def test_launch_line_placement_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="Number of layers should be divisible by the pipeline-model-parallel size"):
        diff_config_from(None, megatron_args="torchrun --nproc_per_node 2 x.py @ --pipeline-model-parallel-size 2 "
                                             "--num-layers 3".replace("@ ", GPT_FLAGS + " "))
    refused = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --tensor-model-parallel-size 2")
    assert refused.placement_refusal == ("placement: the line's model parallelism (tensor 2) needs a multiple of 2 "
                                         "processes, diff starts 1; give --fit to shrink every placement to the GPUs "
                                         "at hand, or --nproc-per-node 2")
    assert refused.tensor_model_parallel_size == 1  # described as --fit would place it
    with pytest.raises(UsageError, match=r"placement: .* \(and 0 more|placement: .*--nproc-per-node 2"):
        refuse_what_cannot_build(refused)
    # explicit values override the line: one GPU, no tensor parallelism
    shrunk = diff_config_from(None, megatron_args=f"torchrun --nproc_per_node 8 x.py {GPT_FLAGS} "
                                                  "--tensor-model-parallel-size 2", nproc_per_node=1,
                              tensor_model_parallel_size=1)
    assert (shrunk.nproc_per_node, shrunk.tensor_model_parallel_size) == (1, 1)


def test_old_style_string_variables_and_shell_syntax(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text('#!/bin/bash\nLAYERS=6\nGPT_ARGS="--num-layers $LAYERS \\\n    --hidden-size 128 \\\n'
                      '    --num-attention-heads 4"\nmkdir -p logs && nvidia-smi --query-gpu=name\n'
                      'python pretrain_gpt.py $GPT_ARGS --seq-length ${SEQ:-64} 2>&1 | tee logs/out.txt\n',
                      encoding="utf-8")
    uses = scan_launch_line(f"@{script}")
    assert [(u.flag, u.values, u.where) for u in uses] == [
        ("--num-layers", ("6",), f"{script}:3"), ("--hidden-size", ("128",), f"{script}:3"),
        ("--num-attention-heads", ("4",), f"{script}:3"), ("--seq-length", ("64",), f"{script}:7")]
    config = diff_config_from(None, megatron_args=f"@{script}", layer_spec="local")
    assert (config.num_layers, config.hidden_size, config.seq_length) == (6, 128, 64)


def test_check_reads_the_same_scripts() -> None:
    parsed = parse_megatron_args(f"@{MOE}")
    assert parsed.transformer["cuda_graph_impl"] == "local"
    assert parsed.transformer["cuda_graph_modules"] == ["attn"]
    assert parsed.transformer["num_moe_experts"] == 4
    assert parsed.locations["transformer.num_moe_experts"] == f"{MOE}:51"
    code, out, _ = invoke("check", "--megatron-args", f"@{GPT}", "--format", "json")
    assert code in (0, 1) and json.loads(out)["schema_version"] == 2


@pytest.mark.parametrize(("line", "needle"), [
    ("--num-layerz 2", "--num-layerz is not a Megatron-LM flag (did you mean '--num-layers'?)"),
    ("pretrain_gpt.py --cuda-graph-imp local", "did you mean '--cuda-graph-impl'?"),
    ("--num-layers two", "Megatron-LM's parser refuses the line: argument --num-layers: invalid int value: 'two'"),
    ("--num-layers 2 4", "Megatron-LM's parser refuses the line: unrecognized arguments: 4"),
    ("--bf16 yes", "unrecognized arguments: yes"),
    ("--normalization FooNorm", "invalid choice: 'FooNorm' (choose from 'LayerNorm', 'RMSNorm')"),
    ("--cuda-graph-modules atn", "did you mean 'attn'?"),
    ("--num-layers 0", "Megatron's TransformerConfig refuses the line: ZeroDivisionError"),
    ("--hidden-dropout 1.5", "dropout: got 1.5"),
    ("--moe-router-topk x", "argument --moe-router-topk: invalid int value: 'x'"),
    ("--num-layers 'unterminated", "cannot split"),
    ("--yaml-cfg x.yaml", "not Megatron-LM's experimental --yaml-cfg"),
])
def test_bad_launch_lines_exit_2_one_line(line: str, needle: str) -> None:
    code, out, err = invoke("diff", "--megatron-args", line)
    assert code == 2, (out, err)
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_launch_files_follow_the_input_contract(tmp_path: Path) -> None:
    big = tmp_path / "big.sh"
    big.write_bytes(b"# x\n" * (300 * 1024))
    binary = tmp_path / "binary.sh"
    binary.write_bytes(b"--num-layers \xff\xfe\x00\n")
    for target, needle in ((tmp_path / "missing.sh", "no such file"), (big, "exceeds the cap"),
                           (binary, "not UTF-8"), (tmp_path, "not a regular file")):
        code, _, err = invoke("diff", "--megatron-args", f"@{target}")
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(InputFileError):
        scan_launch_line(f"@{binary}")
    with pytest.raises(UsageError, match="--no-such-megatron-flag is not a Megatron-LM flag"):
        diff_config_from(None, megatron_args="--no-such-megatron-flag")


def test_config_round_trip_keeps_the_line_and_notes() -> None:
    config = diff_config_from(None, megatron_args=f"@{GPT}")
    data = json.loads(json.dumps(config.to_dict()))
    assert data["megatron_args"] == f"@{GPT}" and data["launch_notes"] == list(config.launch_notes)
    assert DiffConfig.from_dict(data) == config


def test_help_names_the_option() -> None:
    code, out, _ = invoke("diff", "--help")
    assert code == 0 and "--megatron-args ARGS|@FILE" in out and "@pretrain_gpt.sh" in out


def test_plugin_takes_the_launch_line_and_refuses_a_bad_one(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--gd-megatron-args", "--num-layerz 2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and "--num-layerz is not a Megatron-LM flag" in errors[0], result.stderr.lines
    # `=`: pytest itself reads a separate `@FILE` argument as a file of arguments
    good = pytester.runpytest_subprocess(f"--gd-megatron-args=@{GPT}", "--gd-num-layers", "2")
    assert good.ret == 0, good.stderr.lines


def test_self_multiplying_scripts_are_bounded() -> None:
    doubling = "A=x\n" + 'A="$A$A"\n' * 60 + "python train.py --save $A\n"
    (use,) = scan_launch_line(doubling)
    assert use.values == () and use.unresolved == ("$A",)
    with pytest.raises(UsageError, match="expands to more than"):
        scan_launch_line("A=(" + " --x 1" * 1000 + ")\npython train.py" + " ${A[@]}" * 1000 + "\n")


@pytest.mark.parametrize(("line", "interval", "iters", "said"), [
    ("--eval-interval 3 --eval-iters 2", 3, 2, "evaluation after every 3 training steps"),
    # Megatron-LM 0.19.2 leaves --eval-interval unset: no evaluation between steps, one after the last
    ("--eval-iters 5", UNSET_EVAL_INTERVAL, 5, "evaluation after the last training step only"),
    ("--eval-interval 4", 4, 100, "evaluation after every 4 training steps"),  # and its default --eval-iters
])
def test_evaluation_flags_set_the_schedule_with_megatron_defaults(line: str, interval: int, iters: int,
                                                                  said: str) -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} {line}")
    assert (config.eval_interval, config.eval_iters) == (interval, iters)
    assert any(n.startswith(said) for n in config.launch_notes)


@pytest.mark.parametrize("line", ["--eval-iters 0", "--eval-interval 0 --eval-iters 4"])
def test_a_line_that_never_evaluates_runs_no_evaluation(line: str) -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} {line}")
    assert config.eval_interval == 0
    assert any("the line never evaluates; diff runs no evaluation" in n for n in config.launch_notes)


def test_explicit_evaluation_overrides_the_line() -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --eval-interval 1000 --eval-iters 10",
                              eval_interval=2, eval_iters=1)
    assert (config.eval_interval, config.eval_iters) == (2, 1)


def test_checkpoint_flags_are_listed_as_checkpointing_even_with_unset_directories() -> None:
    config = diff_config_from(None, megatron_args=f"{GPT_FLAGS} --save $CKPT --load $CKPT --ckpt-format torch_dist "
                                                  "--save-interval 5")
    notes = " | ".join(config.launch_notes)
    assert "checkpointing: --ckpt-format, --save-interval" in notes
    assert "--save $CKPT, --load $CKPT" in notes  # unset directories: left out, and said so
