"""Several graphdoctor runs on one GPU at once (issue 45), on the real GPU: six diffs started together give the
verdict, module and line each gives alone (tests/benchmarks/concurrent_diffs.py, both modes in one run, their
walls side by side), and a diff whose child meets a GPU whose memory another process holds is environment-failed
after one retry, exit code 2, with no traceback; children that ran out of memory together, from an estimate that fell
short, run again alone and give the verdicts of a true plan.

Set GD_REPORT_DIR to keep the benchmark's JSON and the forced failure's report.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "64",
         "--vocab-size", "512", "--steps", "6", "--cuda-graph-warmup-steps", "2", "--no-memory", "--no-launches"]


def _keep(name: str, text: str) -> None:
    keep = os.environ.get("GD_REPORT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        Path(keep, name).write_text(text)


def test_six_diffs_at_once_give_what_each_gives_alone(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("concurrent_diffs", REPO / "tests/benchmarks/concurrent_diffs.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    modes = {mode: bench.run_mode(mode, tmp_path, 420.0) for mode in ("together", "alone")}
    _keep("h200_concurrent_diffs.json", json.dumps(modes, indent=1))
    alone = {c["case"]: c for c in modes["alone"]["cases"]}
    for case in modes["together"]["cases"]:
        solo = alone[case["case"]]
        assert case["rows"] and case["rows"] == solo["rows"], (case, solo)
        assert case["exit_code"] == solo["exit_code"], (case, solo)
        assert all(r["verdict"] != "environment-failed" for r in case["rows"]), case
    verdicts = {c["case"]: {r["verdict"] for r in c["rows"]} for c in modes["alone"]["cases"]}
    assert verdicts["capture_failed_item"] == {"capture-failed"}
    assert verdicts["frozen_rng_host_mask"] == {"frozen-rng"}
    assert verdicts["numeric_reassigned_scale"] == {"numeric-divergence"}
    print(f"six diffs together {modes['together']['wall_s']} s, one after another {modes['alone']['wall_s']} s")


HOG = """
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
held = torch.empty(max(0, free - int(sys.argv[1])), dtype=torch.uint8, device="cuda")
print("held", held.numel(), flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_gpu_whose_memory_another_process_holds_is_environment_failed_after_one_retry(tmp_path: Path) -> None:
    """Another user's process holds all but 1.5 GiB of the GPU: the eager reference's set-up runs out of memory
    (or NCCL's does), is retried once when the diff's other child has finished, fails again, and the diff says
    environment-failed with exit code 2, never reference-failed, and prints no traceback."""
    hog_err = tmp_path / "hog.stderr"
    with hog_err.open("w") as err:
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(3 << 29), "400"], stdout=subprocess.PIPE, stderr=err,
                               text=True)
    try:
        assert hog.stdout is not None
        held = hog.stdout.readline()
        _keep("h200_environment_hog.txt", held + hog_err.read_text())
        assert held.startswith("held"), (held, hog.poll(), hog_err.read_text()[-2000:])
        report = tmp_path / "report.json"
        argv = [sys.executable, "-m", "graphdoctor", "diff", *SMALL, "--impl", "full_iteration", "--dropout", "0",
                "--hidden-size", "4096", "--num-attention-heads", "32", "--vocab-size", "128256", "--seq-length",
                "4096", "--timeout", "200", "--json", str(report)]
        began = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=REPO)
    finally:
        hog.kill()
        hog.wait()
        if hog.stdout is not None:
            hog.stdout.close()
    said = proc.stdout + proc.stderr
    _keep("h200_environment_failed.txt", said)
    assert proc.returncode == 2, said
    assert "Traceback" not in said
    data = json.loads(report.read_text())
    _keep("h200_environment_failed.json", report.read_text())
    assert data["reference"]["status"] == "environment-failed", data["reference"]
    assert [r["verdict"] for r in data["impls"]] == ["environment-failed"]
    assert "retried" in (data["reference"]["diagnosis"]["meaning"] or "")
    assert "runs again alone, once this run's children started before it have finished" in said
    print(f"environment-failed in {time.monotonic() - began:.0f} s: {data['reference']['diagnosis']['message'][:120]}")


SIZE_054B = dict(num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=2048, micro_batch_size=2,
                 dtype="bf16", vocab_size=32000, impls=("local", "full_iteration"), timeout_s=300.0)
"""The 0.54 B size of tests/benchmarks/diff_cost.py, with the diff's defaults otherwise (dropout 0.1: seven
children, about 21-27 GiB each)."""


