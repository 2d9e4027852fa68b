"""Typed view-model of a saved diff report for the HTML page: ReportView from the JSON payload.

Built from the documented JSON (docs/diff.md, schema_version 1 and 2), never from the in-memory DiffReport
types, so any saved report renders: optional sections may be missing, newer fields are ignored, and
the eager reference's `impl` may be "none" or "eager". A recorded tap-table file
(fixtures/data/forensics/*.json.gz) loads as a one-implementation report with its forensics.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphdoctor.errors import InputFileError
from graphdoctor.inputs import read_json
from graphdoctor.report.html_model_parts import (
    EAGER_NAMES,
    PASSING_VERDICTS,
    CauseView,
    ControlView,
    DiagnosisView,
    DivergenceView,
    LaunchesView,
    MemoryView,
    RunView,
    TimingView,
    as_int,
    as_list,
    as_map,
    as_str,
    num,
)

SCHEMA_VERSION = 2
"""The report schema this view reads; a newer major version is refused."""

_KWARG = re.compile(r"(\w+)=('[^']*'|\([^)]*\)|[\w.]+)")
_TORCH = re.compile(r"torch ([\w.+]+)")
_MCORE = re.compile(r"megatron-core ([\w.]+)")

MAX_REPORT_BYTES = 512 * 1024 * 1024
"""Refuse report files larger than this (decompressed)."""


@dataclass(frozen=True, slots=True)
class TapDivergenceView:
    """The first tap (draw, output or gradient fingerprint) that differs."""

    step: int | None
    kind: str
    module: str
    op: str
    location: str | None
    max_abs: float | None
    max_rel: float | None

    @classmethod
    def parse(cls, raw: Any) -> TapDivergenceView | None:
        """None when nothing differs."""
        if not isinstance(raw, Mapping):
            return None
        step = raw.get("step", raw.get("first_step"))
        return cls(as_int(step), str(raw.get("kind") or "?"), str(raw.get("module") or ""),
                   str(raw.get("op") or ""), as_str(raw.get("location")), num(raw.get("max_abs")),
                   num(raw.get("max_rel")))


@dataclass(frozen=True, slots=True)
class TapSiteView:
    """One tapped site summarised over the compared steps."""

    kind: str
    module: str
    op: str
    location: str | None
    keep_rate: float | None
    expected_keep_rate: float | None
    num_steps_compared: int
    num_steps_identical: int
    repeats_across_replays: bool
    captured: bool


@dataclass(frozen=True, slots=True)
class ForensicsView:
    """Random-draw sites, frozen draws and the first divergent module (docs/forensics.md)."""

    compared_steps: tuple[int, ...]
    rng_aligned: bool | None
    sites: tuple[TapSiteView, ...]
    frozen: tuple[TapDivergenceView, ...]
    first_divergence: TapDivergenceView | None
    first_numeric_divergence: TapDivergenceView | None
    first_draw_mismatch: TapDivergenceView | None
    num_unpaired: int
    notes: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Any) -> ForensicsView | None:
        """None when taps did not run."""
        if not isinstance(raw, Mapping):
            return None
        sites = tuple(TapSiteView(str(s.get("kind") or "?"), str(s.get("module") or ""), str(s.get("op") or ""),
                                  as_str(s.get("location")), num(s.get("keep_rate")),
                                  num(s.get("expected_keep_rate")), as_int(s.get("num_steps_compared")) or 0,
                                  as_int(s.get("num_steps_identical")) or 0,
                                  bool(s.get("repeats_across_replays")), bool(s.get("captured")))
                      for s in as_list(raw.get("sites")) if isinstance(s, Mapping))
        frozen = tuple(v for v in (TapDivergenceView.parse(f) for f in as_list(raw.get("frozen"))) if v)
        aligned = raw.get("rng_aligned")
        return cls(tuple(i for i in (as_int(s) for s in as_list(raw.get("compared_steps"))) if i is not None),
                   aligned if isinstance(aligned, bool) else None, sites, frozen,
                   TapDivergenceView.parse(raw.get("first_divergence")),
                   TapDivergenceView.parse(raw.get("first_numeric_divergence")),
                   TapDivergenceView.parse(raw.get("first_draw_mismatch")), as_int(raw.get("num_unpaired")) or 0,
                   tuple(str(n) for n in as_list(raw.get("notes"))))


@dataclass(frozen=True, slots=True)
class ImplView:
    """One graphed implementation: verdict, diagnosis and its sections."""

    impl: str
    verdict: str
    passed: bool
    first_divergence: DivergenceView | None
    timing: TimingView | None
    diagnosis: DiagnosisView | None
    control: ControlView | None
    notes: tuple[str, ...]
    memory: MemoryView | None
    launches: LaunchesView | None
    forensics: ForensicsView | None
    runs: tuple[RunView, ...]
    causes: tuple[CauseView, ...] = ()

    @property
    def graphed_run(self) -> RunView | None:
        """The compared graphed run at the configured dropout (the first run of this impl)."""
        return next((r for r in self.runs if r.impl == self.impl), None)

    def control_run(self, dropout: float | None) -> RunView | None:
        """The dropout-free control run, when the configured dropout is not 0."""
        if not dropout:
            return None
        return next((r for r in self.runs if r.impl == self.impl and r.dropout == 0.0), None)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ImplView:
        """One entry of impls[]."""
        verdict = str(raw.get("verdict") or "?")
        passed = raw.get("passed")
        runs = tuple(r for r in (RunView.parse(x) for x in as_list(raw.get("runs"))) if r is not None)
        return cls(str(raw.get("impl") or "?"), verdict,
                   passed if isinstance(passed, bool) else verdict in PASSING_VERDICTS,
                   DivergenceView.parse(raw.get("first_divergence")), TimingView.parse(raw.get("timing")),
                   DiagnosisView.parse(raw.get("diagnosis")), ControlView.parse(raw.get("control")),
                   tuple(str(n) for n in as_list(raw.get("notes"))), MemoryView.parse(raw.get("memory")),
                   LaunchesView.parse(raw.get("launches")), ForensicsView.parse(raw.get("forensics")), runs,
                   tuple(c for c in (CauseView.parse(x) for x in as_list(raw.get("causes"))) if c is not None))


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What ran: model, parallelism, dtype, dropout, versions and GPU."""

    model: str
    parallelism: str
    dtype: str
    dropout: float | None
    steps: int | None
    warmup_steps: int | None
    tolerance: str
    torch: str
    megatron_core: str
    gpu: str
    recorded: str

    @classmethod
    def parse(cls, config: Mapping[str, Any], env: Mapping[str, Any], recorded: str = "") -> RunInfo:
        """From the report's config and env sections (every field optional)."""
        get = config.get
        layers, hidden, heads = get("num_layers", "?"), get("hidden_size", "?"), get("num_attention_heads", "?")
        model = f"GPTModel {layers} layers x {hidden} hidden, {heads} heads"
        if get("seq_length") is not None:
            model += f", seq {get('seq_length')}"
        if get("micro_batch_size") is not None:
            model += f", micro-batch {get('micro_batch_size')} x {get('num_microbatches', 1)}"
        spec = get("model_provider") or get("layer_spec")
        if spec:
            model += f", {spec}"
        transformer = as_map(get("transformer"))
        tp = transformer.get("tensor_model_parallel_size", get("tensor_model_parallel_size", 1))
        pp = transformer.get("pipeline_model_parallel_size", get("pipeline_model_parallel_size", 1))
        parallelism = f"world size {env.get('world_size', 1)}, TP {tp}, PP {pp}"
        rtol, atol = num(get("rtol")) or 0.0, num(get("atol")) or 0.0
        tolerance = "bitwise" if rtol == 0.0 and atol == 0.0 else f"rtol {rtol:g}, atol {atol:g}"
        return cls(model, parallelism, str(get("dtype") or "?"), num(get("dropout")), as_int(get("steps")),
                   as_int(get("cuda_graph_warmup_steps")), tolerance, str(env.get("torch") or "?"),
                   str(env.get("megatron_core") or "?"), str(env.get("gpu") or "?"), recorded)


