"""`graphdoctor advise`: the candidates (candidates), their runs in one shared session (session), the
bisection of a divergence (bisect), the ranking (rank) and the run that ties them (run)."""

from graphdoctor.advise.run import (
    DEFAULT_MAX_CANDIDATES,
    AdviseReport,
    AdviseRun,
    Budget,
    advise,
    diff_plan,
    plan,
    screened_results,
)

__all__ = ["DEFAULT_MAX_CANDIDATES", "AdviseReport", "AdviseRun", "Budget", "advise", "diff_plan", "plan",
           "screened_results"]
