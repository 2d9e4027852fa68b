"""The culprit of a failed capture names its own rule: one classification (the probes' Recorder) for
`check --probe` and diff's culprit hunt, and the diagnosis built from it.

The failing operations run for real under the Recorder with `meta` standing in for the device: like
a stream capture, a meta tensor cannot hand a value (`.item()`) or a data-dependent shape (`nonzero`)
back to the host, so the same operations raise at the same lines. The diagnosis side uses the error
text and traceback diff recorded on the H200 (fixtures/data/diff/h200_item_mlp_schema2.json).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
import torch

from graphdoctor.child.probe.recorder import Recorder
from graphdoctor.parent.diagnose import diagnose
from graphdoctor.probes.analyze import CAPTURE_BREAKING, analyze, culprit_of
from graphdoctor.protocol.events import Error, decode, encode
from graphdoctor.rules import get_rule, rule_fix
from tests.unit.sessions import DeferredSession

THIS_FILE = os.path.relpath(os.path.realpath(__file__), os.path.realpath(os.getcwd()))
REPO = Path(__file__).resolve().parents[2]
H200_ITEM_MLP = REPO / "fixtures/data/diff/h200_item_mlp_schema2.json"


def marked_line(code: str) -> str:
    lines = inspect.getsource(inspect.getmodule(marked_line)).splitlines()
    numbers = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# [{code}]")]
    assert len(numbers) == 1, numbers
    return f"{THIS_FILE}:{numbers[0]}"


class NonzeroAfterItemFreeWork(torch.nn.Module):
    """Host-side bookkeeping first (recorded, does not fail), then nonzero (fails)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        rows = torch.nonzero(y > 0)  # [GD502]
        return y + rows.shape[0]


class ItemModule(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.sum() > 1e9).item():  # [GD501]
            return x * 2
        return x


def failed_run(module: torch.nn.Module) -> Recorder:
    model = torch.nn.Sequential(module)
    names = {id(m): n for n, m in model.named_modules()}
    recorder = Recorder(device_type="meta", module_names=names)
    with recorder, pytest.raises((NotImplementedError, RuntimeError)):
        model(torch.randn(4, 8, device="meta"))
    return recorder


@pytest.mark.parametrize(("module", "code"), [(NonzeroAfterItemFreeWork(), "GD502"), (ItemModule(), "GD501")])
def test_the_operation_that_raised_is_the_culprit(module: torch.nn.Module, code: str) -> None:
    recorder = failed_run(module)
    culprit = culprit_of(recorder.failed)
    assert culprit is not None, recorder.observations
    assert (culprit.code, culprit.location, culprit.module) == (code, marked_line(code), "0")
    assert culprit.user_code


def test_check_probe_gives_the_same_rule_for_the_same_code() -> None:
    recorder = failed_run(NonzeroAfterItemFreeWork())
    culprit = culprit_of(recorder.failed)
    assert culprit is not None
    findings = analyze(recorder.observations, [])
    at_line = [f.code for f in findings if f.locations == (culprit.location,)]
    assert at_line == [culprit.code] == ["GD502"]


def test_no_failure_no_culprit() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).to("meta")
    with Recorder(device_type="meta") as recorder:
        model(torch.randn(4, 8, device="meta"))
    assert recorder.failed == ()
    assert culprit_of(recorder.failed) is None


def _frames(traceback_tail: list[str]) -> list[tuple[str, int, str]]:
    """A recorded diagnosis' `file:line in function` tail as the frames diagnose() takes."""
    frames = []
    for entry in traceback_tail:
        where, function = entry.rsplit(" in ", 1)
        path, line = where.rsplit(":", 1)
        frames.append((path, int(line), function))
    return frames


def _h200_item_failure() -> tuple[str, list[tuple[str, int, str]]]:
    doc = json.loads(H200_ITEM_MLP.read_text(encoding="utf-8"))
    diag = doc["impls"][0]["diagnosis"]
    return diag["message"], _frames(diag["traceback_tail"])


