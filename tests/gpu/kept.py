"""The GPU tests' `diff` with every report kept: when GD_REPORT_DIR is set, each call writes the JSON report
and the terminal summary there, named after the running test (or the name given), so a run on the device
brings back the eager reference's error, the diagnosis and every step even when an assertion fails.

    from kept import diff, keep          # tests/gpu is on sys.path under pytest's default import mode
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffReport
from graphdoctor.diff import diff as _diff

_used: dict[str, int] = {}


def _test_name() -> str:
    """`test_module__test_name[param]` of the running test (PYTEST_CURRENT_TEST), in file-name characters."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "gpu_test").split(" ")[0]
    module, _, test = current.rpartition("::")
    name = f"{Path(module).stem}__{test}" if module else test
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "gpu_test"


def keep(report: Any, name: str | None = None) -> str:
    """Write `report` (a DiffReport or an AdviseReport) as NAME.json and NAME.txt under GD_REPORT_DIR when
    set; NAME defaults to the running test's name, with -2, -3 ... for its later reports. Returns the
    terminal summary."""
    if isinstance(report, DiffReport):
        from graphdoctor.report.diff import render_text, write_json
    else:
        from graphdoctor.report.advise import render_text, write_json  # type: ignore[assignment]
    text = render_text(report)
    folder = os.environ.get("GD_REPORT_DIR")
    if folder:
        base = name or _test_name()
        _used[base] = _used.get(base, 0) + 1
        stem = base if _used[base] == 1 else f"{base}-{_used[base]}"
        Path(folder).mkdir(parents=True, exist_ok=True)
        write_json(report, Path(folder) / f"{stem}.json")
        (Path(folder) / f"{stem}.txt").write_text(text + "\n", encoding="utf-8")
    return text


def diff(config: DiffConfig, name: str | None = None, **kwargs: Any) -> DiffReport:
    """graphdoctor.diff.diff (keyword arguments passed on), with the report kept (see keep)."""
    report = _diff(config, **kwargs)
    keep(report, name)
    return report
