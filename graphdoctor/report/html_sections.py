"""Sections of the diff page that read the per-implementation analyses: forensics (taps), memory by
phase with leak sites, and launches eager against graphed with the graph census.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from graphdoctor.compare.experts import FAMILY_WORDS, ExpertRow, ExpertsDiff
from graphdoctor.compare.forensics import Forensics, SiteSummary, TapDivergence
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.launches.compare import LaunchComparison
from graphdoctor.launches.counts import LaunchCount
from graphdoctor.memory.leaks import MemoryReport
from graphdoctor.report.html_model import ReportView
from graphdoctor.report.html_page import figure, table, tile
from graphdoctor.report.memory import fmt_bytes
from graphdoctor.report.svg import EAGER_COLOUR, HeatCell, Series, bar_chart, heat_strip, series_style

DRAW_KINDS = frozenset({"dropout", "random", "host-random"})
"""Tap kinds that are random draws (the others are module outputs and gradients)."""

MAX_SITE_ROWS = 30
"""Forensics site rows shown per implementation; the rest are counted."""


def _g(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def short_path(location: str | None) -> str | None:
    """A recorded file:line without the interpreter's install prefix (.../site-packages/megatron/... -> megatron/...)."""
    if not location:
        return location
    for marker in ("site-packages/", "/site/"):
        if marker in location:
            return location.split(marker, 1)[1]
    return location


def _where(d: TapDivergence | None) -> str:
    if d is None:
        return "none"
    loc = f" ({short_path(d.location)})" if d.location else ""
    return (f"step {d.step}, {d.kind} of {d.module or '(no module)'} [{d.op}]{loc}: max abs {_g(d.max_abs)}, "
            f"max rel {_g(d.max_rel)}")


def _site_row(s: SiteSummary, frozen: set[str]) -> list[object]:
    keep = "-"
    if s.keep_rate is not None and s.expected_keep_rate is not None:
        keep = f"{s.keep_rate:.4f} ({s.expected_keep_rate:.4f})"
    state = "FROZEN" if s.module in frozen and s.kind in DRAW_KINDS and s.repeats_across_replays else (
        "repeats" if s.repeats_across_replays else "-")
    identical = f"{s.num_steps_identical}/{s.num_steps_compared}"
    return [s.module or "(no module)", s.kind, s.op, short_path(s.location) or "-", keep, identical, state,
            "graph" if s.captured else "eager"]


def _forensics_block(impl: ImplResult, f: Forensics) -> str:
    rng = {None: "no draw paired", True: "aligned: every paired draw identical",
           False: "not aligned: draws differ from eager"}[f.rng_aligned]
    tiles = "".join([
        tile("random stream", rng.split(":")[0], state="ok" if f.rng_aligned else ""),
        tile("frozen draws", str(len(f.frozen)), state="bad" if f.frozen else "ok"),
        tile("compared steps", ", ".join(str(s) for s in f.compared_steps) or "none"),
        tile("unpaired taps", str(f.num_unpaired)),
    ])
    lines = [("first draw mismatch", _where(f.first_draw_mismatch)),
             ("first divergence", _where(f.first_divergence)),
             ("first numeric divergence (draws identical)", _where(f.first_numeric_divergence))]
    lines += [("frozen draw", f"{d.module} [{d.op}] at {d.location or '?'}, from step {d.first_step}") for d in f.frozen]
    facts = "".join(f"<div><b>{escape(k)}:</b> <span class=\"mono\">{escape(v)}</span></div>" for k, v in lines)
    frozen = {d.module for d in f.frozen}
    ordered = sorted(f.sites, key=lambda s: (s.kind not in DRAW_KINDS, not s.repeats_across_replays))
    rows = [_site_row(s, frozen) for s in ordered[:MAX_SITE_ROWS]]
    first_mod = f.first_divergence.module if f.first_divergence else None
    marked = [i for i, s in enumerate(ordered[:MAX_SITE_ROWS]) if s.module in frozen or s.module == first_mod]
    more = len(ordered) - MAX_SITE_ROWS
    notes = "".join(f"<li>{escape(n)}</li>" for n in f.notes)
    return (f'<h3 class="mono">{escape(impl.impl)}</h3><div class="tiles">{tiles}</div><div class="diag">{facts}</div>'
            + table(("site (module)", "kind", "op", "file:line", "keep rate (expected)", "identical steps",
                     "across replays", "ran in"), rows, numeric=(5,), highlight=marked, wrap=(0, 3))
            + (f'<p class="muted small">{more} more sites not shown.</p>' if more > 0 else "")
            + (f'<ul class="notes">{notes}</ul>' if notes else ""))