@pytest.mark.parametrize(("rule", "operator"), [
    ("GD502", "aten::nonzero"), ("GD503", "aten::mul.Tensor"), ("GD504", "aten::copy_ (pageable host to device)"),
    ("GD505", "rand(generator=...)"), ("GD501", "aten::_local_scalar_dense"),
])
def test_diagnosis_cites_the_culprit_rule_not_the_message_rule(rule: str, operator: str) -> None:
    message, frames = _h200_item_failure()
    # Without a culprit the H200 text alone reads as a host sync.
    assert diagnose("AcceleratorError", message, frames).rule == "GD501"
    diag = diagnose("AcceleratorError", message, frames, module="decoder.layers.0.mlp", step=0,
                    phase="capture", culprit_rule=rule, culprit_operator=operator)
    assert diag.rule == rule
    assert diag.fix == rule_fix(rule)
    assert diag.meaning is not None and operator in diag.meaning and get_rule(rule).name in diag.meaning
    assert diag.cuda_error == "cudaErrorStreamCaptureUnsupported"
    assert diag.location is not None and diag.location.endswith("fixtures/planted/item_mlp.py:19")


def test_error_event_carries_the_culprit_to_the_parent() -> None:
    message, frames = _h200_item_failure()
    event = Error(error_type="AcceleratorError", message=message, frames=tuple(frames), step=0,
                  phase="capture", culprit_rule="GD502", culprit_operator="aten::nonzero")
    back = decode(encode(event))
    assert back == event
    old = json.loads(encode(event))
    del old["culprit_rule"], old["culprit_operator"]
    assert decode(json.dumps(old)).culprit_rule is None  # type: ignore[union-attr]


def test_every_capture_breaking_kind_is_a_catalogue_rule() -> None:
    assert {get_rule(code).code for code in CAPTURE_BREAKING} == set(CAPTURE_BREAKING)


class HostMaskCopy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = (torch.rand(x.shape, generator=self.gen) > 0.1).to(torch.float32)  # [GD506]
        return x * keep.to(x.device)  # [GD504]


def test_host_drawn_mask_copy_is_gd506_not_the_copy() -> None:
    # A capture fails at the pageable copy (GD504 by its text), but pinning alone would freeze the
    # draw: the copy's classification carries GD506 first, at the draw's line.
    model = torch.nn.Sequential(HostMaskCopy())
    with Recorder(device_type="meta") as recorder:
        model(torch.randn(4, 8, device="meta"))
    copy_ops = [o for o in recorder.observations if o.code in ("GD504", "GD506")]
    assert [o.code for o in copy_ops] == ["GD506", "GD504"]
    culprit = culprit_of(copy_ops)
    assert culprit is not None and (culprit.code, culprit.location) == ("GD506", marked_line("GD506"))
    assert copy_ops[1].location == marked_line("GD504")


class HuntSession(DeferredSession):
    """Hands out the culprit-hunt record a child would produce: its Error event (with the culprit
    the Recorder classified) through the event codec and the parent's diagnose()."""

    def __init__(self, workdir: Path, culprit_rule: str | None) -> None:
        from graphdoctor.config import DiffConfig

        self.config = DiffConfig(impls=("local",), dropout=0.0)
        self.workdir = workdir
        self.culprit_rule = culprit_rule
        self.requests: list = []

    def run_request(self, request):  # noqa: ANN001, ANN201 - the session protocol of ChildSchedule
        from graphdoctor.protocol import RunRecord

        self.requests.append(request)
        message, frames = _h200_item_failure()
        sent = Error(error_type="RuntimeError", message="called a synchronizing CUDA operation",
                     frames=tuple(frames), step=0, phase="capture", culprit_rule=self.culprit_rule,
                     culprit_operator="aten::nonzero at fixtures/planted/nonzero_mlp.py:19")
        got = decode(encode(sent))
        assert isinstance(got, Error)
        diag = diagnose(got.error_type, got.message, list(got.frames), step=got.step, phase=got.phase,
                        culprit_rule=got.culprit_rule, culprit_operator=got.culprit_operator)
        return RunRecord(impl=request.impl, dropout=request.dropout, status="error", diagnosis=diag)


def _failed_row(message: str):  # noqa: ANN202
    from graphdoctor.compare.verdict import ImplResult
    from graphdoctor.types import Verdict

    _, frames = _h200_item_failure()
    return ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED,
                      diagnosis=diagnose("AcceleratorError", message, frames, step=0, phase="capture"))


