"""Benchmark `graphdoctor check` over every committed example run file in one call against one run
file alone (issue 16: at most 2x).

    python tests/benchmarks/check_many.py [--repeats 3] [--format concise]

Inputs: examples/*.yaml, examples/*.txt (as @launch-line files), fixtures/rules/*.yaml and
fixtures/rules/*.txt (as @files). Each measurement runs the whole command in a fresh process
(`python -m graphdoctor.cli check ...`, so the Megatron-Core import is paid once per call, as a
user pays it) and the median of --repeats runs is reported. Not a CI test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_RATIO = 2.0


def committed_inputs() -> list[str]:
    """Every committed example run file and launch-line file, as `check` arguments."""
    out: list[str] = []
    for folder in (REPO / "examples", REPO / "fixtures" / "rules"):
        for path in sorted(folder.glob("*.yaml")):
            out.append(str(path.relative_to(REPO)))
        for path in sorted(folder.glob("*.txt")):
            out.append("@" + str(path.relative_to(REPO)))
    return out


def timed(args: list[str], repeats: int) -> tuple[float, int]:
    """(median wall seconds, exit code) of `graphdoctor check ARGS` in fresh processes."""
    times = []
    code = 0
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "graphdoctor.cli", "check", *args], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
        code = done.returncode
    return statistics.median(times), code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--repeats", type=int, default=3, metavar="N", help="Runs per measurement. Default: 3.")
    parser.add_argument("--format", default="concise", metavar="FMT",
                        help="--output-format of both calls. Default: concise.")
    options = parser.parse_args()
    inputs = committed_inputs()
    one = ["examples/te_graphs.yaml", "--output-format", options.format]
    many = [*inputs, "--output-format", options.format]
    one_s, one_code = timed(one, options.repeats)
    many_s, many_code = timed(many, options.repeats)
    ratio = many_s / one_s
    print(f"one run file:          {one_s:6.2f} s (exit {one_code})")
    print(f"{len(inputs)} inputs in one call: {many_s:6.2f} s (exit {many_code})")
    print(f"ratio {ratio:.2f}x (target <= {TARGET_RATIO:.1f}x): {'ok' if ratio <= TARGET_RATIO else 'OVER'}")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