def forensics_section(impls: Sequence[ImplResult]) -> str:
    """The forensics section, or "" when no implementation was tapped."""
    blocks = [_forensics_block(impl, impl.forensics) for impl in impls if impl.forensics is not None]
    if not blocks:
        return ""
    return ('<section id="forensics"><h2>Forensics: random draws, frozen draws, first divergent module</h2>'
            '<p class="muted small">Fingerprints of every dropout mask, random draw, module output and output '
            "gradient, taken inside the graphs. Highlighted rows: frozen draws and the first divergent module.</p>"
            f'{"".join(blocks)}</section>')


def _peak_reserved_over_eager(m: MemoryReport) -> float | None:
    """Peak reserved bytes over eager's, rounded as the saved report writes it (MemoryReport.to_dict)."""
    return round(m.peak_reserved_bytes / m.eager_peak_reserved_bytes, 4) if m.eager_peak_reserved_bytes else None


def _memory_tiles(m: MemoryReport) -> str:
    growth = m.bytes_gained_per_replay_step
    sites = m.unfreed_replay_sites
    suspects = sum(s.is_suspect for s in sites)
    over = _peak_reserved_over_eager(m)
    return "".join([
        tile("memory verdict", m.verdict, state="ok" if m.verdict == "ok" else "bad"),
        tile("graph pools reserved", fmt_bytes(m.graph_pool_reserved_bytes or 0)),
        tile("peak reserved vs eager", f"{over:.2f}x" if over else "-"),
        tile("growth per replay step", fmt_bytes(growth or 0, signed=True) if growth is not None else "-",
             state="bad" if growth else ""),
        tile("leak sites (suspect)", f"{len(sites)} ({suspects})", state="bad" if suspects else ""),
    ])


def _memory_charts(mems: Sequence[tuple[str, MemoryReport]]) -> str:
    """Bytes by phase of each graphed run, and the peaks against the eager reference."""
    styles = [series_style(i) for i in range(len(mems))]
    phase = bar_chart(
        ("live before capture", "live after capture", "live after replays", "reserved after replays"),
        [Series(name, (m.live_bytes_before_capture, m.live_bytes_after_capture, m.live_bytes_after_replays,
                       m.reserved_bytes_after_replays), c, d, k) for (name, m), (c, d, k) in zip(mems, styles, strict=True)],
        title="memory by phase", value_format=fmt_bytes)
    eager_m = mems[0][1]
    peaks = bar_chart(
        ("peak allocated", "peak reserved", "graph pools reserved"),
        [Series("eager", (eager_m.eager_peak_allocated_bytes, eager_m.eager_peak_reserved_bytes, 0), EAGER_COLOUR),
         *[Series(name, (m.peak_allocated_bytes, m.peak_reserved_bytes, m.graph_pool_reserved_bytes), c, d, k)
           for (name, m), (c, d, k) in zip(mems, styles, strict=True)]],
        title="peaks against eager", value_format=fmt_bytes)
    return (f'<div class="grid2">{figure("allocated and reserved bytes by phase (graphed runs)", phase)}'
            f'{figure("peaks against the eager reference", peaks)}</div>')