def test_hunt_replaces_a_located_gd501_by_the_culprit_rule(tmp_path: Path) -> None:
    from graphdoctor.diff import DiffRun

    message, _ = _h200_item_failure()
    session = HuntSession(tmp_path, "GD502")
    row = DiffRun(session).tree.hunt_culprit(_failed_row(message), "local")  # type: ignore[arg-type]
    assert [r.hunt for r in session.requests] == [True]
    assert row.diagnosis is not None and row.diagnosis.rule == "GD502"
    assert row.diagnosis.fix == rule_fix("GD502")
    assert row.diagnosis.cuda_error == "cudaErrorStreamCaptureUnsupported"
    assert row.diagnosis.reported_as is not None and "item_mlp.py:19" in row.diagnosis.reported_as


def test_a_text_that_names_its_rule_needs_no_hunt(tmp_path: Path) -> None:
    from graphdoctor.diff import DiffRun

    implicit = "CUDA error: operation would make the legacy stream depend on a capturing blocking stream"
    session = HuntSession(tmp_path, None)
    row = DiffRun(session).tree.hunt_culprit(_failed_row(implicit), "local")  # type: ignore[arg-type]
    assert session.requests == []
    assert row.diagnosis is not None and row.diagnosis.rule == "GD503"


def test_a_capture_failure_gd217_predicts_needs_no_hunt(tmp_path: Path) -> None:
    """The H200's dropless allgather MoE under local attn (fixtures/data/moe/): the parent's diagnosis of the
    recorded error, before the static findings name Megatron's frame, would be hunted; GD217 already
    explains it (token dispatch's host copy), so no culprit-hunt child runs."""
    from graphdoctor.compare.verdict import ImplResult
    from graphdoctor.config import diff_config_from, load_run_file
    from graphdoctor.diff import DiffRun
    from graphdoctor.parent.static import with_static_findings
    from graphdoctor.types import Verdict

    doc = json.loads((REPO / "fixtures" / "data" / "moe" / "h200_dropless_allgather_local_attn.json").read_text("utf-8"))
    recorded = doc["impls"][0]["diagnosis"]
    diag = diagnose(recorded["error_type"], recorded["message"], _frames(recorded["traceback_tail"]), step=0,
                    phase="capture")
    row = ImplResult(impl="local", verdict=Verdict.CAPTURE_FAILED, diagnosis=diag)
    session = HuntSession(tmp_path, None)
    session.config = diff_config_from(load_run_file(REPO / "fixtures" / "runfiles" / "moe_dropless_allgather.yaml"),
                                      impls="local", cuda_graph_modules="attn", dropout=0.0)
    hunted = DiffRun(session).tree.hunt_culprit(row, "local")  # type: ignore[arg-type]
    assert session.requests == []
    final = with_static_findings(hunted, session.config)
    assert final.diagnosis is not None and final.diagnosis.rule == "GD217"
    assert final.diagnosis.location == "megatron/core/transformer/moe/token_dispatcher.py:317"
    assert not [n for n in final.notes if "culprit hunt" in n]


def _observation(code: str, location: str, seq: int):  # noqa: ANN202
    from graphdoctor.probes.types import Observation

    return Observation(code=code, operator="aten::mul", module="decoder.layers.0.mlp", location=location,
                       user_code=True, seq=seq)


def test_a_named_rule_is_found_in_an_earlier_capture_than_the_failing_one() -> None:
    """The H100's planted default_stream_mlp under local graphs: the forward's multiply on the legacy stream ran
    outside its graph (a cached block served its output, so nothing raised), and only the backward capture that
    depends on it failed, with 906's text. The hunt recorded the multiply in the forward's capture."""
    from graphdoctor.child.culprit import CulpritHunt

    hunt = CulpritHunt({})
    forward = _observation("GD503", "fixtures/planted/default_stream_mlp.py:20", 0)
    hunt.captures = [(forward,), (_observation("GD504", "megatron/core/transformer/cuda_graphs.py:1432", 0),)]
    implicit = "CUDA error: operation would make the legacy stream depend on a capturing blocking stream"
    assert hunt.found(implicit) == forward
    assert hunt.last_capture == hunt.captures[-1]
    newer = _observation("GD503", "fixtures/planted/default_stream_mlp.py:20", 1)
    hunt.captures.append((newer,))
    assert hunt.found(implicit) == newer  # the failing capture's own operation first


def test_an_unnamed_failure_looks_only_at_the_failing_capture() -> None:
    from graphdoctor.child.culprit import CulpritHunt

    hunt = CulpritHunt({})
    hunt.captures = [(_observation("GD501", "model.py:3", 0),), ()]
    assert hunt.found("CUDA error: operation failed due to a previous error during capture") is None
