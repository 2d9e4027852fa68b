"""Every runtime rule's fixtures/rules/GD5xx_bad.py and _good.py run on a real GPU: the bad one reports its code (at
its `# [GD5xx]` line where the rule names a line), the good one does not. GD501-GD510 through `graphdoctor check
--probe`, the rest through `graphdoctor diff`; GD511 and GD521 need Transformer Engine, GD516 and GD517 two ranks. The
one CPU test here checks that every runtime rule has a row and that its fixtures import and expose those entry points."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from graphdoctor.rules import all_rules

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "rules"
PROBE_MODEL = ("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
               "--vocab-size", "128")
DIFF_MODEL = ("--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
              "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2", "--dropout", "0",
              "--no-memory", "--no-launches", "--no-localize")
SCHEDULE = ("--eval-interval", "3", "--eval-iters", "2", "--num-microbatches", "4")
TE_MODEL = ("--dtype", "bf16")
DIFF_TIMEOUT_S = 240
MULTI_TIMEOUT_S = 120
PROBE_CODES = tuple(f"GD5{n:02d}" for n in range(1, 11))
PROBE_WORKERS = 10
"""check --probe processes at once (test_probes_gpu.py runs nine)."""
DIFF_WORKERS = 5
"""diffs at once: six starting together on one H200 once failed NCCL's first eager reference (run_acceptance.sh)."""


@dataclass(frozen=True)
class DiffCase:
    """How `graphdoctor diff` runs one rule's fixtures."""

    args: tuple[str, ...]
    """Implementation and schedule flags."""
    bad: tuple[str, ...]
    """Entry points of the bad fixture (layer_spec, forward_step)."""
    good: tuple[str, ...]
    """Entry points of the good fixture."""
    at_line: tuple[str, ...]
    """Rules whose cause or diagnosis carries the bad fixture's marked line; empty where the rule names no line."""
    bad_args: tuple[str, ...] = ()
    """Flags of the bad fixture's run only (the run file of a model the bad fixture needs)."""


DIFF_CASES: dict[str, DiffCase] = {
    "GD513": DiffCase(("--impl", "full_iteration", *SCHEDULE), ("forward_step",), ("forward_step",), ("GD513",)),
    # Megatron's runner replays the training graph, so the line's cause is GD402; GD514 is the evaluation's note.
    "GD514": DiffCase(("--impl", "local", *SCHEDULE), ("layer_spec",), ("layer_spec",), ("GD402", "GD514")),
    # The note names the capture step and the tracker key; the values come from Megatron's tracker, not a line.
    # The bad fixture is Megatron's own MoE router (drop-and-pad, aux and z-loss), whose capture-step values the
    # H200 recorded (fixtures/data/moe/h200_drop_pad_local_capture_tracker.json); the good one, a dense model that
    # records its statistic in the loss function, outside the graphed layers.
    "GD515": DiffCase(("--impl", "local"), ("layer_spec",), ("forward_step",), (),
                      bad_args=("--config", "fixtures/runfiles/moe_drop_pad.yaml")),
    "GD518": DiffCase(("--impl", "local"), ("layer_spec", "forward_step"), ("layer_spec", "forward_step"), ("GD518",)),
    "GD519": DiffCase(("--impl", "local"), ("layer_spec",), ("layer_spec",), ("GD519",)),
    "GD520": DiffCase(("--impl", "local", "--num-microbatches", "4"), ("forward_step",), ("forward_step",),
                      ("GD520",)),
    "GD522": DiffCase(("--impl", "local"), ("layer_spec", "forward_step"), ("layer_spec", "forward_step"), ("GD522",)),
}
TE_CASES: dict[str, DiffCase] = {
    # The hazard names the attention module; a None argument has no line of its own.
    "GD511": DiffCase(("--impl", "transformer_engine", "--layer-spec", "local", *TE_MODEL), ("forward_step",),
                      ("forward_step",), ()),
    "GD521": DiffCase(("--impl", "transformer_engine", "--layer-spec", "te", "--fp8-format", "hybrid",
                       "--fp8-recipe", "delayed", "--steps", "8", *TE_MODEL), ("forward_step",), ("forward_step",),
                      ("GD521",)),
}
MULTI_CASES: dict[str, DiffCase] = {
    # GD516 counts the graph kept alive but cannot name who keeps it; GD517 gives every rank's stack.
    "GD516": DiffCase(("--impl", "local"), ("layer_spec",), ("layer_spec",), ()),
    "GD517": DiffCase(("--impl", "local"), ("layer_spec",), ("layer_spec",), ()),
}


