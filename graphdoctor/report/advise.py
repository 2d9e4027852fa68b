"""Render an AdviseReport: the ten-second terminal table and the JSON document (one envelope)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from graphdoctor.envelope import envelope
from graphdoctor.inputs import write_output
from graphdoctor.report.diff import _first, _speedup
from graphdoctor.report.escape import one_line
from graphdoctor.report.memory import fmt_bytes
from graphdoctor.strict_json import json_safe

if TYPE_CHECKING:
    from graphdoctor.advise import AdviseReport
    from graphdoctor.advise.bisect import Bisection
    from graphdoctor.advise.candidates import Candidate
    from graphdoctor.advise.rank import CandidateResult, Recommendation

HEADERS = ["#", "candidate", "verdict", "speedup (spread)", "graph pools", "peak vs eager", "host launches",
           "coverage", "first divergence / why not"]
_MARK = {"match": "ok", "rng-divergence": "ok*"}
_NOTE_WIDTH = 60


def _short(text: str, width: int = _NOTE_WIDTH) -> str:
    return one_line(text, width)


def _verdict(result: CandidateResult, strict_rng: bool) -> str:
    if result.verdict is None:
        return result.status
    mark = _MARK.get(result.verdict.value, "FAIL")
    if mark == "ok*" and strict_rng:
        mark = "FAIL"
    return f"{result.verdict.value} {mark}"


def _why(result: CandidateResult) -> str:
    if result.rejections:
        return _short("; ".join(f"{r.rule}: {r.message}" for r in result.rejections))
    if result.reason:
        return _short(result.reason)
    if result.result is not None and result.verdict is not None and result.verdict.value != "match":
        return _short(_first(result.result))
    return ""


def row(rank: str, result: CandidateResult, strict_rng: bool) -> list[str]:
    """One table row: rank, candidate, verdict, speedup, memory, launches, note."""
    row_ = [rank, result.candidate.label, _verdict(result, strict_rng), "-", "-", "-", "-", "-", _why(result)]
    ran = result.result
    if ran is None:
        return row_
    row_[3] = _speedup(ran.timing)
    report = ran.memory.report if ran.memory is not None else None
    if report is not None:
        row_[4] = fmt_bytes(report.graph_pool_reserved_bytes)
        if report.eager_peak_reserved_bytes:
            row_[5] = f"{report.peak_reserved_bytes / report.eager_peak_reserved_bytes:.2f}x"
    graphed = ran.launches.graphed if ran.launches is not None else None
    if graphed is not None:
        eager = ran.launches.eager if ran.launches is not None else None
        row_[6] = f"{eager.num_host_launches if eager else '?'} -> {graphed.num_host_launches}"
        row_[7] = f"{100 * graphed.graph_coverage:.0f}%"
    return row_


def table_rows(report: AdviseReport) -> list[list[str]]:
    """Ranked passing candidates first (numbered), then the others in listing order."""
    from graphdoctor.advise.rank import ranked

    strict = report.config.strict_rng
    order = ranked(list(report.candidates), strict)
    rows = [row(str(i + 1), r, strict) for i, r in enumerate(order)]
    ranked_keys = {r.candidate.key for r in order}
    rows += [row("-", r, strict) for r in report.candidates if r.candidate.key not in ranked_keys]
    return rows


def recommendation_lines(rec: Recommendation) -> list[str]:
    """`recommendation: ...` and the Megatron-LM flags, or the line saying why there is none."""
    if rec.candidate is None:
        return [f"recommendation: none: {rec.reason}"]
    spread = f" ({rec.speedup_range[0]:.2f}-{rec.speedup_range[1]:.2f})" if rec.speedup_range else ""
    cost = []
    if rec.graph_pool_bytes is not None:
        cost.append(f"graph pools {fmt_bytes(rec.graph_pool_bytes)}")
    if rec.peak_reserved_over_eager is not None:
        cost.append(f"peak reserved {rec.peak_reserved_over_eager:.2f}x eager")
    speed = f"{rec.speedup:.2f}x{spread} faster than eager" if rec.speedup is not None else "speed unknown"
    lines = [f"recommendation: {rec.candidate.label}: {speed}" + (f", {', '.join(cost)}" if cost else ""),
             f"  Megatron-LM flags: {rec.flags}"]
    lines += [f"  note: {note}" for note in rec.notes]
    return lines


def bisection_lines(report: AdviseReport) -> list[str]:
    """One block per bisection: start -> narrowed part, its first divergence, the steps asked."""
    out: list[str] = []
    for b in report.bisections:
        out.append(f"bisection: {b.start.label} differs -> narrowed to {b.narrowed.label}{_first_of(report, b)}")
        asked = ", ".join(f"{s.candidate.label} {_answer(report, s.candidate, s.differs)}" for s in b.steps)
        out.append(f"  asked: {asked or 'nothing (one scope, one layer)'}; stopped: {b.stopped}")
        out += [f"  note: {note}" for note in b.notes]
    return out


def _answer(report: AdviseReport, candidate: Candidate, differs: bool | None) -> str:
    if differs is not None:
        return "differs" if differs else "matches"
    found = report.result_of(candidate)
    why = (found.verdict.value if found.verdict is not None else found.status) if found is not None else ""
    return f"unknown ({why})" if why else "unknown"


def _first_of(report: AdviseReport, bisection: Bisection) -> str:
    found = report.result_of(bisection.narrowed)
    div = found.result.divergence if found is not None and found.result is not None else None
    if div is None:
        return ""
    tensor = f", first tensor {div.tensor}" if div.tensor else ""
    return f": first differs at step {div.step} ({div.what}{tensor})"


def render_text(report: AdviseReport) -> str:
    """Header, ranked table, recommendation, bisections, rejected and not-run lines, wall time."""
    cfg = report.config
    policy = "bitwise" if cfg.bitwise else f"rtol={cfg.rtol:g} atol={cfg.atol:g}"
    lines = [f"graphdoctor advise: GPTModel {cfg.num_layers}x{cfg.hidden_size} ({cfg.num_attention_heads} heads), "
             f"seq {cfg.seq_length}, mbs {cfg.micro_batch_size}x{cfg.num_microbatches}, {cfg.dtype}, "
             f"dropout {cfg.dropout:g}, {cfg.steps} steps, warmup {cfg.cuda_graph_warmup_steps}, {policy}, "
             f"layer spec {cfg.layer_spec or 'local'}"]
    env = report.reference.env if report.reference is not None else None
    if env is not None:
        lines.append(f"  {env.gpu or '?'} | torch {env.torch or '?'} | megatron-core {env.megatron_core or '?'} | "
                     f"world size {env.world_size}")
    if report.reference is not None and report.reference.status != "ok" and report.reference.diagnosis:
        lines.append(f"eager reference: {report.reference.status}: {_short(report.reference.diagnosis.message, 200)}")
    lines += ["", tabulate(table_rows(report), headers=HEADERS, tablefmt="simple", disable_numparse=True), ""]
    lines += recommendation_lines(report.recommendation)
    lines += bisection_lines(report)
    for result in report.candidates:
        for rejection in result.rejections:
            fix = f" (fix: {rejection.fix})" if rejection.fix else ""
            lines.append(f"rejected: {result.candidate.label}: {rejection.rule} {_short(rejection.message, 160)}{fix}")
    if report.not_run:
        names = ", ".join(r.candidate.label for r in report.not_run)
        why = f"stopped by {report.stopped}" if report.stopped else ", ".join(report.budget.exhausted) or "budget"
        lines.append(f"not run ({why}): {names}")
    lines += [f"note: {note}" for note in report.notes]
    jobs = f"{report.jobs}; " if report.jobs else ""
    lines.append(f"wall {report.wall_s:.1f} s (children {report.child_wall_s:.1f} s); {jobs}exit code {report.exit_code()}")
    return "\n".join(lines)


def document(report: AdviseReport) -> dict[str, Any]:
    """The JSON document: the one envelope, command `advise`."""
    data: dict[str, Any] = json_safe(envelope("advise", report.to_dict()))
    return data


def write_json(report: AdviseReport, path: str | os.PathLike[str]) -> Path:
    """Write the JSON document (atomically, through the input layer); returns the path."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    write_output(target, json.dumps(document(report), indent=2, allow_nan=False, default=str) + "\n", flag="--json")
    return target


__all__ = ["HEADERS", "bisection_lines", "document", "recommendation_lines", "render_text", "row", "table_rows",
           "write_json"]
