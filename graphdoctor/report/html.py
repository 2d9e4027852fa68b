"""One self-contained HTML page per diff run, rendered from a report loaded by diff/report.py (page content: html_model).

Top to bottom: the run and a verdict per implementation with its diagnosis; loss per step; per-step
differences of grads and params on a log scale; the first differing tensors; forensics when taps ran;
memory by phase; launches and the graph census (the last three in html_sections). Inline CSS and SVG.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from graphdoctor.compare.verdict import ImplResult
from graphdoctor.diff.report import DiffReport, TapRecording, load_saved, read_saved
from graphdoctor.errors import InputFileError
from graphdoctor.protocol.record import RunRecord
from graphdoctor.report.html_causes import breakable, causes_table, location_html, name_html
from graphdoctor.report.html_model import ReportView, compared_steps, control_run, magnitudes
from graphdoctor.report.html_page import badge, figure, page, stopped_badge, table, verdict_class
from graphdoctor.report.html_sections import experts_section, forensics_section, launches_section, memory_section
from graphdoctor.report.schedule import eval_section
from graphdoctor.report.svg import EAGER_COLOUR, HeatCell, Series, heat_strip, line_chart, series_style
from graphdoctor.types import Diagnosis, TensorDiff


def _g(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _run_section(view: ReportView) -> str:
    info = view.info
    facts = [("model", info.model), ("parallelism", info.parallelism), ("dtype", info.dtype),
             ("dropout", _g(info.dropout, "g")),
             ("steps", f"{info.steps if info.steps is not None else '?'} (graph warmup {info.warmup_steps})"),
             ("comparison", info.tolerance), ("GPU", info.gpu), ("torch", info.torch),
             ("megatron-core", info.megatron_core)]
    if view.wall_s is not None:
        facts.append(("wall", f"{view.wall_s:.1f} s"))
    if info.recorded:
        facts.append(("recorded", info.recorded))
    dl = "".join(f'<div{" class=wide" if k in ("model", "recorded") else ""}><dt>{escape(k)}</dt>'
                 f"<dd>{escape(v)}</dd></div>" for k, v in facts)
    cards = "".join(_verdict_card(impl) for impl in view.impls)
    failed = ""
    ref = view.reference
    if _reference_failed(view) and ref is not None:
        why = _diagnosis(ref.diagnosis) if ref.diagnosis is not None else ""
        failed = f'<h3>The eager reference failed ({escape(ref.status)})</h3>{why}'
    return (f'<section id="run"><h2>Run and verdicts</h2><dl class="facts">{dl}</dl>{failed}'
            f'<h3>Verdict per implementation</h3><div class="cards">{cards}</div></section>')


def _reference_failed(view: ReportView) -> bool:
    return view.reference is not None and view.reference.status != "ok"


NOT_COMPARED = '<p class="muted">Not compared: the eager reference failed.</p>'


def _first_line(impl: ImplResult) -> str:
    d = impl.divergence
    if d is None:
        return "equal to eager at every compared step" if impl.verdict == "match" else ""
    where = f"step {d.step}, {d.what}" + (f" {d.key!r}" if d.what in ("reported", "eval", "skipped") and d.key else "")
    if d.what == "eval":
        where = f"evaluation after step {d.step}" + (f", {d.key!r}" if d.key else ", its loss")
    if d.tensor:
        where += f"; first tensor {d.tensor}"
    return f"first difference: {where} (max abs {_g(d.max_abs)}, max rel {_g(d.max_rel)})"


def _verdict_card(impl: ImplResult) -> str:
    cls = verdict_class(impl.verdict)
    extra = "passes" if impl.passed else "fails"
    if impl.verdict == "unavailable":
        extra = "not run"
    parts = [f'<div class="card {cls}" data-impl="{escape(impl.impl)}"><h3><span class="mono">'
             f"{escape(impl.impl)}</span>{badge(impl.verdict, extra=extra)}</h3>"]
    line = _first_line(impl)
    if line:
        parts.append(f'<p class="small">{breakable(line)}</p>')
    if impl.timing and impl.timing.speedup:
        t = impl.timing
        parts.append(f'<p class="small">step time {_g(t.eager_ms, ".2f")} ms eager, {_g(t.graphed_ms, ".2f")} ms '
                     f"graphed: <b>{t.speedup:.2f}x</b></p>")
    if impl.control is not None:
        parts.append(f'<p class="small">dropout-free control pair: {badge(impl.control.verdict)}</p>')
    if impl.diagnosis is not None:
        parts.append(_diagnosis(impl.diagnosis))
    parts.append(causes_table(impl.causes))
    if impl.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{breakable(n)}</li>" for n in impl.notes) + "</ul>")
    return "".join(parts) + "</div>"


def _diagnosis(d: Diagnosis) -> str:
    """The diagnosis block: names (module, file:line) wrap only between their parts, prose between words."""
    names = [("module", name_html(d.module) if d.module else ""),
             ("at", location_html(d.location) if d.location else ""),
             ("also at", ", ".join(location_html(a) for a in d.also_at))]
    prose = [("rule", d.rule), ("CUDA error", d.cuda_error), ("meaning", d.meaning), ("reported as", d.reported_as),
             ("where", f"step {d.step} ({d.phase})" if d.step is not None else d.phase)]
    cells = dict(names) | {k: f'<span class="mono">{breakable(v)}</span>' for k, v in prose if v}
    order = ("rule", "module", "at", "CUDA error", "meaning", "reported as", "also at", "where")
    body = "".join(f"<div><b>{escape(k)}:</b> {cells[k]}</div>" for k in order if cells.get(k))
    head = breakable(f"{d.error_type}: {d.message}" if d.error_type and d.message else (d.message or d.error_type or ""))
    fix = f'<div class="fix"><b>fix:</b> {breakable(d.fix)}</div>' if d.fix else ""
    return f'<div class="diag"><div>{head}</div>{body}{fix}</div>'


def _eager_series(run: RunRecord, name: str) -> Series:
    return Series(name, tuple(s.loss for s in compared_steps(run)), EAGER_COLOUR)


def _run_series(runs: list[tuple[str, RunRecord]], steps: list[int], eager: Series) -> list[Series]:
    out = []
    for i, (name, run) in enumerate(runs):
        colour, dash, marker = series_style(i)
        by_step = {s.step: s.loss for s in compared_steps(run)}
        values = tuple(by_step.get(x) for x in steps)
        label = f"{name} (= eager, drawn over it)" if values == eager.values else name
        out.append(Series(label, values, colour, dash, marker))
    return out


def _loss_section(view: ReportView) -> str:
    ref = view.reference
    graphed = [(name, run) for name, run in view.graphed_runs() if run.steps]
    if ref is None or not ref.steps:
        return '<section id="loss"><h2>Loss per step</h2><p class="muted">No eager reference steps.</p></section>'
    steps = [s.step for s in compared_steps(ref)]
    eager = _eager_series(ref, "eager")
    main = line_chart([eager, *_run_series(graphed, steps, eager)], steps,
                      title="loss per step, eager and graphed")
    figures = [figure(f"loss per step at dropout {_g(view.info.dropout, 'g')}", main)]
    deltas = []
    for i, (name, run) in enumerate(graphed):
        colour, dash, marker = series_style(i)
        by_step = {s.step: s.loss for s in compared_steps(run)}
        deltas.append(Series(name, tuple(_abs_delta(by_step.get(s.step), s.loss) for s in compared_steps(ref)),
                             colour, dash, marker))
    if deltas:
        figures.append(figure("|loss graphed - loss eager| per step (log scale)",
                              line_chart(deltas, steps, title="loss difference per step", log_y=True)))
    control = view.control_reference
    pairs = [(f"{impl.impl} (dropout 0)", control_run(impl, view.info.dropout)) for impl in view.impls]
    pairs_present = [(n, r) for n, r in pairs if r is not None and r.steps]
    if control is not None and control.steps and pairs_present:
        eager0 = _eager_series(control, "eager (dropout 0)")
        chart = line_chart([eager0, *_run_series(pairs_present, steps, eager0)], steps,
                           title="loss per step, dropout-free control pair")
        figures.append(figure("dropout-free control pair: loss per step at dropout 0", chart))
    return f'<section id="loss"><h2>Loss per step</h2><div class="grid2">{"".join(figures)}</div></section>'


def _abs_delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return abs(a - b)


def _family(run: RunRecord, family: str) -> dict[int, TensorDiff | None]:
    return {s.step: (s.grads if family == "grads" else s.params) for s in compared_steps(run)}


def _numeric_section(view: ReportView) -> str:
    if _reference_failed(view):
        return f'<section id="numeric"><h2>Grads and params per step</h2>{NOT_COMPARED}</section>'
    runs = [(n, r) for n, r in view.graphed_runs() if any(s.grads or s.params for s in r.steps)]
    if not runs:
        return ('<section id="numeric"><h2>Grads and params per step</h2><p class="muted">No graphed run was '
                "compared tensor by tensor.</p></section>")
    steps = sorted({s.step for _, r in runs for s in compared_steps(r)})
    figures = []
    for family, label in _FAMILIES:
        if any(d is not None and magnitudes(d)[0] is None for _, r in runs for d in _family(r, family).values()):
            figures.append(_count_figure(runs, steps, family, label))
            continue
        for stat in ("max_abs", "max_rel"):
            series = []
            for i, (name, run) in enumerate(runs):
                colour, dash, marker = series_style(i)
                fam = _family(run, family)
                series.append(Series(name, tuple(_stat(fam.get(x), stat) for x in steps), colour, dash, marker))
            caption = f"{label}: {stat.replace('_', ' ')} difference over all tensors (log scale)"
            figures.append(figure(caption, line_chart(series, steps, title=caption, log_y=True),
                                  data={"family": family, "plot": stat}))
    heat = heat_strip(_heat_rows(runs, steps), [str(s) for s in steps],
                      title="tensors that differ per step")
    return ('<section id="numeric"><h2>Grads and params per step</h2><p class="muted small">Per step, over every '
            "parameter: the largest absolute and relative difference against eager where it was measured, else "
            "the number of tensors that differ. Hollow markers on the dashed band are steps where every tensor is "
            "bitwise equal.</p>"
            f'<div class="grid2">{"".join(figures)}</div>'
            f"{figure('tensors that differ from eager, per step (cell: number of unequal tensors)', heat)}"
            "</section>")


_FAMILIES = (("grads", "main_grad"), ("params", "parameters"))

MAX_MEASURED_NAMED = 3
"""Measured steps named in a count chart's caption; the rest are counted."""


