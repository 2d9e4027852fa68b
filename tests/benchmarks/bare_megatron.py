"""Baseline: the bare Megatron-Core training one `graphdoctor diff` child does, written by hand, without graphdoctor.

Usage (on a CUDA machine, from the repository root; one implementation per process, as diff runs them):
    python tests/benchmarks/bare_megatron.py --impl full_iteration --json /tmp/bare-full_iteration.json
    (--impl eager|local|full_iteration, model and run flags as `graphdoctor diff`'s, their defaults its defaults)

It builds what a default diff child builds (graphdoctor/child/megatron_setup.py build_setup, graphdoctor/config/
diff_config.py DiffConfig._builtin_model, graphdoctor/config/build.py, Megatron's GPTModelBuilder) and trains it on the same
synthetic batches (graphdoctor/child/batches.py) with the same step (graphdoctor/child/loop.py train_step), so the
children of `graphdoctor diff --impl local,full_iteration` can be set against it: startup_s (imports), setup_s,
train_s, step_ms, peak memory, losses. Nothing here imports graphdoctor; where a value is one of graphdoctor's
defaults, the comment names it.

`--megatron-args LINE` takes Megatron-LM flags of the model, as `graphdoctor diff --megatron-args` does, for what
diff's own flags cannot say (GQA, SwiGLU, RMSNorm, RoPE, MoE): the child then builds the model Megatron-LM's parser
describes (graphdoctor/config/from_megatron.py), and this script builds the same by hand: the TransformerConfig
fields megatron/training/argument_utils.py core_transformer_config_from_args sets for the flags LINE_FLAGS reads
(megatron_lm_fields), the GPTModelConfig the line gives (vocabulary padded, embeddings tied unless untied, the
position embedding). It reads only those flags and refuses any other, so no setting of a line is left out here.
transformer_config() and gpt_model() need no GPU (tests/unit/test_bare_sizes.py builds both on the CPU).
"""

import time

STARTED = time.time()

import os  # noqa: E402

# graphdoctor/parent/runner.py DETERMINISTIC_ENV: every diff child gets them unless the user set them.
os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

warnings.filterwarnings("ignore")  # as graphdoctor/child/entry.py run(): megatron and torch warn at every import

