"""The pytest plugin's session: start-up validation of the `--gd-*` options, skip reasons, one GPU
per pytest-xdist worker, the verdicts of every `graphdoctor_diff` call, `--gd-report-dir` and
`assert_graphs_match` (a failed diff's verdict lines as the failure message).

No pytest hooks here (graphdoctor/pytest_plugin.py has them), so the logic is testable alone.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphdoctor.config.impl import Impl
from graphdoctor.errors import GraphDoctorError

if TYPE_CHECKING:
    from graphdoctor.diff.report import DiffReport

USER_PROPERTY = "graphdoctor"
"""Name of the test-report user property that carries a summary line (travels with pytest-xdist)."""


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The verdicts of one `graphdoctor_diff(...)` call in one test."""

    nodeid: str
    verdicts: tuple[tuple[str, str], ...]
    """(implementation, verdict) per implementation."""
    exit_code: int
    report_path: Path | None = None

    def line(self) -> str:
        """`nodeid: local match, full_iteration match [ok] -> report.json` (the summary line); the status is `ok`,
        `FAILED`, or `ENVIRONMENT` when only the machine failed runs (environment-failed, exit code 2)."""
        verdicts = ", ".join(f"{impl} {verdict}" for impl, verdict in self.verdicts)
        environment = self.exit_code == 2 and any(v == "environment-failed" for _, v in self.verdicts)
        status = "ok" if self.exit_code == 0 else "ENVIRONMENT" if environment else "FAILED"
        where = f" -> {self.report_path}" if self.report_path is not None else ""
        return f"{self.nodeid}: {verdicts} [{status}]{where}"


_STATUS = re.compile(r" \[(ok|FAILED|ENVIRONMENT)\](?: -> |$)")


def count_line(lines: list[str]) -> str:
    """`4 diffs: 2 ok, 1 failed, 1 environment failure (the machine, not the model)` over summary lines."""
    found = [m.group(1) for m in (_STATUS.search(line) for line in lines) if m is not None]
    ok, failed, environment = (found.count(s) for s in ("ok", "FAILED", "ENVIRONMENT"))
    text = f"{len(found)} diff{'s' if len(found) != 1 else ''}: {ok} ok, {failed} failed"
    if environment:
        text += f", {environment} environment failure{'s' if environment != 1 else ''} (the machine, not the model)"
    return text


class GraphMismatchError(GraphDoctorError, AssertionError):
    """Raised by assert_graphs_match: the diff's exit code is not 0; the message is its verdict lines."""


def failure_message(report: DiffReport) -> str:
    """The verdict lines of a diff (graphdoctor.report.diff.verdict_lines) as one message."""
    from graphdoctor.report.diff import verdict_lines

    return "\n".join(verdict_lines(report))


def assert_graphs_match(report: DiffReport) -> None:
    """Fail the calling test unless `report.exit_code() == 0`, with the diff's verdict lines as the message.

    Example:
        report = graphdoctor_diff(impls=("local",), dropout=0.0)
        graphdoctor.assert_graphs_match(report)

    Args:
        report: What `graphdoctor_diff(...)` or `graphdoctor.diff(config)` returned.

    Raises:
        GraphMismatchError: an AssertionError (and a GraphDoctorError) when the exit code is not 0: an
            implementation failed, a process hung at exit, the reference hit a usage error or a signal
            stopped the diff. Its first line reads `graphdoctor diff exit code 1: local numeric-divergence`;
            the lines after it name, per implementation, the verdict, first divergence, module, file:line,
            fix and rule.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    if report.exit_code() != 0:
        raise GraphMismatchError(failure_message(report))


def num_visible_gpus() -> int:
    """CUDA devices torch sees (0 on a CPU-only build or machine)."""
    import torch

    return torch.cuda.device_count()


def gpu_for_worker(worker: str | None, num_gpus: int) -> int | None:
    """The GPU index a pytest-xdist worker (`gw3`) should own: worker number modulo the GPUs; None
    for the main process, a single GPU or no GPU."""
    if worker is None or num_gpus < 2:
        return None
    match = re.fullmatch(r"gw(\d+)", worker)
    return int(match.group(1)) % num_gpus if match else None


def pin_worker_gpu(environ: MutableMapping[str, str], num_gpus: int) -> int | None:
    """Give an xdist worker one GPU through CUDA_VISIBLE_DEVICES (inherited by the diff's child
    processes, which are the only ones that touch CUDA); leaves a CUDA_VISIBLE_DEVICES the user set."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return None
    index = gpu_for_worker(environ.get("PYTEST_XDIST_WORKER"), num_gpus)
    if index is not None:
        environ["CUDA_VISIBLE_DEVICES"] = str(index)
    return index


