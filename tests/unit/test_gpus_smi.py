"""What graphdoctor reads from nvidia-smi (graphdoctor/parent/gpus.py), through a stand-in `nvidia-smi` on PATH
that prints what the real one prints for each query: the visible GPUs, one GPU's memory and its processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.parent.gpus import gpu_memory, gpu_processes, visible_gpus

SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,memory.total,memory.used*) printf '0, 143771, 1024\\n1, 143771, 70000\\n' ;;
  *--id=1*--query-gpu=memory.total,memory.used*) printf '143771, 70000\\n' ;;
  *--id=1*--query-compute-apps=pid,used_memory*) printf '4242, 60000\\n4343, 10000\\n' ;;
  *--id=9*) echo "No devices were found" ; exit 6 ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "nvidia-smi"
    tool.write_text(SMI)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.usefixtures("smi")
def test_gpus_memory_and_processes_as_nvidia_smi_prints_them(monkeypatch: pytest.MonkeyPatch) -> None:
    mib = 1 << 20
    assert [(g.device_id, g.total_bytes, g.used_bytes) for g in visible_gpus()] == [
        ("0", 143771 * mib, 1024 * mib), ("1", 143771 * mib, 70000 * mib)]
    assert gpu_memory("1") == (143771 * mib, 70000 * mib)
    assert gpu_processes("1") == [(4242, 60000 * mib), (4343, 10000 * mib)]
    assert gpu_memory("9") is None and gpu_processes("9") == []  # a GPU nvidia-smi does not know
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,GPU-abc")
    assert [(g.device_id, g.total_bytes) for g in visible_gpus()] == [("1", 143771 * mib), ("GPU-abc", 0)]


def test_without_nvidia_smi_nothing_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_gpus() == [] and gpu_memory("0") is None and gpu_processes("0") == []