def _count_figure(runs: list[tuple[str, RunRecord]], steps: list[int], family: str, label: str) -> str:
    """Tensors that differ per step, for a family where some differing step has no magnitudes.

    A bit fingerprint (computed on the GPU, docs/fingerprints.md) says whether a tensor differs, not by
    how much; max abs and max rel exist only for steps a measuring re-run pair compared element by
    element. The count is what every compared step recorded, so it is what the chart plots.
    """
    series = []
    measured: list[str] = []
    num_tensors = 0
    for i, (name, run) in enumerate(runs):
        colour, dash, marker = series_style(i)
        fam = _family(run, family)
        values: list[float | None] = []
        for x in steps:
            d = fam.get(x)
            values.append(None if d is None else float(d.num_unequal))
            if d is None:
                continue
            num_tensors = max(num_tensors, d.num_tensors)
            max_abs, max_rel = magnitudes(d)
            if d.num_unequal and max_abs is not None:
                measured.append(f"{name} step {x}: max abs {_g(max_abs)}, max rel {_g(max_rel)}")
        series.append(Series(name, tuple(values), colour, dash, marker))
    caption = f"{label}: tensors that differ from eager per step (of {num_tensors})"
    note = ("No magnitudes: the differing steps were compared by bit fingerprint on the GPU, which tells whether "
            "a tensor differs, not by how much; max abs and max rel come only from a measuring re-run pair.")
    if measured:
        more = len(measured) - MAX_MEASURED_NAMED
        note += " Measured: " + "; ".join(measured[:MAX_MEASURED_NAMED]) + (f"; {more} more" if more > 0 else "") + "."
    chart = line_chart(series, steps, title=caption, counts=True, y_format=lambda v: f"{v:.0f}")
    return figure(caption, chart, note=note, data={"family": family, "plot": "count"})