import torch  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import (  # noqa: E402
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.full_cuda_graph import FullCudaGraphWrapper, get_shared_capture_stream  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

MEGATRON_IMPL = {"eager": "none", "local": "local", "full_iteration": "full_iteration"}
"""graphdoctor's implementation names -> TransformerConfig.cuda_graph_impl (graphdoctor.config.impl.Impl.megatron)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The run's settings; every default is graphdoctor's DiffConfig default (graphdoctor/config/diff_config.py), and
    with --megatron-args what diff takes from the line where its own flags do not say (Megatron-LM's defaults)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--impl", choices=tuple(MEGATRON_IMPL), default="eager", help="eager: cuda_graph_impl none")
    p.add_argument("--num-layers", type=int, default=4, help="transformer layers")
    p.add_argument("--hidden-size", type=int, default=256, help="hidden size")
    p.add_argument("--num-attention-heads", type=int, default=8, help="attention heads")
    p.add_argument("--ffn-hidden-size", type=int, default=None,
                   help="None: the line's, else 4 x hidden size (Megatron-LM's SwiGLU rule with --swiglu)")
    p.add_argument("--seq-length", type=int, default=128, help="tokens per sequence")
    p.add_argument("--micro-batch-size", type=int, default=2, help="sequences per micro-batch")
    p.add_argument("--num-microbatches", type=int, default=1, help="micro-batches per step")
    p.add_argument("--vocab-size", type=int, default=1024, help="vocabulary (padded only with --megatron-args)")
    p.add_argument("--steps", type=int, default=8, help="training steps")
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: Float16Module")
    p.add_argument("--seed", type=int, default=1234, help="model init, RNG tracker and batches")
    p.add_argument("--cuda-graph-warmup-steps", type=int, default=None,
                   help="eager steps before capture; None: 2 (DiffConfig's), 3 with --megatron-args (Megatron-LM's)")
    p.add_argument("--megatron-args", metavar="LINE", default=None,
                   help="Megatron-LM model flags, as diff's --megatron-args (only those LINE_FLAGS reads)")
    p.add_argument("--cpu-init", action="store_true",
                   help="initialise the weights on the CPU (a diff with run: {gpu_init: false}); default: the GPU")
    p.add_argument("--json", metavar="PATH", default=None, help="write the measurements here as one JSON object")
    args = p.parse_args(_line_joined(argv))
    args.line = None if args.megatron_args is None else parse_line(args.megatron_args, p)
    line = args.line
    if args.ffn_hidden_size is None:  # diff's flags sit over the line, the line over Megatron-LM's defaults
        args.ffn_hidden_size = line.ffn_hidden_size if line is not None else None
    if args.ffn_hidden_size is None:
        # Megatron-LM's validate_args: SwiGLU keeps the parameters of a 4 x hidden MLP, rounded down to 64
        swiglu = line is not None and line.swiglu
        args.ffn_hidden_size = int(4 * args.hidden_size * 2 / 3 / 64) * 64 if swiglu else 4 * args.hidden_size
    if args.cuda_graph_warmup_steps is None:
        args.cuda_graph_warmup_steps = 2 if line is None else line.cuda_graph_warmup_steps
    return args


def _line_joined(argv: list[str]) -> list[str]:
    """`--megatron-args LINE` as `--megatron-args=LINE`: argparse reads a value that starts with `--` and has no
    space (a line of one flag) as a flag of its own."""
    out: list[str] = []
    rest = iter(argv)
    for arg in rest:
        out.append(f"{arg}={next(rest, '')}" if arg == "--megatron-args" else arg)
    return out


LINE_FLAGS: tuple[str, ...] = (
    "--group-query-attention", "--num-query-groups", "--ffn-hidden-size", "--swiglu", "--normalization",
    "--position-embedding-type", "--rotary-base", "--max-position-embeddings", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--transformer-impl", "--no-masked-softmax-fusion", "--no-rope-fusion",
    "--no-gradient-accumulation-fusion", "--no-persist-layer-norm", "--cuda-graph-warmup-steps", "--num-experts",
    "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-token-dispatcher-type", "--moe-router-load-balancing-type",
    "--moe-aux-loss-coeff", "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity",
)
"""The Megatron-LM flags --megatron-args may hold here (line_parser: their Megatron-LM defaults)."""


def line_parser() -> argparse.ArgumentParser:
    """LINE_FLAGS with Megatron-LM's spellings, types and defaults (megatron/training/arguments.py); any other flag
    is refused, since this script would build without it what diff's child builds with it."""
    p = argparse.ArgumentParser(prog="--megatron-args", add_help=False, allow_abbrev=False)
    p.add_argument("--group-query-attention", action="store_true")
    p.add_argument("--num-query-groups", type=int, default=1)
    p.add_argument("--ffn-hidden-size", type=int, default=None)
    p.add_argument("--swiglu", action="store_true")
    p.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=("learned_absolute", "rope"), default="learned_absolute")
    p.add_argument("--rotary-base", type=int, default=10000)
    # Megatron-LM asks for it; GPTModelBuilder sizes the model from seq_length, so it changes nothing built here
    p.add_argument("--max-position-embeddings", type=int, default=None)
    p.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    p.add_argument("--disable-bias-linear", action="store_true")
    p.add_argument("--transformer-impl", choices=("local", "transformer_engine"), default="transformer_engine")
    p.add_argument("--no-masked-softmax-fusion", dest="masked_softmax_fusion", action="store_false")
    p.add_argument("--no-rope-fusion", dest="apply_rope_fusion", action="store_false")
    p.add_argument("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion", action="store_false")
    p.add_argument("--no-persist-layer-norm", dest="persist_layer_norm", action="store_false")
    p.add_argument("--cuda-graph-warmup-steps", type=int, default=3)
    p.add_argument("--num-experts", type=int, default=None)
    p.add_argument("--moe-router-topk", type=int, default=2)
    p.add_argument("--moe-ffn-hidden-size", type=int, default=None)
    p.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall"), default="allgather")
    p.add_argument("--moe-router-load-balancing-type", choices=("aux_loss", "seq_aux_loss", "none"),
                   default="aux_loss")
    p.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    p.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    return p


