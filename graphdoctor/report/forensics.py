"""Render RNG/dropout forensics (compare.forensics.Forensics): a draw-site table and one line per finding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabulate import tabulate

from graphdoctor.compare.forensics import DRAW_KINDS

if TYPE_CHECKING:
    from graphdoctor.compare.forensics import Forensics, SiteSummary, TapDivergence

MAX_ALL_SITES = 12
"""Above this many sites the table shows draw sites only and counts output/grad sites."""

MAX_ROWS = 24
"""Table rows at most; the rest are counted."""

_HEADERS = ["site", "op", "kind", "keep rate (expected)", "identical steps", "repeats"]


def forensics_table(f: Forensics) -> str:
    """Ten-second view of the forensics: a site table, then the RNG, frozen, divergence and note lines.

    Args:
        f: the result of `graphdoctor.compare.forensics.analyze`.

    Returns:
        The text, without a trailing newline.
    """
    draws = [s for s in f.sites if s.kind in DRAW_KINDS]
    values = [s for s in f.sites if s.kind not in DRAW_KINDS]
    shown = list(f.sites) if len(f.sites) <= MAX_ALL_SITES else draws
    lines = []
    if shown:
        lines.append(tabulate([_row(s) for s in shown[:MAX_ROWS]], headers=_HEADERS, tablefmt="simple"))
    if len(shown) > MAX_ROWS:
        lines.append(f"... and {len(shown) - MAX_ROWS} more sites")
    if shown is draws and values:
        num_same = sum(s.num_steps_compared > 0 and s.num_steps_identical == s.num_steps_compared
                       for s in values)
        lines.append(f"+ {len(values)} output/grad sites ({num_same} identical on every compared step)")
    lines += ([""] if lines else []) + _findings(f)
    return "\n".join(lines)


def _row(s: SiteSummary) -> list[str]:
    keep = "-"
    if s.keep_rate is not None and s.expected_keep_rate is not None:
        keep = f"{s.keep_rate:.4f} ({s.expected_keep_rate:.4f})"
    return [_site(s.module, s.occurrence), s.op, s.kind, keep,
            f"{s.num_steps_identical}/{s.num_steps_compared}", "yes" if s.repeats_across_replays else "-"]


def _findings(f: Forensics) -> list[str]:
    steps = ",".join(str(s) for s in f.compared_steps) or "none"
    if f.rng_aligned is None:
        lines = [f"RNG: no draw paired (compared steps {steps})"]
    elif f.rng_aligned:
        lines = [f"RNG: aligned, every paired draw identical (compared steps {steps})"]
    else:
        lines = [f"RNG: not aligned; first draw mismatch: {_where(f.first_draw_mismatch)}"]
    lines += [f"frozen RNG: {fr.module} ({fr.kind}, {fr.location or fr.op}) replays the same values on "
              f"{fr.num_replay_steps} replay steps from step {fr.first_step} while eager draws new ones"
              for fr in f.frozen]
    same = f.first_divergence is not None and f.first_divergence == f.first_draw_mismatch
    lines.append(f"first divergence: {'that draw mismatch' if same else _where(f.first_divergence)}")
    lines.append(f"first numeric divergence (draws identical): {_where(f.first_numeric_divergence)}")
    lines += [f"keep rate anomaly: {s.module} keeps {s.keep_rate:.4f}, expected {s.expected_keep_rate:.4f}"
              f" ({s.keep_rate_sigmas:.0f} sigma)" for s in f.keep_rate_anomalies]
    if f.num_unpaired:
        lines.append(f"unpaired taps: {f.num_unpaired} rows had no counterpart in the other run")
    if f.skipped_steps:
        lines.append("skipped: " + "; ".join(f"step {s.step}: {s.reason}" for s in f.skipped_steps))
    lines += [f"note: {note}" for note in f.notes]
    return lines


def _where(d: TapDivergence | None) -> str:
    if d is None:
        return "none"
    where = f" ({d.location})" if d.location else ""
    return (f"step {d.step} {d.kind} {_site(d.module, d.occurrence)}{where}, max abs {d.max_abs:.3g}, "
            f"max rel {d.max_rel:.3g}")


def _site(module: str, occurrence: int) -> str:
    name = module or "(no module)"
    return f"{name} #{occurrence}" if occurrence else name


__all__ = ["MAX_ALL_SITES", "MAX_ROWS", "forensics_table"]