def _stat(diff: TensorDiff | None, stat: str) -> float | None:
    if diff is None:
        return None
    max_abs, max_rel = magnitudes(diff)
    return max_abs if stat == "max_abs" else max_rel


def _heat_rows(runs: list[tuple[str, RunRecord]], steps: list[int]) -> list[tuple[str, list[HeatCell]]]:
    rows = []
    for name, run in runs:
        phase = {s.step: s.phase for s in run.steps}
        for family in ("grads", "params"):
            fam = _family(run, family)
            cells = []
            for x in steps:
                d = fam.get(x)
                if d is None:
                    cells.append(HeatCell("\u00b7", None, f"step {x}: not compared"))
                    continue
                level = 0.0 if d.num_unequal == 0 else 0.25 + 0.75 * d.num_unequal / max(d.num_tensors, 1)
                max_abs = magnitudes(d)[0]
                size = f"max abs {_g(max_abs)}" if max_abs is not None else "fingerprints only, not measured"
                title = (f"{name} {family} step {x} ({phase.get(x, '')}): {d.num_unequal}/{d.num_tensors} unequal, "
                         f"{size}, first {d.first_tensor or '-'}")
                cells.append(HeatCell("=" if d.num_unequal == 0 else str(d.num_unequal), level, title))
            rows.append((f"{name} {'main_grad' if family == 'grads' else 'params'}", cells))
    return rows


