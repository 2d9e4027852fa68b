"""Text and JSON rendering of memory triage reports (graphdoctor.memory.TriageReport).

tabulate is imported when a table is drawn, so `graphdoctor triage --json` never loads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graphdoctor.report.escape import escape_control

if TYPE_CHECKING:
    from graphdoctor.memory.analysis import SnapshotSummary, TriageReport
    from graphdoctor.memory.blockdiff import BlockDiff

_SITE_WIDTH = 70
_TRACE_NOT_LOADED = "trace not loaded"
_TRACE_HINT = ("trace not loaded: plain triage reads only the segments; "
               "use --trace (or --html) for this table and the trace entry count")


def fmt_bytes(num: float, *, signed: bool = False) -> str:
    """Human byte count in binary units: 512 B, 1.5 MiB, -20.0 MiB (signed adds a '+')."""
    sign = "+" if signed and num > 0 else ""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _short(text: str, width: int = _SITE_WIDTH) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3):]


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _groups_table(title: str, groups: Sequence[Any]) -> str:
    rows = [(g.key, g.num_segments, fmt_bytes(g.reserved_bytes), fmt_bytes(g.live_bytes), fmt_bytes(g.free_bytes))
            for g in groups]
    return f"{title}\n" + _table(rows, ("", "segments", "reserved", "live", "cached free"))


def _summary_lines(summary: SnapshotSummary) -> list[str]:
    t = summary.totals
    trace = _TRACE_NOT_LOADED if summary.num_trace_entries is None else f"{summary.num_trace_entries} trace entries"
    head = (
        f"{summary.path}: {fmt_bytes(summary.file_bytes)} file, {t.num_segments} segments, "
        f"{t.num_blocks} blocks, {trace}"
    )
    key = (
        f"reserved {fmt_bytes(t.reserved_bytes)} | live {fmt_bytes(t.live_bytes)} | "
        f"allocated/reserved {t.allocated_over_reserved:.2f} | graph pools {fmt_bytes(t.graph_pool_reserved_bytes)}"
    )
    return [head, key]


def _snapshot_sections(summary: SnapshotSummary) -> list[str]:
    out = [
        _groups_table("By pool ((0,0) is 'default'; others are graph private pools)", summary.by_pool),
        _groups_table("By stream", summary.by_stream),
        _groups_table("By segment type", summary.by_segment_type),
    ]
    sites = [(_short(s.site), s.num_blocks, fmt_bytes(s.live_bytes)) for s in summary.top_sites]
    out.append("Live bytes by allocation site\n" + _table(sites, ("site", "blocks", "live")))
    free = [(fmt_bytes(f.size_bytes), f.pool, f.segment_type, hex(f.stream) if f.stream else "0", hex(f.address))
            for f in summary.largest_free_blocks]
    out.append("Largest free (cached) blocks\n" + _table(free, ("size", "pool", "type", "stream", "address")))
    if summary.phases is None:
        out.append("Trace by phase (user_metadata)\n" + _TRACE_HINT)
    elif summary.phases:
        phases = [(p.phase, p.num_allocs, fmt_bytes(p.alloc_bytes), p.num_frees, fmt_bytes(p.freed_bytes))
                  for p in summary.phases]
        out.append("Trace by phase (user_metadata)\n" + _table(phases, ("phase", "allocs", "alloc", "frees", "freed")))
    return out


def _diff_sections(diff: BlockDiff) -> list[str]:
    def row(g: Any, key: str) -> tuple[Any, ...]:
        return (key, f"{g.num_new} / {fmt_bytes(g.new_bytes)}", f"{g.num_freed} / {fmt_bytes(g.freed_bytes)}",
                f"{g.num_resized} / {fmt_bytes(g.resized_delta_bytes, signed=True)}",
                fmt_bytes(g.net_bytes, signed=True))

    headers = ("", "new", "freed", "resized", "net live")
    t = diff.total
    pools = [row(t, "total")] + [row(g, g.key) for g in diff.by_pool]
    sites = [row(g, _short(g.key)) for g in diff.by_site]
    seg = (
        f"segments: {diff.num_segments_new} new ({fmt_bytes(diff.segment_bytes_new)}), "
        f"{diff.num_segments_freed} freed ({fmt_bytes(diff.segment_bytes_freed)}), "
        f"reserved {fmt_bytes(diff.reserved_delta_bytes, signed=True)}"
    )
    return ["Block diff by pool\n" + _table(pools, headers) + "\n" + seg,
            "Block diff by site\n" + _table(sites, headers)]


def render_text(report: TriageReport) -> str:
    """The triage report as plain text: totals first, then tables, then the diff and verdict."""
    lines = ["graphdoctor triage", *_summary_lines(report.snapshot)]
    if report.against is not None:
        lines += ["against " + _summary_lines(report.against)[0]]
    sections = ["\n".join(lines), *_snapshot_sections(report.snapshot)]
    if report.diff is not None:
        sections += _diff_sections(report.diff)
        if report.leak_suspects:
            rows = [(_short(s.site), f"{s.before_blocks} -> {s.after_blocks}", fmt_bytes(s.before_bytes),
                     fmt_bytes(s.after_bytes), fmt_bytes(s.growth_bytes, signed=True)) for s in report.leak_suspects]
            sections.append("Leak suspects (sites whose live bytes grew)\n"
                            + _table(rows, ("site", "blocks", "before", "after", "growth")))
            top = report.leak_suspects[0]
            sections.append(f"verdict: {len(report.leak_suspects)} leak suspect(s); "
                            f"largest {fmt_bytes(top.growth_bytes, signed=True)} at {top.site}")
        else:
            sections.append("verdict: no site's live bytes grew")
    # frame and file names come from the snapshot: escaped once, here, before a terminal sees them
    return escape_control("\n\n".join(sections) + "\n")


def render_json(report: TriageReport) -> str:
    """The triage report as JSON: the envelope of docs/json.md (command `triage`) around
    TriageReport.to_dict() (documented in docs/memory.md)."""
    from graphdoctor.envelope import envelope

    return json.dumps(envelope("triage", report.to_dict()), indent=2, sort_keys=False, allow_nan=False) + "\n"


__all__ = ["fmt_bytes", "render_json", "render_text"]
