"""GD507 hits with no user frame are hidden by default; `--show-library-findings` shows them (issue 33).

On a clean Megatron model `check --probe` saw `aten::eq` in core attention: the RNG tracker's
`torch.all(cpu_rng_state == torch.get_rng_state())` on the way out of `fork()`
(megatron/core/tensor_parallel/random.py), which core attention runs around its dropout. Here that very
line of the installed Megatron is compiled at its own file and line and run under the real Recorder
(`meta` standing in for the device, so CPU tensors are host tensors). Run from a worker thread, no frame
of the stack is user code (threading and concurrent.futures are stdlib, the line is Megatron's): the hit
is library-internal. Called from this file, the same line has a user frame and is always shown.
"""

from __future__ import annotations

import json
import linecache
import re
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import megatron.core.tensor_parallel.random as mrandom
import pytest
import torch
from click.testing import CliRunner

from graphdoctor.child.probe.recorder import Recorder
from graphdoctor.cli import main
from graphdoctor.cli.check import CHECK_OPTIONS
from graphdoctor.locations import format_location
from graphdoctor.probes import ProbeReport, check_with_probes, combined, report_from_payloads
from graphdoctor.probes.analyze import SHOW_LIBRARY_OPTION, analyze, hide_library_findings, library_internal
from graphdoctor.probes.types import Observation
from graphdoctor.rules.finding import Severity

NEEDLE = "torch.all(cpu_rng_state == torch.get_rng_state())"
HIDDEN_NOTE = re.compile(r"^probe: (\d+) library-internal finding\(s\) hidden \(GD507 with no user frame "
                         r"on the stack\); --show-library-findings shows them$")


def megatron_rng_check() -> tuple[str, int, str]:
    """(file, line, expression) of the RNG tracker's CPU state check in the installed Megatron."""
    path = mrandom.__file__
    for number, line in enumerate(linecache.getlines(path), 1):
        if NEEDLE in line:
            expression = line.strip().removeprefix("if not ").rstrip(":")
            return path, number, expression
    raise AssertionError(f"{NEEDLE} not in {path}")


def megatron_function(name: str, body: list[str]) -> types.FunctionType:
    """A function whose last line is the Megatron check at its own file and line (`body` above it)."""
    path, number, expression = megatron_rng_check()
    params = "recorder, torch, cpu_rng_state" if body else "torch, cpu_rng_state"
    lines = [f"def {name}({params}):", *body, f"{'    ' * (len(body) + 1)}return {expression}"]
    source = "\n" * (number - len(lines)) + "\n".join(lines) + "\n"
    scope: dict[str, Any] = {}
    exec(compile(source, path, "exec"), scope)  # noqa: S102 - the installed Megatron line, at its own file and line
    function: types.FunctionType = scope[name]
    return function


def record_without_user_frame() -> list[Observation]:
    """Observations of the Megatron check, recorded where no frame of the stack is user code."""
    fork_exit = megatron_function("fork_exit", ["    with recorder:"])
    recorder = Recorder(device_type="meta")
    with ThreadPoolExecutor(max_workers=1) as pool:
        ok = pool.submit(fork_exit, recorder, torch, torch.get_rng_state()).result()
    assert ok is True
    return recorder.observations


def record_from_user_code() -> list[Observation]:
    """The same check called from this file: a user frame is on the stack."""
    fork_exit = megatron_function("fork_exit", [])
    with Recorder(device_type="meta") as recorder:
        assert fork_exit(torch, torch.get_rng_state()) is True
    return recorder.observations


def payload(observations: list[Observation]) -> dict[str, Any]:
    return {"observations": [o.to_dict() for o in observations], "captures": [], "recording_errors": []}


def megatron_location() -> str:
    path, number, _ = megatron_rng_check()
    return format_location(path, number)


def test_megatron_check_without_user_frame_is_library_internal() -> None:
    gd507 = [o for o in record_without_user_frame() if o.code == "GD507"]
    assert gd507, "the recorder saw no host op"
    assert {o.operator for o in gd507} >= {"aten::eq"}
    # no user frame: the reported line is Megatron's own
    assert all(not o.user_code and o.location == megatron_location() for o in gd507)
    assert all(library_internal(o) for o in gd507)
    (finding,) = analyze(gd507, [])
    assert finding.extra["library_internal"] is True and finding.severity is Severity.INFO


