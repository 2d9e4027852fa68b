"""recorder + analyze_run on a real GPU: a captured graph is 'ok', a planted leak is 'growth'."""

from __future__ import annotations

import pytest

from graphdoctor.memory.leaks import analyze_run

pytestmark = pytest.mark.gpu

NUM_REPLAY_STEPS = 8


def _graphed_run(*, leak: bool) -> dict:
    import torch

    from graphdoctor.memory import recorder as rec

    assert rec.history_supported()
    rec.reset_peaks()
    rec.start_history(5000)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Dropout(0.1), torch.nn.Linear(512, 512)).cuda()
        static_x = torch.randn(32, 512, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        rec.set_phase("warmup")
        with torch.cuda.stream(side):
            for _ in range(2):
                model(static_x).sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        before = rec.take_snapshot()
        rec.set_phase("capture")
        graph = torch.cuda.CUDAGraph()
        model.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
            model(static_x).sum().backward()
        after_capture = rec.take_snapshot()
        kept = []
        for step in range(NUM_REPLAY_STEPS):
            rec.set_phase(f"replay:{step}")
            static_x.copy_(torch.randn(32, 512, device="cuda"))
            graph.replay()
            if leak:
                kept.append(static_x.clone())
        rec.set_phase("")
        after = rec.take_snapshot()
        stats = rec.pool_bytes_from_stats()
    finally:
        rec.stop_history()
    report = analyze_run(before, after_capture, after, num_replay_steps=NUM_REPLAY_STEPS,
                         eager_peak_allocated_bytes=None, eager_peak_reserved_bytes=None,
                         peak_allocated_bytes=stats["peak_allocated_bytes"],
                         peak_reserved_bytes=stats["peak_reserved_bytes"])
    del kept
    return report.to_dict()


def test_clean_graph_is_ok() -> None:
    doc = _graphed_run(leak=False)
    assert doc["verdict"] == "ok", doc["summary"]
    assert doc["graph_pool_reserved_bytes"] > 0
    assert doc["phase_tags_found"]


def test_planted_leak_is_growth() -> None:
    doc = _graphed_run(leak=True)
    assert doc["verdict"] == "growth", doc["summary"]
    assert doc["unfreed_replay_sites"][0]["is_suspect"]
    assert "test_memory_gpu.py" in doc["unfreed_replay_sites"][0]["site"]