def _impls(values: Mapping[str, Any]) -> tuple[str, ...]:
    impls = values.get("impls")
    if impls is None:
        from graphdoctor.config import DiffConfig

        return DiffConfig().impls
    if isinstance(impls, str):
        return tuple(s.strip() for s in impls.split(",") if s.strip())
    return tuple(impls)


def skip_reason(values: Mapping[str, Any], num_gpus: int) -> str | None:
    """Why a `graphdoctor_diff` call cannot run here, or None: no CUDA GPU, no Megatron-Core, or
    only the transformer_engine implementation requested and Transformer Engine missing."""
    if num_gpus == 0:
        return "graphdoctor_diff needs a CUDA GPU and none is visible (torch.cuda.device_count() == 0)"
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return "graphdoctor_diff needs megatron-core, which is not installed"
    impls = _impls(values)
    if impls and all(i == Impl.TRANSFORMER_ENGINE for i in impls):
        from graphdoctor.parent.availability import te_available

        ok, why = te_available()
        if not ok:
            return f"graphdoctor_diff: the transformer_engine implementation needs Transformer Engine ({why})"
    return None


def _file_name(nodeid: str, index: int) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_") or "test"
    return f"{stem}.json" if index == 0 else f"{stem}.{index + 1}.json"


@dataclass(slots=True)
class PluginSession:
    """State of one pytest run: validated option values, the report directory, the verdicts."""

    options: dict[str, Any]
    """DiffConfig fields given as --gd-* options."""
    run_file: Any = None
    """The RunFile of --gd-config, loaded at start-up."""
    report_dir: Path | None = None
    results: list[Verdicts] = field(default_factory=list)
    """The calls made in this process."""
    summary: list[str] = field(default_factory=list)
    """Summary lines collected from test reports (in the controller under pytest-xdist too)."""

    @classmethod
    def start(cls, options: Mapping[str, Any], config_path: str | None, report_dir: str | None) -> PluginSession:
        """Validate everything the options say before any test runs.

        Raises:
            UsageError / InputFileError: a bad --gd-* value or --gd-config file (the message names it).
        """
        from graphdoctor.config import diff_config_from, load_run_file

        run_file = load_run_file(config_path) if config_path else None
        values = {k: v for k, v in options.items() if v is not None}
        diff_config_from(run_file, **values)
        directory = Path(report_dir) if report_dir else None
        if directory is not None and directory.exists() and not directory.is_dir():
            from graphdoctor.errors import UsageError

            raise UsageError(f"--gd-report-dir: got {report_dir!r}, expected a directory")
        return cls(options=values, run_file=run_file, report_dir=directory)

    def config_for(self, marker_fields: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
        """The DiffConfig of one call: options, then the marker's fields, then the call's overrides."""
        from graphdoctor.config import diff_config_from

        return diff_config_from(self.run_file, **{**self.options, **marker_fields, **overrides})

    def record(self, nodeid: str, report: Any) -> Verdicts:
        """Keep the verdicts of one call; write its JSON report when --gd-report-dir is set."""
        path = None
        if self.report_dir is not None:
            from graphdoctor.report.diff import write_json

            index = sum(r.nodeid == nodeid for r in self.results)
            path = write_json(report, self.report_dir / _file_name(nodeid, index))
        verdicts = Verdicts(nodeid, tuple((r.impl, r.verdict.value) for r in report.results), report.exit_code(), path)
        self.results.append(verdicts)
        return verdicts

    def collect(self, user_properties: list[tuple[str, object]]) -> None:
        """Take the summary lines a test report carries (`("graphdoctor", line)` properties)."""
        self.summary.extend(str(value) for name, value in user_properties if name == USER_PROPERTY)


def set_up_worker_gpu() -> int | None:
    """pin_worker_gpu on this process's environment (a no-op outside pytest-xdist)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return None
    return pin_worker_gpu(os.environ, num_visible_gpus())


__all__ = ["USER_PROPERTY", "GraphMismatchError", "PluginSession", "Verdicts", "assert_graphs_match", "count_line",
           "failure_message",
           "gpu_for_worker", "num_visible_gpus", "pin_worker_gpu", "set_up_worker_gpu", "skip_reason"]
