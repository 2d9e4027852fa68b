"""`graphdoctor diff --megatron-args`: a Megatron-LM launch line or script -> DiffConfig, on the CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.config import DiffConfig, diff_config_from, load_run_file
from graphdoctor.config.launch_line import read_launch_line
from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.rules import parse_megatron_args
from graphdoctor.rules.megatron_args import scan_launch_line

REPO = Path(__file__).resolve().parents[2]
GPT = REPO / "examples" / "megatron" / "pretrain_gpt_small.sh"
MOE = REPO / "examples" / "megatron" / "pretrain_moe_small.sh"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_gpt_example_parses_into_exact_fields() -> None:
    config = diff_config_from(None, megatron_args=f"@{GPT}")
    assert config == DiffConfig(
        impls=("local",), num_layers=4, hidden_size=512, num_attention_heads=8, seq_length=256,
        micro_batch_size=2, num_microbatches=2, vocab_size=4096, dtype="bf16", dropout=0.0, seed=1234,
        cuda_graph_warmup_steps=2, layer_spec="local", eval_interval=1000, eval_iters=10,
        transformer={"ffn_hidden_size": 2048, "init_method_std": 0.02},
        megatron_args=f"@{GPT}", launch_notes=config.launch_notes)
    evaluation, note = config.launch_notes
    # Megatron-LM evaluates every --eval-interval iterations and after the last: within diff's 8 steps, once
    assert evaluation.startswith("evaluation after every 1000 training steps and after the last, 10 forward-only")
    # The tensor- and pipeline-parallel sizes (1 here) and torchrun's --nproc_per_node are applied
    # since multi-GPU diff (docs/multi-gpu.md); the other launcher flags are not.
    assert note.startswith("flags that do not apply to diff: launcher (torchrun): --nnodes, "
                           "--master_addr, --master_port; DDP and optimizer")
    for flag in ("--lr", "--clip-grad", "--weight-decay", "--max-position-embeddings", "--train-iters",
                 "--mock-data", "--save", "--save-interval", "--tokenizer-type", "--split"):
        assert len(re.findall(rf"{flag}(?=[,;]|$)", note)) == 1, flag
    assert "checkpointing (diff neither reads nor writes the line's checkpoints; --save-at S --resume" in note
    assert "--eval-iters" not in note and "--eval-interval" not in note  # applied
    # --attention-backend auto is TransformerConfig's default: nothing to apply, nothing to say
    assert "--attention-backend" not in note


def test_moe_example_maps_flags_into_transformer_config() -> None:
    line = read_launch_line(f"@{MOE}")
    assert line.values["transformer"] == {
        "add_bias_linear": False, "ffn_hidden_size": 1024, "init_method_std": 0.01, "masked_softmax_fusion": False,
        "normalization": "RMSNorm", "gated_linear_unit": True, "num_query_groups": 2, "num_moe_experts": 4,
        "moe_router_topk": 2, "moe_router_load_balancing_type": ["aux_loss"], "moe_aux_loss_coeff": [0.01],
        "moe_z_loss_coeff": 0.001, "moe_token_dispatcher_type": "alltoall", "moe_ffn_hidden_size": 1024,
    }
    assert {k: v for k, v in line.values.items() if k != "transformer"} == {
        "seq_length": 256, "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "layer_spec": "local",
        "micro_batch_size": 1, "dtype": "bf16", "cuda_graph_warmup_steps": 2, "impls": ("local",),
        "cuda_graph_modules": ("attn",), "dropout": 0.0, "num_microbatches": 2,
        # applied since multi-GPU diff (docs/multi-gpu.md): the placement and the DDP settings
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "overlap_grad_reduce": True,
        "use_distributed_optimizer": True,
        "eval_interval": 0,  # --eval-iters 0: Megatron-LM never evaluates
    }
    notes = [text for _, text in line.notes]
    assert any("--tokenizer-type" in n and "needs --vocab-size" in n for n in notes)
    assert any(n.startswith("--swiglu: gated_linear_unit is set") for n in notes)
    (skipped,) = [n for n in notes if n.startswith("flags that do not apply")]
    # --overlap-grad-reduce is applied since multi-GPU diff; the optimizer's own flags are not
    assert "DDP and optimizer" in skipped and "--overlap-grad-reduce" not in skipped and "--lr," in skipped
    assert "model builder" in skipped and "--untie-embeddings-and-output-weights" in skipped
    assert "--position-embedding-type" in skipped and "--expert-model-parallel-size" in skipped


def test_explicit_flags_override_the_line_and_say_so() -> None:
    config = diff_config_from(None, megatron_args=f"@{GPT}", num_layers=2, seq_length=128, steps=6)
    assert (config.num_layers, config.seq_length, config.steps, config.hidden_size) == (2, 128, 6, 512)
    assert config.launch_notes[-1] == ("explicit values override the launch line: num_layers 2 (line: "
                                       "--num-layers 4), seq_length 128 (line: --seq-length 256)")


def test_run_file_key_sits_between_line_and_flags(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(f"run:\n  megatron_args: '@{GPT}'\n  num_layers: 3\n  dropout: 0.1\n"
                   "transformer:\n  init_method_std: 0.01\n", encoding="utf-8")
    config = diff_config_from(load_run_file(run), num_layers=2)
    assert (config.num_layers, config.dropout, config.hidden_size) == (2, 0.1, 512)
    assert config.transformer == {"ffn_hidden_size": 2048, "init_method_std": 0.01}
    # a flag replaces the run file's launch line as a whole
    other = diff_config_from(load_run_file(run), megatron_args="--num-layers 5 --hidden-size 64 --num-attention-heads 4")
    assert (other.num_layers, other.hidden_size) == (3, 64)


def test_hidden_and_attention_dropout_differ_one_line_says_which() -> None:
    config = diff_config_from(None, megatron_args="--hidden-dropout 0.0 --attention-dropout 0.05")
    assert config.dropout == 0.05
    assert any("took 0.05, the larger" in n for n in config.launch_notes)
    assert not any("took" in n for n in diff_config_from(
        None, megatron_args="--hidden-dropout 0.0 --attention-dropout 0.05", dropout=0.0).launch_notes)


def test_graph_flags_map_to_impls_and_modules() -> None:
    assert diff_config_from(None, megatron_args="--external-cuda-graph --bf16").impls == ("transformer_engine",)
    assert diff_config_from(None, megatron_args="--enable-cuda-graph").impls == ("local",)
    scoped = diff_config_from(None, megatron_args="--cuda-graph-impl local --cuda-graph-scope attn moe_router")
    assert scoped.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    none = diff_config_from(None, megatron_args="--cuda-graph-impl none")
    assert none.impls == DiffConfig().impls
    assert any("--cuda-graph-impl none" in n for n in none.launch_notes)


def test_torchrun_line_batch_vocab_and_unresolved_variables() -> None:
    config = diff_config_from(None, megatron_args=(
        "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 "
        "--micro-batch-size 2 --global-batch-size 64 --vocab-size 50257 --num-layers $NUM_LAYERS "
        "--data-path $DATA"))
    assert config.num_microbatches == 8  # 64 / (2 x data-parallel 4)
    assert config.vocab_size == 50432  # padded to a multiple of 128 x TP 2
    assert config.num_layers == DiffConfig().num_layers
    notes = " | ".join(config.launch_notes)
    assert "data-parallel 4" in notes and "padded to 50432" in notes
    assert "skipped (the flag is left out): --num-layers $NUM_LAYERS" in notes
    assert notes.count("--data-path") == 1  # listed once, among the flags that do not apply


def test_torchrun_line_places_ranks_and_ddp_settings() -> None:
    config = diff_config_from(None, megatron_args=(
        "torchrun --nproc_per_node 4 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --sequence-parallel --overlap-grad-reduce --use-distributed-optimizer "
        "--ddp-bucket-size 1000000 --micro-batch-size 1 --global-batch-size 4 --num-layers 4"))
    assert (config.nproc_per_node, config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (4, 2, 2)
    assert config.sequence_parallel and config.overlap_grad_reduce and config.use_distributed_optimizer
    assert config.ddp_bucket_size == 1_000_000
    assert config.num_microbatches == 4  # 4 / (1 x data-parallel 1)
    notes = " | ".join(config.launch_notes)
    for flag in ("--nproc_per_node", "--tensor-model-parallel-size", "--sequence-parallel", "--overlap-grad-reduce",
                 "--use-distributed-optimizer", "--ddp-bucket-size"):
        assert flag not in notes, flag


def test_launch_line_placement_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="num_layers 3 is not divisible by pipeline_model_parallel_size 2"):
        diff_config_from(None, megatron_args="torchrun --nproc_per_node 2 x.py --pipeline-model-parallel-size 2 "
                                             "--num-layers 3")
    # explicit values override the line: one GPU, no tensor parallelism
    shrunk = diff_config_from(None, megatron_args="torchrun --nproc_per_node 8 x.py --tensor-model-parallel-size 2",
                              nproc_per_node=1, tensor_model_parallel_size=1)
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
    config = diff_config_from(None, megatron_args=f"@{script}")
    assert (config.num_layers, config.hidden_size, config.seq_length) == (6, 128, 64)


def test_check_reads_the_same_scripts() -> None:
    parsed = parse_megatron_args(f"@{MOE}")
    assert parsed.transformer["cuda_graph_impl"] == "local"
    assert parsed.transformer["cuda_graph_modules"] == ["attn"]
    assert parsed.transformer["num_moe_experts"] == 4
    assert parsed.locations["transformer.num_moe_experts"] == f"{MOE}:48"
    code, out, _ = invoke("check", "--megatron-args", f"@{GPT}", "--format", "json")
    assert code in (0, 1) and json.loads(out)["schema_version"] == 2


@pytest.mark.parametrize(("line", "needle"), [
    ("--num-layerz 2", "--num-layerz is not a Megatron-LM flag (did you mean '--num-layers'?)"),
    ("pretrain_gpt.py --cuda-graph-imp local", "did you mean '--cuda-graph-impl'?"),
    ("--num-layers two", "--num-layers: got 'two', expected an integer"),
    ("--num-layers 2 4", "--num-layers: expected one value, got 2"),
    ("--bf16 yes", "--bf16: takes no value"),
    ("--normalization FooNorm", "expected one of LayerNorm, RMSNorm"),
    ("--cuda-graph-modules atn", "did you mean 'attn'?"),
    ("--num-layers 0", "--num-layers: expected an integer >= 1"),
    ("--hidden-dropout 1.5", "dropout: got 1.5"),
    ("--moe-router-topk x", "--moe-router-topk: got 'x', expected an integer"),
    ("--num-layers 'unterminated", "cannot split"),
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
        read_launch_line(f"@{binary}")
    with pytest.raises(UsageError):
        read_launch_line("--no-such-megatron-flag")


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


@pytest.mark.parametrize(("line", "interval", "iters"), [
    ("--eval-interval 3 --eval-iters 2", 3, 2),
    ("--eval-iters 5", 1000, 5),  # Megatron-LM's default interval: within diff's steps, the final evaluation only
    ("--eval-interval 4", 4, 100),  # and its default --eval-iters
])
def test_evaluation_flags_set_the_schedule_with_megatron_defaults(line: str, interval: int, iters: int) -> None:
    config = diff_config_from(None, megatron_args=f"--num-layers 2 {line}")
    assert (config.eval_interval, config.eval_iters) == (interval, iters)
    assert any(n.startswith(f"evaluation after every {interval} training steps") for n in config.launch_notes)


@pytest.mark.parametrize("line", ["--eval-iters 0", "--eval-interval 0 --eval-iters 4"])
def test_a_line_that_never_evaluates_runs_no_evaluation(line: str) -> None:
    config = diff_config_from(None, megatron_args=line)
    assert config.eval_interval == 0
    assert any("the line never evaluates; diff runs no evaluation" in n for n in config.launch_notes)


def test_explicit_evaluation_overrides_the_line_and_says_so() -> None:
    config = diff_config_from(None, megatron_args="--eval-interval 1000 --eval-iters 10", eval_interval=2, eval_iters=1)
    assert (config.eval_interval, config.eval_iters) == (2, 1)
    assert any("eval_interval 2 (line: --eval-interval 1000)" in n and "eval_iters 1 (line: --eval-iters 10)" in n
               for n in config.launch_notes)


def test_negative_evaluation_values_are_refused() -> None:
    with pytest.raises(UsageError, match=r"--eval-iters: got -1, expected >= 0"):
        read_launch_line("--eval-iters -1")


def test_checkpoint_flags_are_listed_as_checkpointing_even_with_unset_directories() -> None:
    line = read_launch_line("--num-layers 2 --save $CKPT --load $CKPT --ckpt-format torch_dist")
    note = line.notes[-1][1]
    assert "; --save-at S --resume saves one after step S and resumes from it in a fresh process, eager and " \
           "graphed alike): --save, --load, --ckpt-format" in note, note
