"""`check_with_probes`: the static rule catalogue plus the runtime probes -> one CheckReport.

`graphdoctor check --probe` calls this. Importing it imports neither torch nor megatron.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from graphdoctor.config import RunFile
from graphdoctor.errors import UsageError
from graphdoctor.probes.analyze import hidden_note
from graphdoctor.probes.api import probe
from graphdoctor.probes.types import ProbeReport
from graphdoctor.rules import CheckReport, EnvironmentFacts, MegatronArgs, check

UNUSED_BY_PROBES: tuple[str, ...] = ("forward_step",)
"""Config fields the probes do not use: they call each decoder layer on sample inputs instead of
running the forward step."""


@dataclass(frozen=True, slots=True)
class ProbedCheck:
    """Result of `check_with_probes`: the merged report and the raw probe report."""

    report: CheckReport
    """Static and probe findings, sorted by severity then code; notes from both."""

    probe: ProbeReport
    """What the probe run returned (captures, tool errors, worker facts) for JSON consumers."""

    @property
    def exit_code(self) -> int:
        """CLI convention: 2 when the probe itself failed, 1 on any error-level finding, else 0."""
        if self.probe.tool_errors:
            return 2
        return 1 if self.report.has_errors else 0


def check_with_probes(
    config: Any,
    run_file_or_mapping: RunFile | str | os.PathLike[str] | Mapping[str, Any] | None = None,
    megatron_args: str | MegatronArgs | None = None,
    env: Mapping[str, str] | None = None,
    *,
    facts: EnvironmentFacts | None = None,
    select: Iterable[str] | None = None,
    timeout_s: float | None = None,
    layers: list[int] | None = None,
    show_library_findings: bool = False,
) -> ProbedCheck:
    """Run the static rules, then probe the configured model, and merge both into one report.

    Args:
        config: the model to probe: a DiffConfig (as `graphdoctor.cli.diff.build_config` makes)
            or a mapping of DiffConfig fields; the probes build the model `graphdoctor diff` builds.
        run_file_or_mapping: static input, as for `graphdoctor.rules.check` (None: nothing static).
        megatron_args: a Megatron-LM launch line or `@path`, as for `graphdoctor.rules.check`.
        env: environment variables of the training job, as for `graphdoctor.rules.check`.
        facts: machine facts for the static rules; detected when None.
        select: only report these codes, static and probe alike (default: all).
        timeout_s: wall-clock limit of each probe worker; default the config's timeout_s.
        layers: decoder layer indices to probe; all when None.
        show_library_findings: also report library-internal probe findings (a GD507 with no user
            frame on its stack); by default they are left out and one note counts them.

    Returns:
        The ProbedCheck; `exit_code` is 0, 1 or 2 as for `graphdoctor check`.

    Raises:
        NoGPUError: no CUDA device is visible (raised before any worker starts).
        UsageError / InputFileError: bad static input, a bad config field or a bad timeout.
    """
    if timeout_s is not None and (isinstance(timeout_s, bool) or not timeout_s > 0):
        raise UsageError(f"probe_timeout: got {timeout_s!r}, expected seconds > 0")
    wanted = {c.strip().upper() for c in select} if select is not None else None
    static = check(run_file_or_mapping, megatron_args, env, facts=facts, select=wanted)
    probed = probe(config, layers=layers, timeout_s=timeout_s, show_library_findings=show_library_findings)
    findings = [f for f in probed.findings if wanted is None or f.code in wanted]
    num_hidden = sum(1 for f in probed.hidden_findings if wanted is None or f.code in wanted)
    notes = probe_notes(config, probed, num_hidden=num_hidden)
    return ProbedCheck(report=static.merged(findings, notes), probe=probed)


def probe_notes(config: Any, report: ProbeReport, *, num_hidden: int | None = None) -> list[str]:
    """Notes for the merged report: ignored config fields, a capture summary, the count of hidden
    library-internal findings (`num_hidden`, default all of `report.hidden_findings`) and tool errors."""
    notes = []
    for name in UNUSED_BY_PROBES:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            notes.append(f"{name} has no effect on the probes (they call each decoder layer on sample "
                         "inputs, not the forward step)")
    failed = [c.unit for c in report.captures if not c.ok]
    summary = f"probe: {len(report.captures)} capture(s), {len(failed)} failed"
    if failed:
        summary += f" ({', '.join(failed)})"
    notes.append(f"{summary}; {report.num_observations} unsafe operation(s) recorded")
    hidden = hidden_note(len(report.hidden_findings) if num_hidden is None else num_hidden)
    if hidden is not None:
        notes.append(hidden)
    notes.extend(f"probe tool error: {error}" for error in report.tool_errors)
    return notes


__all__ = ["UNUSED_BY_PROBES", "ProbedCheck", "check_with_probes", "probe_notes"]
