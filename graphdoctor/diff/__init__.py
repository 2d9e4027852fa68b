"""`graphdoctor.diff`: eager against graphed, side by side. `diff(config) -> DiffReport` runs it
(`diff/run.py`: the decision tree and the child schedule); `DiffReport` and `load_report` are the report's schema
and loader (`diff/report.py`)."""

from graphdoctor.diff.report import SCHEMA_VERSION, DiffReport, load_report
from graphdoctor.diff.run import DiffRun, diff

__all__ = ["SCHEMA_VERSION", "DiffReport", "DiffRun", "diff", "load_report"]