def marked_location(code: str) -> str:
    """`fixtures/rules/<code>_bad.py:<line>` of its one `# [code]` marker."""
    lines = (FIXTURES / f"{code}_bad.py").read_text(encoding="utf-8").splitlines()
    numbers = [n for n, line in enumerate(lines, 1) if f"# [{code}]" in line]
    assert len(numbers) == 1, f"{code}_bad.py: expected one # [{code}] marker, got {numbers}"
    return f"fixtures/rules/{code}_bad.py:{numbers[0]}"


def _keep(name: str, proc: subprocess.CompletedProcess[str], report: Path | None = None) -> None:
    folder = os.environ.get("GD_REPORT_DIR")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"rule_fixture_{name}.txt").write_text(proc.stdout + "\n" + proc.stderr[-4000:], encoding="utf-8")
    if report is not None and report.exists():
        shutil.copy(report, Path(folder) / f"rule_fixture_{name}.json")


def run_probe(stem: str) -> dict[str, Any]:
    """`graphdoctor check --probe --layer-spec fixtures.rules.<stem>:layer_spec` on the small model: its JSON report."""
    cmd = [sys.executable, "-m", "graphdoctor.cli", "check", "--probe", "--layer-spec", f"fixtures.rules.{stem}:layer_spec",
           *PROBE_MODEL, "--probe-timeout", "240", "--format", "json"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=570, check=False)
    _keep(stem, proc)
    assert proc.stdout.strip(), f"{stem}: exit {proc.returncode}, no report; stderr:\n{proc.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def run_diff(stem: str, case: DiffCase, entries: tuple[str, ...], workdir: Path, *extra: str,
             timeout_s: int = DIFF_TIMEOUT_S) -> dict[str, Any]:
    """`graphdoctor diff` of one fixture on the small model: its JSON report."""
    out = workdir / f"{stem}.json"
    flags = [arg for entry in entries for arg in (f"--{entry.replace('_', '-')}", f"fixtures.rules.{stem}:{entry}")]
    own = case.bad_args if stem.endswith("_bad") else ()
    cmd = [sys.executable, "-m", "graphdoctor.cli", "diff", *DIFF_MODEL, *case.args, *own, *flags, *extra,
           "--timeout", str(timeout_s), "--json", str(out), "--workdir", str(workdir / stem), "-q"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=4 * (timeout_s + 30), check=False)
    _keep(stem, proc, out)
    assert out.exists(), f"{stem}: exit {proc.returncode}, no report; stderr:\n{proc.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


def sightings(report: dict[str, Any]) -> set[tuple[str, str | None]]:
    """(rule, location) of every cause, diagnosis and runtime note of a diff report's rows."""
    seen: set[tuple[str, str | None]] = set()
    for row in report["impls"]:
        seen |= {(c["rule"], c.get("location")) for c in row.get("causes") or []}
        diag = row.get("diagnosis") or {}
        if diag.get("rule"):
            seen.add((diag["rule"], diag.get("location")))
        seen |= {(note.split(" ", 1)[0], None) for note in row.get("notes") or [] if note.startswith("GD5")}
    return seen


def describe(report: dict[str, Any]) -> str:
    return json.dumps([{k: row.get(k) for k in ("impl", "verdict", "diagnosis", "causes", "notes")}
                       for row in report["impls"]], indent=1)[:6000]


def assert_bad_reports(code: str, case: DiffCase, report: dict[str, Any]) -> None:
    seen = sightings(report)
    assert code in {rule for rule, _ in seen}, describe(report)
    if case.at_line:
        where = marked_location(code)
        assert any(rule in case.at_line and loc == where for rule, loc in seen), (where, describe(report))


def assert_good_silent(code: str, report: dict[str, Any]) -> None:
    assert code not in {rule for rule, _ in sightings(report)}, describe(report)


def _run_all(jobs: dict[str, Any], workers: int) -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def probe_reports() -> dict[str, dict[str, Any]]:
    stems = [f"{code}_{kind}" for code in PROBE_CODES for kind in ("bad", "good")]
    return _run_all({stem: (lambda stem=stem: run_probe(stem)) for stem in stems}, PROBE_WORKERS)


def _diff_reports(cases: dict[str, DiffCase], workdir: Path) -> dict[str, dict[str, Any]]:
    jobs = {}
    for code, case in cases.items():
        for kind, entries in (("bad", case.bad), ("good", case.good)):
            stem = f"{code}_{kind}"
            jobs[stem] = lambda stem=stem, case=case, entries=entries: run_diff(stem, case, entries, workdir)
    return _run_all(jobs, DIFF_WORKERS)


@pytest.fixture(scope="module")
def diff_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _diff_reports(DIFF_CASES, tmp_path_factory.mktemp("rule_diffs"))


@pytest.fixture(scope="module")
def te_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _diff_reports(TE_CASES, tmp_path_factory.mktemp("rule_te_diffs"))


def _probe_codes(data: dict[str, Any]) -> str:
    return json.dumps([(f["code"], f["severity"], f["locations"]) for f in data["findings"]])