def test_megatron_check_called_from_user_code_is_not_library_internal() -> None:
    gd507 = [o for o in record_from_user_code() if o.code == "GD507"]
    assert gd507 and all(o.user_code and o.library_issuer for o in gd507)
    assert not any(library_internal(o) for o in gd507)
    report = report_from_payloads([payload(gd507)])
    assert report.codes() == ["GD507"] and report.hidden_findings == ()
    assert report.findings[0].extra["library_internal"] is False


def test_report_hides_library_internal_hits_by_default_and_shows_them_on_request() -> None:
    recorded = [payload(record_without_user_frame()), payload(record_from_user_code())]
    hidden = report_from_payloads(recorded)
    shown = report_from_payloads(recorded, show_library_findings=True)
    assert [f.code for f in hidden.findings] == ["GD507"]  # the user-frame hit only
    assert hidden.findings[0].locations != (megatron_location(),)
    assert [f.locations for f in hidden.hidden_findings] == [(megatron_location(),)]
    assert hidden.to_dict()["hidden_findings"][0]["extra"]["library_internal"] is True
    assert shown.hidden_findings == ()
    assert sorted(f.extra["library_internal"] for f in shown.findings) == [False, True]
    assert hidden.num_observations == shown.num_observations
    assert hide_library_findings(shown.findings) == (list(hidden.findings), list(hidden.hidden_findings))


def recorded_probe(observations: list[Observation], calls: list[dict[str, Any]]) -> Any:
    """Stands in for the GPU worker run of `probe` only: the recorded payload goes through the real
    report_from_payloads with the options the caller passed."""
    def probe(config: Any, *, show_library_findings: bool = False, **kwargs: Any) -> ProbeReport:
        calls.append({"show_library_findings": show_library_findings, **kwargs})
        return report_from_payloads([payload(observations)], show_library_findings=show_library_findings)

    return probe


def test_check_probe_hides_library_hits_with_one_note_and_the_option_shows_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(combined, "probe", recorded_probe(record_without_user_frame(), calls))
    result = CliRunner().invoke(main, ["check", "--probe", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert not [f for f in data["findings"] if f["code"] == "GD507"]
    matches = [m for m in map(HIDDEN_NOTE.match, data["notes"]) if m is not None]
    assert [m.group(1) for m in matches] == ["1"], data["notes"]

    result = CliRunner().invoke(main, ["check", "--probe", SHOW_LIBRARY_OPTION, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (finding,) = [f for f in data["findings"] if f["code"] == "GD507"]
    assert finding["extra"]["library_internal"] is True and finding["severity"] == "info"
    assert finding["locations"] == [megatron_location()]
    assert not any(HIDDEN_NOTE.match(n) for n in data["notes"])
    assert [c["show_library_findings"] for c in calls] == [False, True]


def test_hidden_note_counts_only_selected_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combined, "probe", recorded_probe(record_without_user_frame(), []))
    result = check_with_probes({"num_layers": 2}, select=["GD501"])
    assert result.exit_code == 0 and not any(HIDDEN_NOTE.match(n) for n in result.report.notes)
    result = check_with_probes({"num_layers": 2})
    assert result.report.codes() == [] and sum(bool(HIDDEN_NOTE.match(n)) for n in result.report.notes) == 1
    assert len(result.probe.hidden_findings) == 1


def test_option_is_a_check_option_with_help_and_noted_without_probe() -> None:
    (row,) = [kwargs for flag, kwargs in CHECK_OPTIONS if flag == SHOW_LIBRARY_OPTION]
    assert row["is_flag"] is True and row["default"] is False and row["help"].endswith("Default: off.")
    help_text = CliRunner().invoke(main, ["check", "--help"]).stdout
    assert re.search(rf"^\s+{re.escape(SHOW_LIBRARY_OPTION)}\b", help_text, re.MULTILINE)
    result = CliRunner().invoke(main, ["check", "--megatron-args", "--num-layers 2", SHOW_LIBRARY_OPTION,
                                       "--format", "json"])
    assert f"{SHOW_LIBRARY_OPTION} has no effect without --probe" in json.loads(result.stdout)["notes"]
