"""`graphdoctor.diff`: eager against graphed, side by side. `diff(config) -> DiffReport` runs it (`diff/decide.py`:
the verdict tree over a small runs interface; `diff/schedule.py`: obtaining the children); `DiffReport` and
`load_report` are the report's schema and loader (`diff/report.py`)."""

from graphdoctor.diff.decide import DiffRun, Runs, VerdictTree, diff
from graphdoctor.diff.report import SCHEMA_VERSION, DiffReport, load_report
from graphdoctor.diff.schedule import ChildSchedule

__all__ = ["SCHEMA_VERSION", "ChildSchedule", "DiffReport", "DiffRun", "Runs", "VerdictTree", "diff", "load_report"]