def _first_tensors_section(view: ReportView) -> str:
    if _reference_failed(view):
        return f'<section id="tensors"><h2>First differing tensors</h2>{NOT_COMPARED}</section>'
    rows: list[list[object]] = []
    first_rows: list[int] = []
    for name, run in view.graphed_runs():
        for family in ("grads", "params"):
            groups = _tensor_groups(run, family)
            if groups and not any(r[0] == name for r in rows):
                first_rows.append(len(rows))
            rows += [[name, *g] for g in groups]
    if not rows:
        return ('<section id="tensors"><h2>First differing tensors</h2><p class="muted">Every compared tensor is '
                "equal to eager at every step.</p></section>")
    headers = ("impl", "family", "steps", "first differing tensor (named_parameters order)", "unequal tensors",
               "largest max abs", "largest max rel")
    return ('<section id="tensors"><h2>First differing tensors</h2><p class="muted small">For each run of steps '
            "with the same first differing parameter: the steps, how many tensors differ, and the largest "
            "differences over those steps. The first row of each implementation is its first divergence.</p>"
            f"{table(headers, rows, numeric=(4, 5, 6), highlight=first_rows, wrap=(3,))}</section>")


def _tensor_groups(run: RunRecord, family: str) -> list[list[object]]:
    """Consecutive differing steps with the same first tensor, as table rows."""
    label = "main_grad" if family == "grads" else "params"
    groups: list[tuple[str, list[tuple[int, TensorDiff]]]] = []
    for s in compared_steps(run):
        d = s.grads if family == "grads" else s.params
        if d is None or d.num_unequal == 0:
            continue
        name = d.first_tensor or "-"
        if groups and groups[-1][0] == name:
            groups[-1][1].append((s.step, d))
        else:
            groups.append((name, [(s.step, d)]))
    rows: list[list[object]] = []
    for name, members in groups:
        steps = [m[0] for m in members]
        span = str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]} ({len(steps)} steps)"
        unequal = max(d.num_unequal for _, d in members)
        total = max(d.num_tensors for _, d in members)
        sizes = [magnitudes(d) for _, d in members]
        abs_v = max((a for a, _ in sizes if a is not None), default=None)
        rel_v = max((r for _, r in sizes if r is not None), default=None)
        rows.append([label, span, name, f"{unequal}/{total}", _g(abs_v), _g(rel_v)])
    return rows