@pytest.mark.gpu
@pytest.mark.parametrize("code", PROBE_CODES)
def test_probe_bad_fixture_reports_its_rule_at_the_marked_line(probe_reports: dict[str, Any], code: str) -> None:
    data = probe_reports[f"{code}_bad"]
    where = marked_location(code)
    matches = [f for f in data["findings"] if f["code"] == code]
    assert matches, _probe_codes(data)
    assert any(loc.endswith(where) for f in matches for loc in f["locations"]), (where, _probe_codes(data))


@pytest.mark.gpu
@pytest.mark.parametrize("code", PROBE_CODES)
def test_probe_good_fixture_does_not_report_its_rule(probe_reports: dict[str, Any], code: str) -> None:
    data = probe_reports[f"{code}_good"]
    assert code not in [f["code"] for f in data["findings"]], _probe_codes(data)


# Megatron-Core 0.19.2's local graphs differ from eager where TE imports (conftest.WITHOUT_TE_REASON).
DIFF_PARAMS = [pytest.param(code, marks=pytest.mark.without_te) for code in DIFF_CASES]
TE_PARAMS = [pytest.param(code, marks=pytest.mark.needs_te) for code in TE_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("code", DIFF_PARAMS)
def test_diff_bad_fixture_reports_its_rule(diff_reports: dict[str, Any], code: str) -> None:
    assert_bad_reports(code, DIFF_CASES[code], diff_reports[f"{code}_bad"])


@pytest.mark.gpu
@pytest.mark.parametrize("code", DIFF_PARAMS)
def test_diff_good_fixture_does_not_report_its_rule(diff_reports: dict[str, Any], code: str) -> None:
    assert_good_silent(code, diff_reports[f"{code}_good"])


@pytest.mark.gpu
@pytest.mark.parametrize("code", TE_PARAMS)
def test_te_bad_fixture_reports_its_rule(te_reports: dict[str, Any], code: str) -> None:
    assert_bad_reports(code, TE_CASES[code], te_reports[f"{code}_bad"])


@pytest.mark.gpu
@pytest.mark.parametrize("code", TE_PARAMS)
def test_te_good_fixture_does_not_report_its_rule(te_reports: dict[str, Any], code: str) -> None:
    assert_good_silent(code, te_reports[f"{code}_good"])


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
@pytest.mark.parametrize("code", list(MULTI_CASES))
def test_two_rank_fixtures_report_their_rule_and_the_fixed_ones_do_not(code: str, tmp_path: Path) -> None:
    case = MULTI_CASES[code]
    extra = ("--nproc-per-node", "2")
    bad = run_diff(f"{code}_bad", case, case.bad, tmp_path, *extra, timeout_s=MULTI_TIMEOUT_S)
    assert_bad_reports(code, case, bad)
    good = run_diff(f"{code}_good", case, case.good, tmp_path, *extra, timeout_s=MULTI_TIMEOUT_S)
    assert_good_silent(code, good)


def _entries(code: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(bad, good) entry points the GPU run uses for `code`."""
    if code in PROBE_CODES:
        return ("layer_spec",), ("layer_spec",)
    case = {**DIFF_CASES, **TE_CASES, **MULTI_CASES}[code]
    return case.bad, case.good


RUNTIME_CODES = [r.code for r in all_rules() if r.runtime]


def test_every_runtime_rule_has_one_gpu_row() -> None:
    rows = [*PROBE_CODES, *DIFF_CASES, *TE_CASES, *MULTI_CASES]
    assert sorted(rows) == sorted(RUNTIME_CODES)


@pytest.mark.parametrize("code", RUNTIME_CODES)
def test_fixtures_import_with_the_entry_points_the_gpu_run_uses(code: str) -> None:
    """Runs on the CPU: each fixture imports (no CUDA at import) and defines the entry points its row passes; the
    bad fixture's marker sits inside one of its functions, the good fixture has none."""
    for kind, entries in zip(("bad", "good"), _entries(code), strict=True):
        module = importlib.import_module(f"fixtures.rules.{code}_{kind}")
        assert all(callable(getattr(module, entry, None)) for entry in entries), (module.__name__, entries)
        source = inspect.getsource(module).splitlines()
        marked = [n for n, line in enumerate(source, 1) if f"# [{code}]" in line]
        if kind == "good":
            assert not marked, module.__name__
            continue
        (line,) = marked
        bodies = [obj for obj in vars(module).values() if inspect.isfunction(obj) or inspect.isclass(obj)]
        spans = []
        for obj in bodies:
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            lines, start = inspect.getsourcelines(obj)
            spans.append(range(start, start + len(lines)))
        assert any(line in span for span in spans), f"{module.__name__}:{line} is not inside a function or class"