@dataclass(frozen=True, slots=True)
class ReportView:
    """A whole diff report, ready to render."""

    source: str
    """"diff" for a diff report, "taps" for a recorded tap-table file."""

    info: RunInfo
    exit_code: int | None
    wall_s: float | None
    reference: RunView | None
    control_reference: RunView | None
    impls: tuple[ImplView, ...]
    stopped: str | None = None
    """The signal that stopped graphdoctor before the diff finished (a partial report), else None."""


def parse_report(payload: Mapping[str, Any]) -> ReportView:
    """The view of a diff report payload (`DiffReport.to_dict()` or the saved JSON).

    Raises:
        InputFileError: not a diff report or tap table, or a newer schema_version.
    """
    if "impls" not in payload and "graphed" in payload and "reference" in payload:
        return _parse_taps(payload)
    version = payload.get("schema_version")
    if "impls" not in payload or not isinstance(payload.get("impls"), list):
        raise InputFileError("not a graphdoctor diff report: no impls list (expected the JSON of diff --json)")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise InputFileError(f"schema_version {version} is newer than this graphdoctor reads "
                             f"(expected <= {SCHEMA_VERSION})")
    reference = RunView.parse(payload.get("reference"))
    if reference is not None and not reference.is_eager:
        reference = None
    impls = tuple(ImplView.parse(i) for i in payload["impls"] if isinstance(i, Mapping))
    stopped = payload.get("stopped")
    return ReportView("diff", RunInfo.parse(as_map(payload.get("config")), as_map(payload.get("env"))),
                      as_int(payload.get("exit_code")), num(payload.get("wall_s")), reference,
                      RunView.parse(payload.get("control_reference")), impls,
                      stopped=str(stopped) if stopped else None)


