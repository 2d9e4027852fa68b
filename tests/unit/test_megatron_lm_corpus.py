"""`check` over Megatron-LM's own CUDA-graph configurations (fixtures/megatron_lm: its functional tests and example
launch scripts) reports no finding Megatron would not agree with.

What is left, and why it is right:
- GD302 and GD307 (info) on the two Nemotron-3 release tests: CUDA_DEVICE_MAX_CONNECTIONS=32 and
  NVTE_ALLOW_NONDETERMINISTIC_ALGO unset are the release run's choices; they only mean a graph-vs-eager diff of that
  environment cannot be bitwise.
- GD105 and GD109 (info) on examples/inference/run_inference_server.sh: `--cuda-graph-scope full_iteration_inference`
  is deprecated, as Megatron-LM's own warning says when it rewrites it to --inference-cuda-graph-scope block.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.rules import check
from graphdoctor.rules.finding import Severity

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "megatron_lm"
TESTS = sorted((CORPUS / "functional_tests").glob("*.yaml"))
EXAMPLES = sorted((CORPUS / "examples").glob("*.sh"))
LEFT: dict[str, set[str]] = {
    "nemotron3_super_release_gb200.yaml": {"GD302", "GD307"},
    "nemotron3_super_release_gb200_sm.yaml": {"GD302", "GD307"},
    "inference_run_inference_server.sh": {"GD105", "GD109"},
}
"""The findings left (all info; the module doc says why each is right)."""


def _report(path: Path):  # type: ignore[no-untyped-def]
    return check(path) if path.suffix == ".yaml" else check(None, f"@{path}")


def test_the_corpus_is_all_there() -> None:
    assert len(TESTS) == 27 and len(EXAMPLES) == 6


@pytest.mark.parametrize("path", [*TESTS, *EXAMPLES], ids=lambda p: p.name)
def test_no_finding_megatron_would_not_agree_with(path: Path) -> None:
    report = _report(path)
    assert set(report.codes()) == LEFT.get(path.name, set()), [f.message for f in report.findings]
    assert all(f.severity is Severity.INFO for f in report.findings)


def test_what_megatron_sets_itself_is_a_note() -> None:
    """The scoped-graph MoE test gives TE graphs and no --te-rng-tracker: validate_args turns it on, so GD116 does
    not report and the note quotes Megatron."""
    report = _report(CORPUS / "functional_tests" / "gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph.yaml")
    assert "GD116" not in report.codes()
    assert "Megatron-LM: te_rng_tracker is not enabled, enabling it for CUDA graphs." in report.notes


def test_inference_and_rollout_graphs_are_not_judged_as_training_graphs() -> None:
    inference = _report(CORPUS / "functional_tests" / "gpt_static_inference_tp1_pp1_583m_cudagraphs.yaml")
    assert any(n.startswith("an inference script (MODE: inference) captures inference graphs only") for n in inference.notes)
    rollouts = _report(CORPUS / "functional_tests" / "gpt_grpo_tp4_pp1_dp2_8b_throughput.yaml")
    assert any(n.startswith("train_rl.py without --rl-training-cuda-graphs") for n in rollouts.notes)
    trained = _report(CORPUS / "functional_tests" / "gpt_grpo_tp4_pp1_dp2_8b_cudagraphs_throughput.yaml")
    assert not any("do not apply" in n for n in trained.notes)  # --rl-training-cuda-graphs: every rule judges it


def test_repeated_model_args_are_read_as_the_harness_passes_them() -> None:
    report = _report(CORPUS / "functional_tests" / "gpt_grpo_tp1tp2_pp1_dp8_583m_throughputtest.yaml")
    assert any(n.startswith("MODEL_ARGS repeats --timing-log-level (lines 22 and 51)") for n in report.notes)


def test_a_gpu_dependent_refusal_is_judged_for_the_gpu_it_holds_on() -> None:
    """Megatron-LM asks CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor parallelism on Hopper only: the GB200 release
    test passes for Blackwell, and names Hopper's refusal; for a Hopper target it is GD131."""
    from graphdoctor.rules.target import resolve_target

    path = CORPUS / "functional_tests" / "nemotron3_super_release_gb200.yaml"
    unknown = _report(path)
    assert any(n.startswith("judged for a Blackwell GPU (sm_100): on Hopper (sm_90)") for n in unknown.notes)
    hopper = check(path, facts=resolve_target(None, "sm_90"))
    gd131 = [f for f in hopper.findings if f.code == "GD131"]
    assert gd131 and "CUDA_DEVICE_MAX_CONNECTIONS to 1" in gd131[0].message
