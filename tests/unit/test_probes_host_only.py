"""Host-only library code inside a captured unit is info, not a warning (issue 15, deliver 5).

Megatron's RNG tracker compares CPU RNG states on the way out of `fork()`
(`torch.all(cpu_rng_state == torch.get_rng_state())`, megatron/core/tensor_parallel/random.py). The
probe saw only CPU tensors in those ops, from a frame in Megatron: no device work, nothing a graph
could get wrong. The decision is made from those two recorded facts, not from the file name. Here the
very line of the installed Megatron is run with real torch RNG states under the Recorder (`meta`
standing in for the device, so CPU tensors are host tensors), compiled with its real file and line so
the recorded frame is Megatron's; the same operation in this (user) file stays a warning.
"""

from __future__ import annotations

import linecache

import megatron.core.tensor_parallel.random as mrandom
import torch

from graphdoctor.child.probe.recorder import Recorder
from graphdoctor.probes.analyze import HOST_ONLY_LIBRARY_REASON, analyze, host_only_library
from graphdoctor.rules.finding import Severity

NEEDLE = "torch.all(cpu_rng_state == torch.get_rng_state())"


def megatron_rng_check_line() -> tuple[str, int, str]:
    path = mrandom.__file__
    for number, line in enumerate(linecache.getlines(path), 1):
        if NEEDLE in line:
            return path, number, line.strip()
    raise AssertionError(f"{NEEDLE} not in {path}")


def run_line(path: str, number: int, statement: str) -> Recorder:
    code = compile("\n" * (number - 1) + statement.replace("if not ", "ok = ").rstrip(":"), path, "exec")
    scope = {"torch": torch, "cpu_rng_state": torch.get_rng_state()}
    with Recorder(device_type="meta") as recorder:
        exec(code, scope)  # noqa: S102 - the installed Megatron line, at its own file and line
    assert scope["ok"] is True
    return recorder


def test_megatron_rng_state_check_is_info_with_the_reason() -> None:
    path, number, statement = megatron_rng_check_line()
    recorder = run_line(path, number, statement)
    gd507 = [o for o in recorder.observations if o.code == "GD507"]
    assert gd507, recorder.observations
    # called from this file, so the reported line is this file's; the issuer is Megatron's line
    assert all(o.host_only and o.library_issuer for o in gd507)
    findings = analyze(recorder.observations, [])
    assert [f.severity for f in findings] == [Severity.INFO]
    assert HOST_ONLY_LIBRARY_REASON in findings[0].message
    assert findings[0].extra["host_only"] is True


def test_the_same_host_op_in_user_code_stays_a_warning() -> None:
    with Recorder(device_type="meta") as recorder:
        cpu_rng_state = torch.get_rng_state()
        bool(torch.all(cpu_rng_state == torch.get_rng_state()).item())
    gd507 = [o for o in recorder.observations if o.code == "GD507"]
    assert gd507 and all(o.user_code and o.host_only and not o.library_issuer for o in gd507)
    assert not any(host_only_library(o) for o in gd507)
    assert {f.severity for f in analyze(recorder.observations, [])} == {Severity.WARNING}


def test_library_op_on_device_tensors_is_not_host_only() -> None:
    x = torch.randn(4, device="meta")
    with Recorder(device_type="meta") as recorder:
        torch.nn.functional.relu(x)
    assert all(not o.host_only for o in recorder.observations)
