"""What the diff page shows, assembled from a loaded report (diff/report.py's DiffReport or TapRecording): the run
facts as display strings, each implementation's compared runs, and tensor-difference magnitudes as the charts plot them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from graphdoctor.compare.verdict import ImplResult
from graphdoctor.diff.report import DiffReport, TapRecording
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.steps import StepRecord
from graphdoctor.types import TensorDiff

_TORCH = re.compile(r"torch ([\w.+]+)")
_MCORE = re.compile(r"megatron-core ([\w.]+)")

TAP_DTYPE = "fp32"
"""DiffConfig's default dtype, shown for a tap recording whose command does not set one."""


def _model_line(layers: object, hidden: object, heads: object, seq: object, micro_batch: object,
                num_microbatches: object, spec: object) -> str:
    """`GPTModel 2 layers x 128 hidden, 4 heads, seq 64, micro-batch 2 x 1, te`; None parts are left out."""
    model = f"GPTModel {layers} layers x {hidden} hidden, {heads} heads"
    if seq is not None:
        model += f", seq {seq}"
    if micro_batch is not None:
        model += f", micro-batch {micro_batch} x {num_microbatches}"
    if spec:
        model += f", {spec}"
    return model


def _tolerance(rtol: float, atol: float) -> str:
    return "bitwise" if rtol == 0.0 and atol == 0.0 else f"rtol {rtol:g}, atol {atol:g}"


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What ran, as the page's facts show it: model, parallelism, dtype, dropout, versions and GPU."""

    model: str
    parallelism: str
    dtype: str
    dropout: float | None
    steps: int | None
    warmup_steps: int | None
    tolerance: str
    torch: str
    megatron_core: str
    gpu: str
    recorded: str

    @classmethod
    def of_report(cls, report: DiffReport) -> RunInfo:
        """From the report's configuration and the eager reference's versions and device."""
        config, env = report.config, report.env
        model = _model_line(config.num_layers, config.hidden_size, config.num_attention_heads, config.seq_length,
                            config.micro_batch_size, config.num_microbatches,
                            config.model_provider or config.layer_spec)
        tp = config.transformer.get("tensor_model_parallel_size", config.tensor_model_parallel_size)
        pp = config.transformer.get("pipeline_model_parallel_size", config.pipeline_model_parallel_size)
        ep = config.transformer.get("expert_model_parallel_size", config.expert_model_parallel_size)
        parallelism = f"world size {env.world_size if env else 1}, TP {tp}, PP {pp}" + (f", EP {ep}" if ep > 1 else "")
        return cls(model, parallelism, str(config.dtype or "?"), float(config.dropout), config.steps,
                   config.cuda_graph_warmup_steps, _tolerance(float(config.rtol), float(config.atol)),
                   str(env.torch if env and env.torch else "?"),
                   str(env.megatron_core if env and env.megatron_core else "?"),
                   str(env.gpu if env and env.gpu else "?"), "")

    @classmethod
    def of_taps(cls, taps: TapRecording) -> RunInfo:
        """From the recorded command's settings and the recording line (GPU, torch and megatron-core versions)."""
        get = taps.settings().get
        model = _model_line(get("num_layers", "?"), get("hidden_size", "?"), get("num_attention_heads", "?"),
                            get("seq_length"), get("micro_batch_size"), get("num_microbatches", 1),
                            get("model_provider") or get("layer_spec"))
        tp, pp = get("tensor_model_parallel_size", 1), get("pipeline_model_parallel_size", 1)
        steps, warmup = get("steps"), get("cuda_graph_warmup_steps")
        recorded = taps.recorded
        torch_v, mcore_v = _TORCH.search(recorded), _MCORE.search(recorded)
        return cls(model, f"world size 1, TP {tp}, PP {pp}", str(get("dtype") or TAP_DTYPE), taps.dropout,
                   steps if isinstance(steps, int) else None, warmup if isinstance(warmup, int) else None,
                   _tolerance(_number(get("rtol")), _number(get("atol"))),
                   torch_v.group(1) if torch_v else "?", mcore_v.group(1) if mcore_v else "?",
                   recorded.split(",")[0] if recorded else "?", recorded)


def _number(value: Any) -> float:
    """A recorded command's tolerance setting as a float (0 when absent or not a number)."""
    try:
        return float(value or 0.0)
    except ValueError:
        return 0.0


def graphed_run(result: ImplResult) -> RunRecord | None:
    """The compared graphed run at the configured dropout (the first run of this implementation)."""
    return next((r for r in result.runs if r.impl == result.impl), None)


def control_run(result: ImplResult, dropout: float | None) -> RunRecord | None:
    """The dropout-free control run, when the configured dropout is not 0."""
    if not dropout:
        return None
    return next((r for r in result.runs if r.impl == result.impl and r.dropout == 0.0), None)


def compared_steps(run: RunRecord) -> tuple[StepRecord, ...]:
    """Steps that were compared against eager (the profiled extra step is left out)."""
    return tuple(s for s in run.steps if not s.profiled)


def magnitudes(diff: TensorDiff) -> tuple[float | None, float | None]:
    """(max abs, max rel) of one step's family as the charts plot them: where only bit fingerprints were compared,
    equal fingerprints are bitwise equal tensors (0) and differing ones have no known magnitude (None)."""
    if diff.measured:
        return diff.max_abs, diff.max_rel
    return (0.0, 0.0) if diff.num_unequal == 0 else (None, None)


@dataclass(frozen=True, slots=True)
class ReportView:
    """One page's content: the facts, the reference runs and the rows of a diff report or a tap recording."""

    source: str
    """"diff" for a diff report, "taps" for a recorded tap-table file."""

    info: RunInfo
    exit_code: int | None
    wall_s: float | None
    reference: RunRecord | None
    control_reference: RunRecord | None
    impls: tuple[ImplResult, ...]
    stopped: str | None = None
    """The signal that stopped graphdoctor before the diff finished (a partial report), else None."""

    @classmethod
    def of(cls, saved: DiffReport | TapRecording) -> ReportView:
        """The page content of a loaded report."""
        if isinstance(saved, TapRecording):
            return cls("taps", RunInfo.of_taps(saved), None, None, None, None, (saved.result,))
        return cls("diff", RunInfo.of_report(saved), saved.exit_code(), saved.wall_s, saved.reference,
                   saved.control_reference, saved.results, stopped=saved.stopped)

    def graphed_runs(self) -> list[tuple[str, RunRecord]]:
        """(implementation, its compared graphed run) for each row that has one."""
        return [(result.impl, run) for result in self.impls if (run := graphed_run(result)) is not None]


__all__ = ["RunInfo", "ReportView", "compared_steps", "control_run", "graphed_run", "magnitudes"]