def render_report(report: DiffReport | TapRecording, *, source: str = "") -> str:
    """The page for a loaded report.

    Args:
        report: a diff report (in memory or loaded by diff/report.py) or a recorded tap table.
        source: where the report came from (shown in the footer).

    Returns:
        The HTML document.
    """
    view = ReportView.of(report)
    sections = [_run_section(view)]
    toc = [("run", "run"), ("loss", "loss"), ("numeric", "grads/params"), ("tensors", "first tensors")]
    if view.source == "diff":
        sections += [_loss_section(view), _numeric_section(view), _first_tensors_section(view)]
        evals = eval_section(view)
        if evals:
            sections.append(evals)
            toc.append(("eval", "eval"))
    else:
        toc = [("run", "run")]
    experts = experts_section(view.impls) if view.source == "diff" else ""
    if experts:
        sections.append(experts)
        toc.append(("experts", "experts"))
    forensics = forensics_section(view.impls)
    if forensics:
        sections.append(forensics)
        toc.append(("forensics", "forensics"))
    if view.source == "diff":
        sections += [memory_section(view), launches_section(view)]
        toc += [("memory", "memory"), ("launches", "launches")]
    passed = view.exit_code == 0 if view.exit_code is not None else all(
        i.passed or i.verdict == "unavailable" for i in view.impls)
    status = _status(view, passed)
    info = view.info
    subtitle = f"{info.model} \u00b7 {info.dtype} \u00b7 dropout {_g(info.dropout, 'g')} \u00b7 {info.gpu}"
    heading = "graphdoctor diff report" if view.source == "diff" else "graphdoctor forensics (recorded taps)"
    footer = f"graphdoctor report{f' of {source}' if source else ''}; schema_version 1; one file, no network."
    return page(title=f"{heading}: {info.model}", heading=heading, subtitle=subtitle, status_html=status,
                toc=toc, body="".join(sections), footer=footer)


def _status(view: ReportView, passed: bool) -> str:
    num = sum(i.verdict != "unavailable" for i in view.impls)
    if view.stopped is not None:
        return stopped_badge(view.stopped, view.exit_code, f"{num} implementation(s)")
    word = "PASS" if passed else "FAIL"
    cls = "ok" if passed else "bad"
    code = f" (exit {view.exit_code})" if view.exit_code is not None else ""
    mark = "\u2713" if passed else "\u2717"
    return (f'<span class="badge {cls}" id="overall" data-verdict="{word.lower()}">'
            f"{mark} {word}{code}: {num} implementation(s) compared</span>")


def render_payload(payload: Mapping[str, Any], *, source: str = "") -> str:
    """The page for a report payload (the saved JSON or `DiffReport.to_dict()`), read by diff/report.py's loader.

    Raises:
        InputFileError: the payload is not a diff report or tap recording.
    """
    return render_report(read_saved(payload), source=source)


def write_html(html_text: str, path: str | Path, *, protect: str | Path | None = None) -> Path:
    """Write a rendered page; refuses to overwrite `protect` (the input report).

    Raises:
        InputFileError: the target is the input file or cannot be written.
    """
    target = Path(path)
    if protect is not None and target.exists() and target.resolve() == Path(protect).resolve():
        raise InputFileError(f"{path}: refusing to overwrite the input report; choose another --html path")
    try:
        if target.parent and not target.parent.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(html_text, encoding="utf-8")
    except OSError as exc:
        raise InputFileError(f"cannot write {path}: {exc.strerror or exc}") from None
    return target


def render_file(report_path: str | Path, html_path: str | Path) -> Path:
    """Render a saved report file (.json or .json.gz) to an HTML page.

    Raises:
        InputFileError: unreadable or not a diff report, or html_path is the report itself.
    """
    report = load_saved(report_path)
    return write_html(render_report(report, source=Path(report_path).name), html_path, protect=report_path)


__all__ = ["render_file", "render_payload", "render_report", "write_html"]
