"""Target facts: `check` judges the installation rules against the training machine, not the
machine it runs on; `graphdoctor env --json` records that machine for `--target FILE`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main
from graphdoctor.rules import check
from graphdoctor.rules.facts import EnvironmentFacts
from graphdoctor.rules.target import facts_from_pairs, resolve_target

REPO = Path(__file__).resolve().parents[2]
TE_RUN = REPO / "examples" / "te_graphs.yaml"
NO_TE_TARGET = REPO / "fixtures" / "data" / "targets" / "cpu_no_te.json"
FULL_ITERATION = "transformer:\n  cuda_graph_impl: full_iteration\n"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def codes(out: str) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in json.loads(out)["findings"]}


def test_the_te_example_is_a_configuration_megatron_accepts() -> None:
    """Smoke test by design: Megatron's TransformerConfig raises on a configuration it rejects."""
    import yaml

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

    fields = yaml.safe_load(TE_RUN.read_text())["transformer"]
    TransformerConfig(**fields)  # raises when Megatron rejects it


def test_te_run_file_exits_0_without_a_target_and_says_not_checked() -> None:
    code, out, _ = invoke("check", str(TE_RUN), "--output-format", "json")
    assert code == 0, out
    assert "GD304" not in codes(out)  # not a finding: one not-checked line, and the JSON's not_checked list
    gd304 = next(f for f in json.loads(out)["not_checked"] if f["code"] == "GD304")
    assert gd304["message"].startswith("not checked: the training machine is unknown")
    _, text, _ = invoke("check", str(TE_RUN))
    assert [line for line in text.splitlines() if "not checked" in line] == [
        "note: not checked, the training machine is unknown (--target FILE|local|te=..,torch=.. names it): GD304 "
        "transformer-engine-missing, GD305 transformer-engine-too-old, GD306 torch-lacks-graph-safe-rng"]


def test_te_run_file_with_a_target_file_without_te_exits_1_with_gd304() -> None:
    facts = json.loads(NO_TE_TARGET.read_text())["facts"]
    assert facts["te_version"] is None and facts["unknown"] == []
    code, out, _ = invoke("check", str(TE_RUN), "--target", str(NO_TE_TARGET), "--output-format", "json")
    assert code == 1
    assert codes(out)["GD304"] == "error"
    assert json.loads(out)["target"]["source"] == f"target:{NO_TE_TARGET}"


def test_target_pairs_and_local() -> None:
    assert invoke("check", str(TE_RUN), "--target", "te=none")[0] == 1
    code, out, _ = invoke("check", str(TE_RUN), "--target", "te=2.12,torch=2.11,sm=90", "--output-format", "json")
    assert code == 0 and not codes(out)
    code, out, _ = invoke("check", str(TE_RUN), "--target", "te=2.6", "--output-format", "json")
    assert codes(out)["GD305"] == "warning"
    code, _, err = invoke("check", str(TE_RUN), "--target", "tee=2.12")
    assert code == 2 and "did you mean 'te'" in err and len(err.strip().splitlines()) == 1


def test_env_json_round_trips_as_a_target(tmp_path: Path) -> None:
    code, out, _ = invoke("env", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["command"] == "env" and data["schema_version"] == 2
    assert {"torch_version", "cuda_version", "nccl_version", "te_version", "gpu_capability", "env"} <= set(data["facts"])
    target = tmp_path / "target.json"
    target.write_text(out, encoding="utf-8")
    facts = resolve_target(str(target))
    assert facts.is_known and facts.torch_version == data["facts"]["torch_version"]


def test_target_env_is_the_job_environment_under_the_run_file() -> None:
    facts = facts_from_pairs("te=2.12,torch=2.11")
    facts = EnvironmentFacts(**{**{f: getattr(facts, f) for f in ("te_version", "torch_version")},
                                "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
    report = check({"transformer": {"cuda_graph_impl": "transformer_engine"}}, facts=facts)
    assert "GD301" in report.codes()
    report = check({"transformer": {"cuda_graph_impl": "transformer_engine"}, "env": {"NCCL_GRAPH_REGISTER": "0"}},
                   facts=facts)
    assert "GD301" not in report.codes()


@pytest.mark.parametrize(("target", "severity"), [(None, "info"), ("torch=2.11", "info"), ("local", "info")])
def test_gd303_warns_only_where_upgrading_torch_would_fix_it(tmp_path: Path, target: str | None,
                                                              severity: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(FULL_ITERATION, encoding="utf-8")
    args = ["check", str(path), "--output-format", "json", *(["--target", target] if target else [])]
    code, out, _ = invoke(*args)
    unchecked = {f["code"]: "info" for f in json.loads(out)["not_checked"]}
    assert code == 0 and {**unchecked, **codes(out)}["GD303"] == severity


def test_gd303_is_a_warning_once_a_torch_release_has_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphdoctor.checks.gd3xx_env as env_rules

    monkeypatch.setattr(env_rules, "STALE_CAPTURE_OVERRIDE_SINCE", "2.12")
    report = check({"transformer": {"cuda_graph_impl": "full_iteration"}},
                   facts=EnvironmentFacts(torch_version="2.11.0", torch_has_stale_capture_override=False))
    (finding,) = [f for f in report.findings if f.code == "GD303"]
    assert finding.severity.value == "warning" and "upgrade torch to >= 2.12" in finding.fix


def test_env_text_summary() -> None:
    code, out, _ = invoke("env")
    assert code == 0 and out.startswith("torch_version: ") and "te_version: " in out