def _memory_block(name: str, m: MemoryReport) -> str:
    """One implementation's summary, tiles, leak sites, graph pools and notes."""
    blocks = [f'<h3 class="mono">{escape(name)}</h3><p class="small">{escape(m.summary())}</p>'
              f'<div class="tiles">{_memory_tiles(m)}</div>']
    sites = m.unfreed_replay_sites
    if sites:
        rows = [(s.site, s.num_allocations, fmt_bytes(s.live_bytes), s.num_steps,
                 "SUSPECT" if s.is_suspect else "settled", " < ".join(s.frames[:3])) for s in sites]
        blocks.append(table(("site kept alive after replay", "allocations", "live", "steps", "status",
                             "innermost frames"), rows, numeric=(1, 2, 3), wrap=(0, 5),
                            highlight=[i for i, s in enumerate(sites) if s.is_suspect]))
    if m.graph_pools:
        # A pool id is written as the JSON list the saved report holds ([device, id]).
        blocks.append(table(("graph pool", "reserved", "live"),
                            [(str(list(p.pool)), fmt_bytes(p.reserved_bytes), fmt_bytes(p.live_bytes))
                             for p in m.graph_pools], numeric=(1, 2), cls="compact"))
    if m.notes:
        blocks.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in m.notes) + "</ul>")
    return "".join(blocks)


def memory_section(view: ReportView) -> str:
    """Memory by phase per implementation against eager, with graph pools and leak sites."""
    mems = [(impl.impl, impl.memory.report) for impl in view.impls
            if impl.memory is not None and impl.memory.report is not None]
    unanalysed = [(impl.impl, impl.memory.error) for impl in view.impls
                  if impl.memory is not None and impl.memory.report is None]
    if not mems and not unanalysed:
        return '<section id="memory"><h2>Memory</h2><p class="muted">Memory was not recorded.</p></section>'
    blocks = [_memory_charts(mems)] if mems else []
    blocks += [_memory_block(name, m) for name, m in mems]
    blocks += [f'<h3 class="mono">{escape(name)}</h3><p class="small">'
               f'{escape(f"no snapshot analysis: {error}" if error else "no snapshot analysis")}</p>'
               for name, error in unanalysed]
    return f'<section id="memory"><h2>Memory by phase</h2>{"".join(blocks)}</section>'


_LAUNCH_ROWS: tuple[tuple[str, str], ...] = (
    ("host launch calls", "num_host_launches"),
    ("kernel launches", "num_kernel_launches"),
    ("graph launches (cudaGraphLaunch)", "num_graph_launches"),
    ("memcpy calls", "num_memcpy_calls"),
    ("memset calls", "num_memset_calls"),
    ("RNG prologue fills", "num_prologue_fill_launches"),
    ("GPU kernels launched eagerly", "num_gpu_kernels_eager"),
    ("GPU kernels inside graphs", "num_gpu_kernels_in_graph"),
)


def _launch_values(step: LaunchCount | None) -> tuple[float | None, ...]:
    if step is None:
        return tuple(None for _ in _LAUNCH_ROWS)
    values = []
    for _, attr in _LAUNCH_ROWS:
        values.append(float(getattr(step, attr)))
    return tuple(values)


def launches_section(view: ReportView) -> str:
    """Launch counts of one profiled step, eager against each implementation, and the graph census."""
    items = [(impl.impl, impl.launches) for impl in view.impls if impl.launches is not None]
    if not items:
        return '<section id="launches"><h2>Launches</h2><p class="muted">Launches were not profiled.</p></section>'
    eager = next((lv.eager for _, lv in items if lv.eager is not None), None)
    series = [Series("eager", _launch_values(eager), EAGER_COLOUR)]
    for i, (name, lv) in enumerate(items):
        colour, dash, marker = series_style(i)
        series.append(Series(name, _launch_values(lv.graphed), colour, dash, marker))
    chart = bar_chart([label for label, _ in _LAUNCH_ROWS], series, title="launches per profiled step",
                      value_format=lambda v: f"{v:.0f}", width=1080, label_width=240)
    steps = [("eager", eager), *[(name, lv.graphed) for name, lv in items]]
    rows = [["host time per step", *[_g(s.host_time_us / 1000, ".1f") + " ms" if s and s.host_time_us else "-"
                                     for _, s in steps]],
            ["graph coverage (kernel time in graphs)",
             *[f"{s.graph_coverage:.0%}" if s and s.graph_coverage is not None else "-" for _, s in steps]]]
    parts = [figure("launches in one profiled step: eager against graphed", chart),
             table(("", *[name for name, _ in steps]), rows, numeric=tuple(range(1, len(steps) + 1)))]
    parts += [f'<p class="small"><span class="mono">{escape(name)}</span>: {escape(lv.summary)}</p>'
              for name, lv in items if lv.summary]
    parts.append(_census(items))
    return f'<section id="launches"><h2>Launches: eager against graphed</h2>{"".join(parts)}</section>'