def test_children_out_of_memory_together_run_again_alone_and_give_a_true_plans_rows(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch
                                                                                    ) -> None:
    """graphdoctor's first estimate of a child's memory (graphdoctor.parent.gpus.child_bytes) is forced to 1 GiB,
    so the 0.54 B diff starts its children together on one GPU, more than it holds, and some run out of memory
    (at set-up or at a later step). Each of those runs once more, alone, and the diff gives the rows and exit code of
    the same diff planned from the true estimate: no environment-failed or reference-failed row."""
    from kept import diff

    import graphdoctor.parent.children as children
    import graphdoctor.parent.gpus as gpus
    from graphdoctor.config import DiffConfig
    from graphdoctor.diff import DiffReport
    from graphdoctor.report.diff import render_text

    config = DiffConfig(**SIZE_054B)  # type: ignore[arg-type]
    began = time.monotonic()
    true_plan = diff(config, "054b_true_estimate", workdir=tmp_path / "true")
    true_s = time.monotonic() - began
    monkeypatch.setattr(gpus, "child_bytes", lambda *args, **kwargs: 1 << 30)
    monkeypatch.setattr(children, "child_bytes", lambda *args, **kwargs: 1 << 30)
    began = time.monotonic()
    forced = diff(config, "054b_estimate_1gib", workdir=tmp_path / "forced")
    forced_s = time.monotonic() - began
    retried = sorted(p.name for p in (tmp_path / "forced").rglob("events-*-attempt10.jsonl"))

    def rows(report: DiffReport) -> list[tuple[str, str, bool]]:
        return [(r.impl, r.verdict.value, r.passed) for r in report.results]

    print(f"true estimate: {true_plan.jobs!r}, {true_s:.1f} s, rows {rows(true_plan)}")
    print(f"1 GiB estimate: {forced.jobs!r}, {forced_s:.1f} s, rows {rows(forced)}; retried alone: {retried}")
    print(render_text(forced))
    assert retried, "no child ran out of memory: the forced plan did not crowd the GPU"
    assert forced.timeline is not None
    assert {child for child, _ in forced.timeline.retried} == {
        name.removeprefix("events-").removesuffix("-attempt10.jsonl") for name in retried}
    assert f"{len(retried)} ran again alone after the machine failed" in render_text(forced)
    assert true_plan.timeline is not None and not true_plan.timeline.retried
    assert rows(forced) == rows(true_plan)
    assert forced.exit_code() == true_plan.exit_code()
    assert forced.reference.status == "ok"
    assert all(r.verdict.value not in ("environment-failed", "reference-failed") for r in forced.results)


PLUGIN_TESTS = """\
import pytest

SMALL = dict(num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=64, vocab_size=512, steps=6,
             cuda_graph_warmup_steps=2, timeout_s=300.0, memory=False, launches=False, dropout=0.0)


@pytest.mark.gpu
def test_clean_local(graphdoctor_diff):
    assert graphdoctor_diff(impls=("local",), **SMALL).exit_code() == 0


@pytest.mark.gpu
def test_clean_full_iteration(graphdoctor_diff):
    assert graphdoctor_diff(impls=("full_iteration",), **SMALL).exit_code() == 0


@pytest.mark.gpu
def test_capture_failed(graphdoctor_diff):
    assert graphdoctor_diff(impls=("local",), layer_spec="fixtures.planted.item_mlp:layer_spec", **SMALL).exit_code() == 0


@pytest.mark.gpu
def test_numeric(graphdoctor_diff):
    assert graphdoctor_diff(impls=("local",), layer_spec="fixtures.planted.reassigned_scale:layer_spec",
                            **SMALL).exit_code() == 0
"""


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None,
                    reason="pytest-xdist is not installed here (carry its and execnet's wheels in .whl)")
def test_the_plugin_under_xdist_gives_the_outcomes_of_one_process(tmp_path: Path) -> None:
    (tmp_path / "test_four.py").write_text(PLUGIN_TESTS)
    outcomes = {}
    for workers in ("0", "4"):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-n", workers,
                               str(tmp_path / "test_four.py"), f"--rootdir={tmp_path}"],
                              capture_output=True, text=True, timeout=900, check=False, cwd=REPO)
        _keep(f"h200_plugin_xdist_n{workers}.txt", proc.stdout + proc.stderr)
        lines = [x for x in proc.stdout.splitlines() if x.startswith(("PASSED ", "FAILED "))]
        outcomes[workers] = sorted(x.split(" - ")[0] for x in lines)
        assert any(x.startswith("4 diffs: ") for x in proc.stdout.splitlines()), proc.stdout[-2000:]
    assert outcomes["4"] == outcomes["0"] and len(outcomes["0"]) == 4, outcomes
    assert sum(x.startswith("PASSED") for x in outcomes["0"]) == 2, outcomes
