"""Render a DiffReport: a ten-second terminal summary (tabulate) and the versioned JSON file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from graphdoctor.compare.phases import teardown_note
from graphdoctor.config.impl import Impl
from graphdoctor.envelope import envelope
from graphdoctor.inputs import write_output
from graphdoctor.launches.compare import TABLE_ROWS, LaunchComparison, table_rows
from graphdoctor.parent.timeline import cost_line
from graphdoctor.report.escape import escape_control
from graphdoctor.report.forensics import forensics_table
from graphdoctor.report.schedule import phase_lines
from graphdoctor.strict_json import json_safe

if TYPE_CHECKING:
    from graphdoctor.compare.verdict import ImplResult, Timing
    from graphdoctor.config import DiffConfig
    from graphdoctor.diff.report import DiffReport
    from graphdoctor.protocol.record import RunRecord
    from graphdoctor.types import Diagnosis, RankStack

_MARK = {"match": "ok", "rng-divergence": "ok*", "unavailable": "--"}


def _mark(result: ImplResult) -> str:
    """`ok`, `ok*` (passes, random streams differ), `--` (not run here) or `FAIL` (an rng-divergence that a cause
    explains fails too)."""
    mark = _MARK.get(result.verdict.value, "FAIL")
    return "FAIL" if mark != "--" and not result.passed else mark


def _num(value: float | None, fmt: str = "{:.3g}") -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def _first(result: ImplResult) -> str:
    if result.divergence is not None:
        d = result.divergence
        if d.what == "eval":
            return f"{d.label} after step {d.step}"
        if d.tensor is None:
            return f"step {d.step} {d.label}"
        return f"step {d.step} {d.label} ({d.tensor})" if d.what not in ("loss", "reported", "skipped") else \
            f"step {d.step} {d.label}; grads from {d.tensor}"
    if result.diagnosis is not None and result.verdict.value not in ("match",):
        diag = result.diagnosis
        where = diag.location or diag.module or ""
        return " ".join(x for x in (diag.rule, diag.cuda_error or diag.error_type, where) if x)
    return "-"


def _speedup(timing: Timing | None) -> str:
    """`1.99x (1.95-2.03)`, or `none measurable (0.97-1.04)` when the spread straddles 1.0."""
    if timing is None or timing.speedup is None:
        return "-"
    spread = timing.speedup_range
    text = f"{timing.speedup:.2f}x"
    if spread is not None:
        text += f" ({spread[0]:.2f}-{spread[1]:.2f})"
        if not timing.measurable:
            text = f"none measurable ({spread[0]:.2f}-{spread[1]:.2f})"
    return text + ("" if timing.quiet else " shared GPU")


def summary_rows(report: DiffReport) -> list[list[str]]:
    """One row per implementation (used by the text renderer and the pytest plugin)."""
    rows = []
    for result in report.results:
        timing = result.timing
        div = result.divergence
        rows.append([
            result.impl,
            f"{result.verdict.value} {_mark(result)}",
            _first(result),
            _num(div.max_abs if div else (0.0 if result.verdict.value == "match" else None)),
            _num(div.max_rel if div else (0.0 if result.verdict.value == "match" else None)),
            _num(timing.eager_ms if timing else None, "{:.2f}"),
            _num(timing.graphed_ms if timing else None, "{:.2f}"),
            _speedup(timing),
        ])
    return rows


def render_text(report: DiffReport, *, verbose: bool = False) -> str:
    """Terminal summary: header line, table, then one line per failure, control and note."""
    cfg = report.config
    env = report.env
    lines = [header_line(cfg)]
    if report.model is not None:
        lines.append(model_line(report.model, report.reference.num_parameters or None))
    if env is not None:
        lines.append(f"  {env.gpu or '?'} | torch {env.torch or '?'} | megatron-core "
                     f"{env.megatron_core or '?'} | world size {env.world_size}")
    if cfg.nproc_per_node > 1:
        lines.append(placement_line(cfg))
    if report.stopped:
        lines.append(f"STOPPED by {report.stopped} before the diff finished: a partial report (each row says "
                     "how far its runs got)")
    table = tabulate(summary_rows(report), headers=[
        "impl", "verdict", "first divergence", "max abs", "max rel", "eager ms", "graphed ms",
        "speedup"], tablefmt="simple")
    lines += ["", table, ""]
    if report.reference.evals or report.config.eval_interval or report.config.save_at:
        lines += [*phase_lines(report), ""]
    launches = launch_table(report)
    if launches:
        lines += [launches, ""]
    lines += _details(report, verbose=verbose)
    lines.append(cost_line(report.timeline, report.runs(), report.jobs))
    lines.append(f"wall {report.wall_s:.1f} s (children {report.child_wall_s:.1f} s); "
                 f"exit code {report.exit_code()}")
    return "\n".join(lines)


def verdict_lines(report: DiffReport) -> list[str]:
    """A diff's verdicts as a failing test shows them (graphdoctor.assert_graphs_match, the pytest plugin).

    `graphdoctor diff exit code 1: local numeric-divergence` first (pytest's short summary shows that line),
    then the header line, one line per implementation (its summary row: verdict, first divergence, max abs
    and rel), then the lines render_text prints under its table (each failure's diagnosis with its module,
    file:line, fix and rule; control pairs, notes).
    """
    verdicts = ", ".join(f"{r.impl} {r.verdict.value}" for r in report.results)
    stopped = f" (stopped by {report.stopped}: a partial report)" if report.stopped else ""
    lines = [f"graphdoctor diff exit code {report.exit_code()}{stopped}: {verdicts or 'no implementation'}",
             header_line(report.config)]
    for impl, verdict, first, max_abs, max_rel, *_ in summary_rows(report):
        line = f"{impl}: {verdict}"
        if first != "-":
            line += f", first divergence {first}"
        if max_abs != "-" and not verdict.startswith("match"):
            line += f", max abs {max_abs}, max rel {max_rel}"
        lines.append(line)
    details = _details(report, verbose=False)
    return [*lines, *details[:-1]]  # _details ends in a blank line


def header_line(cfg: DiffConfig, command: str = "graphdoctor diff") -> str:
    """The first line of a diff's summary (and of `diff --plan`): the model, the run and the comparison policy."""
    policy = "bitwise" if cfg.bitwise else f"rtol={cfg.rtol:g} atol={cfg.atol:g}"
    kind = "HybridModel" if cfg.model is not None and cfg.model.kind == "hybrid" else "GPTModel"
    return (f"{command}: {kind} {cfg.num_layers}x{cfg.hidden_size} ({cfg.num_attention_heads}"
            f" heads), seq {cfg.seq_length}, mbs {cfg.micro_batch_size}x{cfg.num_microbatches}, "
            f"{cfg.dtype}, dropout {cfg.dropout:g}, {cfg.steps} steps, warmup "
            f"{cfg.cuda_graph_warmup_steps}, {policy}")


def model_line(facts: dict[str, Any], num_parameters: int | None = None) -> str:
    """`  model: ...`: the model as built (graphdoctor.config.description.model_facts), in one line."""
    parts = [f"{facts.get('num_layers')} layers x {facts.get('hidden_size')}",
             f"{facts.get('num_attention_heads')} heads"
             + (f" / {facts['num_query_groups']} query groups" if facts.get("attention") == "GQA" else "")
             + f" ({facts.get('attention')})",
             _ffn(facts)]
    position = facts.get("position_embedding")
    parts.append(f"{position} (base {facts['rotary_base']})" if facts.get("rotary_base") else str(position))
    parts += [str(facts.get("normalization")), "tied embeddings" if facts.get("tied_embeddings") else "untied embeddings",
              f"vocab {facts.get('vocab_size')}", f"{facts.get('layer_spec')} spec", str(facts.get("dtype"))]
    if facts.get("fp8"):
        parts.append(f"fp8 {facts['fp8']}" + (f" {facts['fp8_recipe']}" if facts.get("fp8_recipe") else ""))
        if facts.get("fp8_param"):
            parts.append("fp8 primary weights")
    if facts.get("fp4"):
        parts.append(f"fp4 {facts['fp4']}" + (f" {facts['fp4_recipe']}" if facts.get("fp4_recipe") else ""))
    moe = facts.get("moe")
    if moe:
        parts.append(f"MoE {moe.get('num_experts')} experts top-{moe.get('topk')} {moe.get('dispatcher')}")
    mla = facts.get("mla")
    if mla:
        parts.append("MLA " + " ".join(f"{k.removesuffix('_rank').removesuffix('_head_dim')} {v}"
                                       for k, v in mla.items() if v is not None))
    if facts.get("mtp_num_layers"):
        parts.append(f"MTP {facts['mtp_num_layers']}")
    if facts.get("hybrid_layer_pattern"):
        parts.append(f"hybrid {facts['hybrid_layer_pattern']}")
    if num_parameters:
        parts.append(f"{num_parameters / 1e9:.3g} B parameters")
    return escape_control(f"  model: {', '.join(parts)}; from {facts.get('source')}")


def _ffn(facts: dict[str, Any]) -> str:
    """`ffn N act`; for a MoE, the experts' ffn, with the dense one beside it where some layers are dense."""
    moe, activation = facts.get("moe") or {}, facts.get("activation")
    expert = moe.get("ffn_hidden_size")
    if not expert:
        return f"ffn {facts.get('ffn_hidden_size')} {activation}"
    freq = moe.get("layer_freq")
    dense = isinstance(freq, list) and 0 in freq or isinstance(freq, int) and freq > 1 or \
        isinstance(freq, str) and "0" in freq
    return f"expert ffn {expert} {activation}" + (f" (dense layers {facts.get('ffn_hidden_size')})" if dense else "")


def placement_line(cfg: DiffConfig) -> str:
    """The multi-GPU line of the header: processes, parallel sizes, DDP settings, whose figures print."""
    from graphdoctor.config.placement import data_parallel_size

    ddp = [name for name, on in (("sequence parallel", cfg.sequence_parallel),
                                 ("overlap_grad_reduce", cfg.overlap_grad_reduce),
                                 ("distributed optimizer", cfg.use_distributed_optimizer)) if on]
    if cfg.ddp_bucket_size is not None:
        ddp.append(f"bucket {cfg.ddp_bucket_size}")
    ep = f", EP {cfg.expert_model_parallel_size}" if cfg.expert_model_parallel_size > 1 else ""
    return (f"  {cfg.nproc_per_node} processes per run: TP {cfg.tensor_model_parallel_size}, PP "
            f"{cfg.pipeline_model_parallel_size}{ep}, DP {data_parallel_size(cfg)}{', ' if ddp else ''}"
            f"{', '.join(ddp)}; "
            f"every rank compared (tensors named rank<r>:), memory and launch figures printed are rank 0's "
            f"(every rank's in --json: runs[].ranks)")


def launch_table(report: DiffReport) -> str:
    """Eager-vs-graphed launch table of the profiled step: one column per implementation."""
    return launch_table_from_sections([(r.impl, r.launches) for r in report.results if r.launches])


def launch_table_from_sections(sections: list[tuple[str, LaunchComparison]]) -> str:
    """The launch table from (impl, launch comparison) pairs (diff and live count share it)."""
    if not sections:
        return ""
    eager = next((s.eager for _, s in sections if s.eager is not None), None)
    columns = [table_rows(eager, s.graphed) for _, s in sections]
    rows = []
    for i, (label, _) in enumerate(TABLE_ROWS):
        row = [label, _cell(columns[0][i][1])]
        row += [_cell(col[i][2]) for col in columns]
        rows.append(row)
        if label == "GPU kernels inside graphs" and any(s.tap_graph_nodes for _, s in sections):
            rows.append(["  graph nodes of graphdoctor's taps", "-", *[_cell(s.tap_graph_nodes) for _, s in sections]])
    headers = ["launches (profiled step)", Impl.EAGER, *[impl for impl, _ in sections]]
    return tabulate(rows, headers=headers, tablefmt="simple")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 1 else f"{value:.0f}"
    return str(value)


def _diagnosis_lines(name: str, diag: Diagnosis, *, verbose: bool) -> list[str]:
    """`name: Type: message`, then what it means, where and the fix, each when known."""
    out = [f"{name}: {diag.error_type}: {diag.message}"]
    if diag.cuda_error or diag.meaning:
        out.append(f"  means: {diag.cuda_error + ': ' if diag.cuda_error else ''}"
                   f"{diag.meaning or ''}")
    if diag.location or diag.module:
        out.append(f"  at: {diag.location or '?'}"
                   f"{' in module ' + diag.module if diag.module else ''}"
                   f"{' (step ' + str(diag.step) + ', ' + str(diag.phase) + ')' if diag.step is not None and diag.step >= 0 else ''}")
    if diag.also_at:
        out.append(f"  also at: {', '.join(diag.also_at)}")
    if diag.fix:
        out.append(f"  fix: {diag.fix}{' [' + diag.rule + ']' if diag.rule else ''}")
    for stack in diag.stacks:
        out += _stack_lines(stack, verbose=verbose)
    if verbose and not diag.stacks:
        out += [f"    {frame}" for frame in diag.traceback_tail]
    return out


STACK_LINES = 3
"""Frames of each rank's stack the terminal shows (all of them with -v; the JSON keeps them)."""


def _stack_lines(stack: RankStack, *, verbose: bool) -> list[str]:
    """`  rank0 (replay, last step 1): waiting in all_reduce (...)`, then its first frames."""
    state = "launcher" if stack.label == "launcher" else \
        f"{stack.phase or 'startup'}, last step {stack.last_step if stack.last_step >= 0 else '-'}"
    head = f"  {stack.label} ({state}): " + (f"waiting in {stack.waiting_in}" if stack.waiting_in else
                                             "stack" if stack.frames else "no stack")
    if stack.user_frame and stack.label != "launcher":
        head += f"; at {stack.user_frame}"
    frames = stack.frames if verbose else stack.frames[:STACK_LINES if stack.label != "launcher" else 1]
    return [head, *[f"      {frame}" for frame in frames]]


def _teardown_lines(name: str, run: RunRecord) -> list[str]:
    note = teardown_note(run.teardown)
    if note is None:
        return []
    out = [f"{name}: {note}"]
    for rank_exit in run.teardown:
        if rank_exit.hung and rank_exit.stack is not None:
            out += _stack_lines(rank_exit.stack, verbose=False)
    return out


def _details(report: DiffReport, *, verbose: bool) -> list[str]:
    out: list[str] = []
    ref = report.reference
    if ref.status != "ok" and ref.diagnosis is not None:
        out += _diagnosis_lines(f"eager reference ({ref.status})", ref.diagnosis, verbose=verbose)
    out += _teardown_lines("eager reference", ref)
    for result in report.results:
        for run in result.runs:
            out += _teardown_lines(result.impl if run is result.runs[0] else f"{result.impl} ({run.name})", run)
        diag = result.diagnosis
        if diag is not None and (result.verdict.value not in ("match", "rng-divergence") or not result.passed):
            out += _diagnosis_lines(result.impl, diag, verbose=verbose)
        if result.control is not None:
            ctl = result.control
            where = ""
            if ctl.first_divergence is not None:
                fd = ctl.first_divergence
                where = f" (first at step {fd.step} {fd.label} {fd.tensor or ''})"
            out.append(f"{result.impl}: control pair at dropout 0: {ctl.verdict.value}{where}")
        for note in result.notes:
            out.append(f"{result.impl}: note: {note}")
        if result.fp8_state is not None:
            out.append(f"{result.impl}: {result.fp8_state.line()}")
        if result.experts is not None:
            out.append(f"{result.impl}: {result.experts.line()}")
        if verbose and result.forensics is not None:
            out.append(f"{result.impl}: forensics (capture-time taps):")
            out += ["  " + line for line in forensics_table(result.forensics).splitlines()]
        if result.memory is not None and result.memory.summary:
            out.append(f"{result.impl}: memory: {result.memory.summary}")
        if result.launches is not None:
            out.append(f"{result.impl}: launches: {result.launches.summary}")
    if out:
        out.append("")
    return out


def write_json(report: DiffReport, path: str | os.PathLike[str]) -> Path:
    """Write the versioned JSON report (the one envelope, command `diff`); returns the path."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = json_safe(envelope("diff", report.to_dict()))
    write_output(target, json.dumps(data, indent=2, allow_nan=False, default=str) + "\n", flag="--json")
    return target


__all__ = ["header_line", "json_safe", "launch_table", "launch_table_from_sections", "model_line", "placement_line",
           "render_text",
           "summary_rows", "verdict_lines", "write_json"]