def _census(items: Sequence[tuple[str, LaunchComparison]]) -> str:
    rows: list[list[object]] = []
    checks = []
    for name, lv in items:
        for g in lv.census or ():
            by_type = ", ".join(f"{k} {v}" for k, v in g.nodes_by_type.items())
            rows.append([name, g.name, g.num_nodes, g.num_kernels, by_type, g.source])
        if lv.census_check is not None:
            match = lv.census_check.match
            checks.append(f"{name}: census {'equals' if match else 'DIFFERS FROM'} the profiler's kernels per launch")
    if not rows:
        return '<h3>Graph census</h3><p class="muted">No graph was counted.</p>'
    check = "".join(f'<p class="small">{escape(c)}</p>' for c in checks)
    return ("<h3>Graph census</h3>" + table(("impl", "graph", "nodes", "kernels", "nodes by type", "counted by"),
                                            rows, numeric=(2, 3), wrap=(1,)) + check)


def _expert_words(row: ExpertRow, steps: int) -> str:
    parts = [f"{FAMILY_WORDS[f]} from step {s}" for f, s in (("grads", row.grads_step), ("params", row.params_step))
             if s is not None]
    return f"{row.label}: {', '.join(parts) or f'main_grads and parameters equal at {steps} steps'}"


def _expert_cell(rows: tuple[ExpertRow, ...], steps: int, earliest: int, latest: int) -> HeatCell:
    """An expert's first differing step over every rank that holds a copy, darker the earlier; `=` where every copy
    is equal."""
    if not rows:
        return HeatCell("\u00b7", None, "not on any rank's records")
    title = "; ".join(_expert_words(r, steps) for r in rows)
    firsts = [r.first[0] for r in rows if r.first is not None]
    if not firsts:
        return HeatCell("=", 0.0, title)
    step = min(firsts)
    level = 1.0 if latest == earliest else 1.0 - 0.65 * (step - earliest) / (latest - earliest)
    return HeatCell(str(step), level, title)


def _experts_block(impl: str, experts: ExpertsDiff) -> str:
    labels, numbers, cells = experts.grid()
    firsts = [r.first[0] for r in experts.differing if r.first is not None]
    earliest, latest = (min(firsts), max(firsts)) if firsts else (0, 0)
    rows = [(label, [_expert_cell(cells.get((label, e), ()), experts.steps, earliest, latest) for e in numbers])
            for label in labels]
    caption = f"{impl}: first step each expert differs from eager (= equal)"
    return figure(caption, heat_strip(rows, [str(e) for e in numbers], title=caption, axis="expert"),
                  note=experts.line(), data={"experts": impl})


def experts_section(impls: Sequence[ImplResult]) -> str:
    """The MoE experts section (graphdoctor.compare.experts), or "" when no implementation has experts."""
    blocks = [_experts_block(i.impl, i.experts) for i in impls if i.experts is not None and i.experts.rows]
    if not blocks:
        return ""
    return ('<section id="experts"><h2>MoE experts</h2><p class="muted small">Each expert of each MoE layer against '
            "the same expert in eager, by its global number as Megatron placed it (hover: its rank and local index). "
            "A cell gives the first step at which its main_grads or parameters differ.</p>"
            f'{"".join(blocks)}</section>')


__all__ = ["DRAW_KINDS", "MAX_SITE_ROWS", "experts_section", "forensics_section", "launches_section",
           "memory_section", "short_path"]