def _parse_taps(payload: Mapping[str, Any]) -> ReportView:
    impl = str(payload.get("impl") or "?")
    verdict = str(payload.get("live_verdict") or "?")
    view = ImplView(impl, verdict, verdict in PASSING_VERDICTS,
                    DivergenceView.parse(payload.get("live_first_divergence")), None,
                    DiagnosisView.parse(payload.get("live_diagnosis")), None,
                    tuple(str(n) for n in as_list(payload.get("live_notes"))), None, None,
                    ForensicsView.parse(payload.get("live_analysis")), ())
    command = str(payload.get("command") or "")
    config: dict[str, Any] = {key: value.strip("'") for key, value in _KWARG.findall(command)}
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "steps",
                "cuda_graph_warmup_steps"):
        if key in config and str(config[key]).isdigit():
            config[key] = int(config[key])
    config["dropout"] = payload.get("dropout")
    config.setdefault("dtype", "fp32")  # DiffConfig's default when the command does not set it
    recorded = str(payload.get("recorded") or "")
    torch_v, mcore_v = _TORCH.search(recorded), _MCORE.search(recorded)
    env = {"gpu": recorded.split(",")[0] if recorded else "?", "torch": torch_v.group(1) if torch_v else "?",
           "megatron_core": mcore_v.group(1) if mcore_v else "?"}
    info = RunInfo.parse(config, env, recorded=recorded)
    return ReportView("taps", info, None, None, None, None, (view,))


def load_report(path: str | Path) -> ReportView:
    """Read a saved report (.json or .json.gz) and build its view.

    Raises:
        InputFileError: unreadable, not JSON, too large, or not a diff report.
    """
    # The one input layer: regular files only (a FIFO or /dev/zero is refused before reading), the
    # size and decompression caps, strict JSON.
    payload = read_json(path, "diff report", max_bytes=MAX_REPORT_BYTES)
    if not isinstance(payload, Mapping):
        raise InputFileError(f"{path}: not a graphdoctor diff report (top level is not an object)")
    try:
        return parse_report(payload)
    except InputFileError as exc:
        raise InputFileError(f"{path}: {exc}") from None


__all__ = [
    "EAGER_NAMES", "MAX_REPORT_BYTES", "SCHEMA_VERSION", "ForensicsView", "ImplView", "ReportView", "RunInfo",
    "TapDivergenceView", "TapSiteView", "load_report", "parse_report",
]
