"""Count the fuzz suite's inputs per command and their outcomes (issue 19's closing table).

    .venv/bin/python tests/fuzz/tally.py [pytest args...]

Runs tests/fuzz with GD_FUZZ_TALLY set (every case appends its outcome), then prints one row per
command: inputs tried, clean errors, accepted, tracebacks, hangs, memory runaways, slowest case
and largest memory growth. Hypothesis is derandomized, so the numbers repeat run to run. Exits 1
when any traceback, hang or runaway was seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("clean error", "accepted", "traceback", "hang", "memory")


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="gd-tally-") as tmp:
        record = Path(tmp) / "outcomes.jsonl"
        env = {**os.environ, "GD_FUZZ_TALLY": str(record)}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", str(HERE), *argv],
                              env=env, cwd=HERE.parents[1], check=False)
        rows = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()] if record.exists() else []
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    slowest: dict[str, float] = defaultdict(float)
    largest: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row["command"]][row["kind"]] += 1
        slowest[row["command"]] = max(slowest[row["command"]], row["wall_s"])
        largest[row["command"]] = max(largest[row["command"]], row["peak_rss_growth_bytes"])
    header = ["command", "inputs", *KINDS, "slowest s", "max RSS growth MiB"]
    table = [header]
    for command in sorted(counts):
        c = counts[command]
        table.append([command, str(sum(c.values())), *(str(c[k]) for k in KINDS), f"{slowest[command]:.2f}",
                      f"{largest[command] / (1 << 20):.0f}"])
    total = Counter[str]()
    for c in counts.values():
        total.update(c)
    table.append(["total", str(sum(total.values())), *(str(total[k]) for k in KINDS), "", ""])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"pytest exit code {proc.returncode}")
    bad = total["traceback"] + total["hang"] + total["memory"]
    return 1 if bad or proc.returncode else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