def parse_line(text: str, outer: argparse.ArgumentParser) -> argparse.Namespace:
    """The flags of one --megatron-args LINE (split as a shell splits it); `outer` reports a refusal (exit 2)."""
    line, unknown = line_parser().parse_known_args(shlex.split(text))
    if unknown:
        outer.error(f"--megatron-args: {' '.join(unknown)}: not a flag this script reads (LINE_FLAGS)")
    if line.transformer_impl != "local":
        outer.error("--megatron-args: this script builds Megatron's local layers; add --transformer-impl local")
    return line


def params_dtype(dtype: str) -> torch.dtype:
    return torch.bfloat16 if dtype == "bf16" else torch.float32


def transformer_config(args: argparse.Namespace) -> TransformerConfig:
    """The TransformerConfig of a diff child: DiffConfig._builtin_model's fields with the child's graph_fields
    (graphdoctor/config/diff_config.py, builtin.py), every other field Megatron's default; with --megatron-args the
    fields Megatron-LM's parser gives the line over them (megatron_lm_fields). Needs no GPU."""
    precision: dict[str, Any] = {"bf16": True} if args.dtype == "bf16" else {}  # builtin.DTYPE_FIELDS
    fields: dict[str, Any] = dict(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size,  # graphdoctor leaves it unset: __post_init__ makes it 4 x hidden
        # Megatron's default, as a user's run and a diff child (DiffConfig.gpu_init) build it: on the GPU.
        use_cpu_initialization=args.cpu_init,
        hidden_dropout=args.dropout, attention_dropout=args.dropout,
        cuda_graph_impl=MEGATRON_IMPL[args.impl],
        cuda_graph_modules=[],  # graph_fields: DiffConfig.cuda_graph_modules () (Megatron's default is "full")
        cuda_graph_warmup_steps=args.cuda_graph_warmup_steps,  # DiffConfig's 2 (Megatron's default is 3)
        enable_cuda_graph=False, external_cuda_graph=False,  # graph_fields
        params_dtype=params_dtype(args.dtype), **precision,
        transformer_impl="local",  # DiffConfig._builtin_model: DiffConfig.layer_spec None -> Megatron's local spec
    )
    if args.line is not None:
        fields.update(megatron_lm_fields(args))
    return TransformerConfig(**fields)


