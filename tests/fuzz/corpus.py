"""The committed corpus of the specific hostile shapes issue 19 found, and the large ones built at test time.

    python tests/fuzz/corpus.py        # (re)writes tests/fuzz/corpus/ (small files only, deterministic)

CASES lists every shape: (command, name, how to run it, the outcome it must have). Small inputs
are files in tests/fuzz/corpus/; large or special ones (gzip bombs, 50k-deep nesting, FIFOs,
/dev/zero) are made under the test's temporary directory by BUILDERS.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
REPO = Path(__file__).resolve().parents[2]
_FRAME = {"filename": "/w/train.py", "line": 31, "name": "forward"}


def _snapshot(**block_overrides: object) -> dict:
    block = {"address": 1 << 40, "size": 512, "requested_size": 500, "state": "active_allocated", "frames": [_FRAME]}
    block.update(block_overrides)
    return {"segments": [{"device": 0, "address": 1 << 40, "total_size": 1 << 21, "allocated_size": 512, "stream": 0,
                          "segment_type": "large", "segment_pool_id": (0, 0), "blocks": [block]}],
            "device_traces": [[]]}


def _shared_refs(num_segments: int, num_blocks: int, num_frames: int) -> bytes:
    """One segment referenced num_segments times, holding one block num_blocks times, holding one
    frame num_frames times: a few bytes per reference, num_segments * num_blocks * num_frames visits."""
    block = {"address": 1 << 40, "size": 512, "state": "active_allocated", "frames": [_FRAME] * num_frames}
    segment = {**_snapshot()["segments"][0], "blocks": [block] * num_blocks}
    return pickle.dumps({"segments": [segment] * num_segments, "device_traces": [[]]}, protocol=4)


def _trace(**overrides: object) -> dict:
    event = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10.0, "dur": 2.0,
             "args": {"correlation": 7, "External id": 1}}
    event.update(overrides)
    return {"traceEvents": [event, {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 12.0,
                                    "dur": 1.0, "args": {"correlation": 7}}]}


def _billion_laughs() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=False):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("transformer:\n  num_layers: *i")
    return "\n".join(lines) + "\n"


SMALL_FILES: dict[str, bytes] = {
    # snapshots
    "memo_index.pickle": b"\x80\x04r\x00\x00\x00\x10N.",
    "memo_put_text.pickle": b"Np268435456\n.",
    "shared_refs_small.pickle": _shared_refs(200, 200, 200),
    "frame_line_str.pickle": pickle.dumps(_snapshot(frames=[{**_FRAME, "line": "31"}]), protocol=4),
    "address_str.pickle": pickle.dumps(_snapshot(address="0x7f00"), protocol=4),
    "size_nan.pickle": pickle.dumps(_snapshot(size=float("nan")), protocol=4),
    "size_inf.pickle": pickle.dumps(_snapshot(size=float("inf")), protocol=4),
    "size_10e400.pickle": pickle.dumps(_snapshot(size=10**400), protocol=4),
    "stream_list.pickle": pickle.dumps({**_snapshot(), "segments": [{**_snapshot()["segments"][0], "stream": [1]}]}),
    "frame_name_nested.pickle": pickle.dumps(_snapshot(frames=[{**_FRAME, "name": [[[[["x"]]]]]}]), protocol=4),
    "osc_frame_name.pickle": pickle.dumps(_snapshot(frames=[{**_FRAME, "name": "\x1b]0;owned\x07f\x1b[2J"}]), protocol=4),
    "reduce_os_system.pickle": b"\x80\x04cos\nsystem\n\x8c\x04true\x85R.",
    "inst_obj.pickle": b"(ios\nsystem\nS'true'\n.",
    "ext_code.pickle": b"\x80\x02\x82\x01.",
    "persistent_id.pickle": b"\x80\x02\x8c\x01xQ.",
    "reduce_gzipped.pickle.gz": gzip.compress(b"\x80\x04cos\nsystem\n\x8c\x04true\x85R.", mtime=0),
    "empty.pickle": b"",
    # traces
    "trace_missing_ts.json": json.dumps(_trace(ts=None)).replace('"ts": null, ', "").encode(),
    "trace_dur_str.json": json.dumps(_trace(dur="abc")).encode(),
    "trace_dur_nan.json": json.dumps(_trace(dur=float("nan"))).encode(),
    "trace_dur_1e400.json": json.dumps(_trace()).replace('"dur": 2.0', '"dur": 1e400').encode(),
    "trace_top_list.json": b"[1, 2, 3]",
    "trace_name_int.json": json.dumps(_trace(name=5)).encode(),
    "trace_cat_list.json": json.dumps(_trace(cat=["cuda_runtime"])).encode(),
    "trace_args_list.json": json.dumps(_trace(args=[1])).encode(),
    "trace_correlation_list.json": json.dumps(_trace(args={"correlation": [7]})).encode(),
    "trace_osc_name.json": json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "ts": 1, "dur": 5,
                                                        "name": "ProfilerStep#\x1b]0;owned\x07"}]}).encode(),
    # run files
    "run_num_layers_four.yaml": b'transformer:\n  num_layers: "four"\n',
    "run_num_layers_negative.yaml": b"transformer:\n  num_layers: -4\n",
    "run_dropout_nan.yaml": b"transformer:\n  hidden_dropout: .nan\n",
    "run_duplicate_key.yaml": b"transformer:\n  num_layers: 4\n  num_layers: 8\n",
    "run_billion_laughs.yaml": _billion_laughs().encode(),
    "run_int_5000_digits.yaml": b"transformer:\n  num_layers: " + b"9" * 5000 + b"\n",
    "run_offload_nested.yaml": b"transformer:\n  fine_grained_activation_offloading: true\n  offload_modules: [[1]]\n",
    "run_recompute_nested.yaml": b"transformer:\n  recompute_granularity: selective\n  recompute_modules: [[1]]\n",
    "run_python_tag.yaml": b'transformer: !!python/object/apply:os.system ["true"]\n',
    "run_steps_inf.yaml": b"run:\n  steps: .inf\n",
    # launch-line files
    "launch_moe_freq_int_plus.txt": b'--num-experts 8 --moe-layer-freq "[0]*3+1"\n',
    "launch_moe_freq_huge.txt": b'--num-experts 8 --moe-layer-freq "[1]*1000000000"\n',
    "launch_moe_freq_parens.txt": b"--moe-layer-freq " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n",
    "launch_num_layers_nan.txt": b"--num-layers nan --hidden-dropout nan\n",
}


def _deep_pickle(depth: int) -> bytes:
    return b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."


def _gzip_zeros(num_bytes: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 22)
    parts = [packer.compress(chunk) for _ in range(num_bytes // len(chunk))]
    return b"".join([*parts, packer.flush()])


def _gzip_json_bomb(num_bytes: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 22)
    parts = [packer.compress(b'{"traceEvents": [')] + [packer.compress(chunk) for _ in range(num_bytes // len(chunk))]
    return b"".join([*parts, packer.compress(b"]}"), packer.flush()])


def _fifo(directory: Path, name: str) -> Path:
    path = directory / name
    os.mkfifo(path)
    return path


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "gzip_bomb.pickle.gz": lambda d: _write(d / "gzip_bomb.pickle.gz", _gzip_zeros(256 << 20)),
    "gzip_bomb.json.gz": lambda d: _write(d / "gzip_bomb.json.gz", _gzip_json_bomb(256 << 20)),
    "deep_50k.pickle": lambda d: _write(d / "deep_50k.pickle", _deep_pickle(50_000)),
    "shared_refs_80k.pickle": lambda d: _write(d / "shared_refs_80k.pickle", _shared_refs(20000, 5000, 1)),
    "deep_50k_list.yaml": lambda d: _write(d / "deep_50k_list.yaml",
                                           b"transformer:\n  recompute_modules: " + b"[" * 50_000 + b"]" * 50_000),
    "fifo": lambda d: _fifo(d, "fifo"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@dataclass(frozen=True)
class Case:
    """One corpus shape: run `graphdoctor argv` ({IN} is the input) and expect `kind`."""

    command: str
    input_name: str
    argv: tuple[str, ...]
    kind: str = "clean error"
    needle: str = ""
    """A substring the one stderr line must contain (clean errors)."""


def _cases() -> list[Case]:
    cases = []
    for name in SMALL_FILES:
        if name.endswith((".pickle", ".pickle.gz")):
            kind = "accepted" if name.startswith("osc_") else "clean error"
            cases.append(Case("triage", name, ("triage", "{IN}", "--trace"), kind))
        elif name.startswith("trace_"):
            kind = "accepted" if "osc" in name else "clean error"
            cases.append(Case("count", name, ("count", "--trace", "{IN}"), kind))
        elif name.startswith("run_"):
            cases.append(Case("check", name, ("check", "--config", "{IN}")))
            cases.append(Case("diff", name, ("diff", "--config", "{IN}")))
        elif name.startswith("launch_"):
            cases.append(Case("check", name, ("check", "--megatron-args", "@{IN}")))
    cases += [
        Case("triage", "gzip_bomb.pickle.gz", ("triage", "{IN}"), needle="exceeds the cap"),
        Case("triage", "deep_50k.pickle", ("triage", "{IN}", "--trace")),
        Case("triage", "shared_refs_80k.pickle", ("triage", "{IN}", "--trace"), needle="expands to more than"),
        Case("triage", "fifo", ("triage", "{IN}"), needle="not a regular file"),
        Case("triage", "/dev/zero", ("triage", "{IN}"), needle="not a regular file"),
        Case("triage", ".", ("triage", "{IN}"), needle="is a directory"),
        Case("triage", "osc_frame_name.pickle", ("triage", "{IN}", "--json", "{IN}"), needle="refusing to overwrite"),
        Case("triage", "osc_frame_name.pickle", ("triage", "{IN}", "--html", "{IN}"), needle="refusing to overwrite"),
        Case("count", "gzip_bomb.json.gz", ("count", "--trace", "{IN}"), needle="exceeds the cap"),
        Case("count", "fifo", ("count", "--trace", "{IN}"), needle="not a regular file"),
        Case("count", "/dev/zero", ("count", "--trace", "{IN}"), needle="not a regular file"),
        Case("count", "trace_osc_name.json", ("count", "--trace", "{IN}", "--json", "{IN}"), needle="refusing to overwrite"),
        Case("check", "fifo", ("check", "--config", "{IN}"), needle="not a regular file"),
        Case("check", "fifo", ("check", "--megatron-args", "@{IN}"), needle="not a regular file"),
        Case("check", "/dev/zero", ("check", "--config", "{IN}"), needle="not a regular file"),
        Case("check", "deep_50k_list.yaml", ("check", "--config", "{IN}"), needle="nested too deeply"),
        Case("check", "-", ("check", "--megatron-args", "--moe-layer-freq '[0]*3+1'"), needle="--moe-layer-freq"),
        Case("check", "-", ("check", "--megatron-args", "--moe-layer-freq [1]*1000000000"), needle="--moe-layer-freq"),
        Case("check", "-", ("check", "--nope"), needle="No such option"),
        Case("triage", "-", ("triage",), needle="Missing argument"),
        Case("diff", "fifo", ("diff", "--config", "{IN}"), needle="not a regular file"),
        Case("diff", "/dev/zero", ("diff", "--config", "{IN}"), needle="not a regular file"),
        Case("diff", "deep_50k_list.yaml", ("diff", "--config", "{IN}"), needle="nested too deeply"),
    ]
    return cases


CASES = _cases()


def main() -> None:
    """Write SMALL_FILES into tests/fuzz/corpus/ (the committed corpus)."""
    CORPUS.mkdir(exist_ok=True)
    for name, data in SMALL_FILES.items():
        (CORPUS / name).write_bytes(data)
    print(f"wrote {len(SMALL_FILES)} files to {CORPUS} ({sum(map(len, SMALL_FILES.values()))} bytes)")


if __name__ == "__main__":
    main()

__all__ = ["BUILDERS", "CASES", "CORPUS", "SMALL_FILES", "Case"]