def megatron_lm_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The TransformerConfig fields of a --megatron-args line that differ from TransformerConfig's own defaults:
    core_transformer_config_from_args (megatron/training/argument_utils.py) copies every argument named like a
    field, so Megatron-LM's argument defaults land where the line sets nothing (the fusions on, softmax in the
    input dtype), and the flags LINE_FLAGS reads land where it does."""
    line = args.line
    fields: dict[str, Any] = {
        # Megatron-LM's argument defaults, for any line
        "attention_softmax_in_fp32": False, "bias_dropout_fusion": True, "deallocate_pipeline_outputs": True,
        "pipeline_dtype": params_dtype(args.dtype), "tensor_parallel_num_weight_shards": 1,
        "expert_tensor_parallel_num_weight_shards": 1, "cp_comm_type": "p2p", "inference_sampling_seed": args.seed,
        "bias_activation_fusion": True,  # --bias-swiglu-fusion / --bias-gelu-fusion, on unless turned off
        # the flags LINE_FLAGS reads
        "masked_softmax_fusion": line.masked_softmax_fusion, "apply_rope_fusion": line.apply_rope_fusion,
        "gradient_accumulation_fusion": line.gradient_accumulation_fusion,
        "persist_layer_norm": line.persist_layer_norm, "normalization": line.normalization,
        "num_query_groups": line.num_query_groups if line.group_query_attention else None,
        "add_bias_linear": not line.disable_bias_linear, "transformer_impl": line.transformer_impl,
    }
    if line.swiglu:
        fields.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if line.num_experts is not None:
        fields.update(num_moe_experts=line.num_experts, moe_router_topk=line.moe_router_topk,
                      moe_ffn_hidden_size=line.moe_ffn_hidden_size or args.ffn_hidden_size,
                      moe_token_dispatcher_type=line.moe_token_dispatcher_type,
                      moe_router_load_balancing_type=line.moe_router_load_balancing_type,
                      moe_aux_loss_coeff=line.moe_aux_loss_coeff,
                      moe_expert_capacity_factor=line.moe_expert_capacity_factor,
                      moe_pad_expert_input_to_capacity=line.moe_pad_expert_input_to_capacity)
    return fields


def layer_spec(config: TransformerConfig) -> Any:
    """Megatron's GPTModelBuilder default_layer_spec for local layers (megatron/training/models/gpt.py), the
    spec a diff child's model gets (DiffConfig.layer_spec None): the decoder block spec for MoE, else the local
    layer spec."""
    if config.num_moe_experts is not None:
        return get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=config.normalization,
                                          qk_l2_norm=config.qk_l2_norm, vp_stage=None)
    return get_gpt_layer_local_spec(
        config.num_moe_experts, config.moe_grouped_gemm, config.qk_layernorm, config.multi_latent_attention,
        config.experimental_attention_variant, normalization=config.normalization, use_kitchen=config.use_kitchen,
        use_kitchen_attention=config.use_kitchen_attention, kitchen_attention_backend=config.kitchen_attention_backend)


def padded_vocab_size(args: argparse.Namespace) -> int:
    """graphdoctor's model: the vocabulary as given (should_pad_vocab False); a line's: padded to a multiple of
    Megatron-LM's --make-vocab-size-divisible-by 128 (one tensor-parallel rank), as GPTModelBuilder pads it."""
    if args.line is None:
        return int(args.vocab_size)
    return -(-args.vocab_size // 128) * 128


def gpt_model(args: argparse.Namespace, config: TransformerConfig) -> GPTModel:
    """GPTModel as Megatron's GPTModelBuilder.build_model builds it from the child's GPTModelConfig
    (megatron/training/models/gpt.py): graphdoctor's (vocab_size, seq_length, every other field its default) or a
    line's (the vocabulary padded, embeddings tied unless untied, its position embedding). Not moved to a GPU."""
    line = args.line
    return GPTModel(
        config=config, transformer_layer_spec=layer_spec(config), mtp_block_spec=None,
        vocab_size=padded_vocab_size(args),
        max_sequence_length=args.seq_length, fp16_lm_cross_entropy=False, parallel_output=True,
        # GPTModelConfig's default False for graphdoctor's model (GPTModel's own is True); Megatron-LM ties them
        # unless --untie-embeddings-and-output-weights
        share_embeddings_and_output_weights=line is not None and not line.untie_embeddings_and_output_weights,
        position_embedding_type="learned_absolute" if line is None else line.position_embedding_type,
        rotary_percent=1.0, rotary_base=10000 if line is None else line.rotary_base, rope_scaling=False,
        rope_scaling_factor=8.0, seq_len_interpolation_factor=None, scatter_embedding_sequence_parallel=True,
        pre_process=True, post_process=True, pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
        vp_stage=None,
    )


def build_model(args: argparse.Namespace, config: TransformerConfig) -> torch.nn.Module:
    """gpt_model on this process's GPU, Float16Module-wrapped for bf16."""
    model = gpt_model(args, config).cuda(torch.cuda.current_device())
    return Float16Module(config, model) if args.dtype == "bf16" else model


def wrap_ddp(impl: str, config: TransformerConfig, model: torch.nn.Module) -> DistributedDataParallel:
    """Megatron DDP with graphdoctor's settings (child/distributed.py ddp_config); for full_iteration built on
    the shared capture stream, as child/megatron_setup.py wrap_ddp does (else capture fails on torch 2.11)."""
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False, bucket_size=None)
    if impl != "full_iteration":
        return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    stream = get_shared_capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    torch.cuda.current_stream().wait_stream(stream)
    return ddp


CONSTANT: dict[int, dict[str, torch.Tensor]] = {}
"""Causal mask, positions and loss mask per micro-batch index, allocated once (child/batches.py constant_inputs)."""


def batch(args: argparse.Namespace, step: int, microbatch: int) -> dict[str, torch.Tensor]:
    """child/batches.py synthetic_batch on one GPU (data-parallel salt 0)."""
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + microbatch)
    b, s = args.micro_batch_size, args.seq_length
    data = torch.randint(0, args.vocab_size, (b, s + 1), generator=gen)
    device = torch.device("cuda", torch.cuda.current_device())
    if microbatch not in CONSTANT:
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)
        CONSTANT[microbatch] = {
            "loss_mask": torch.ones(b, s, dtype=torch.float32).to(device),
            "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous().to(device),
            "attention_mask": causal.to(device),
        }
    return {"tokens": data[:, :-1].contiguous().to(device), "labels": data[:, 1:].contiguous().to(device),
            **CONSTANT[microbatch]}


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[Any, Any, Any]:
    """Megatron-LM pretrain_gpt's loss: token sum, token count, reported [sum, count]."""
    mask = loss_mask.view(-1).float()
    loss = torch.sum(output_tensor.float().view(-1) * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.float().view(1)])}


def forward_step(data_iterator: Iterator[dict[str, torch.Tensor]],
                 model: torch.nn.Module) -> tuple[torch.Tensor, Callable[..., Any]]:
    data = next(data_iterator)
    output = model(data["tokens"], data["position_ids"], data["attention_mask"], labels=data["labels"])
    return output, partial(loss_func, data["loss_mask"])


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_began = time.time()
    startup_s = setup_began - STARTED
    # graphdoctor/child/entry.py deterministic_algorithms (DiffConfig.deterministic True)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.cuda.set_device(0)
    # Megatron-LM's initialize.py binds no device: communicators are created at their groups' first collective
    torch.distributed.init_process_group(backend="nccl", store=torch.distributed.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    # te_rng_tracker False: child_model.te_rng_tracker for local layers with local/full_iteration/no graphs
    model_parallel_cuda_manual_seed(args.seed, te_rng_tracker=False, use_cudagraphable_rng=args.impl != "eager",
                                    force_reset_rng=True)
    config = transformer_config(args)
    model = wrap_ddp(args.impl, config, build_model(args, config))
    optimizer = get_megatron_optimizer(OptimizerConfig(  # child/megatron_setup.py build_optimizer
        optimizer="adam", lr=1e-3, weight_decay=0.01, clip_grad=1.0, bf16=args.dtype == "bf16", fp16=False,
        params_dtype=params_dtype(args.dtype), use_distributed_optimizer=False), [model])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    forward_backward: Callable[..., Any] = get_forward_backward_func()
    wrapper = None
    if args.impl == "full_iteration":
        forward_backward = wrapper = FullCudaGraphWrapper(forward_backward,
                                                          cuda_graph_warmup_steps=args.cuda_graph_warmup_steps)
    setup_s = time.time() - setup_began
    num_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)

    step_ms: list[float] = []
    losses: list[float] = []
    train_began = time.perf_counter()
    for step in range(args.steps):  # child/loop.py StepRunner.train_step
        data = iter([batch(args, step, m) for m in range(args.num_microbatches)])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        model.zero_grad_buffer()
        optimizer.zero_grad()
        start.record()
        reports = forward_backward(forward_step_func=forward_step, data_iterator=data, model=[model],
                                   num_microbatches=args.num_microbatches, seq_length=args.seq_length,
                                   micro_batch_size=args.micro_batch_size, forward_only=False)
        optimizer.step()
        end.record()
        end.synchronize()
        step_ms.append(start.elapsed_time(end))
        # Megatron-LM's train_step reduction of "lm loss" ([sum, count] summed over micro-batches, then sum / count)
        total = torch.stack([r["lm loss"].float() for r in reports]).sum(dim=0)
        losses.append(float(total[0] / total[1]))
        if config.num_moe_experts is not None:  # child/megatron_setup.py clear_moe_metrics, after every step
            get_moe_metrics_tracker().clear()
    torch.cuda.synchronize()
    train_s = time.perf_counter() - train_began

    result = {"impl": args.impl, "startup_s": startup_s, "setup_s": setup_s, "train_s": train_s,
              "step_ms": step_ms, "losses": losses, "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
              "num_parameters": num_parameters,
              "config": {k: v for k, v in vars(args).items() if k not in ("json", "line")},
              "wall_s": time.time() - STARTED}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    print(f"bare_megatron impl={args.impl} dtype={args.dtype} steps={args.steps} startup={startup_s:.2f}s "
          f"setup={setup_s:.2f}s train={train_s:.2f}s median_step={statistics.median(step_ms):.2f}ms "
          f"final_loss={losses[-1]:.6f} peak={result['peak_allocated_bytes'] / 2**20:.1f}MiB "
          f"params={num_parameters} wall={result['wall_s']:.2f}s", flush=True)
    del wrapper
    # Exit at once, as a one-process graphdoctor child does (graphdoctor/child/entry.py main: os._exit): on the H200
    # destroy_process_group and the interpreter's shutdown with torch and Megatron loaded took about 10 s more, which
    # would count in the bare side's seconds and flatter diff's ratio.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
