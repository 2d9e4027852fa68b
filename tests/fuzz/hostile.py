"""Hostile inputs of each kind graphdoctor reads, as hypothesis strategies over real shapes.

Each strategy starts from a well-formed document of its kind (a snapshot shaped like torch's, a
trace cut from the recorded synthetic Kineto trace, a run file, a launch line, a saved diff
report) and breaks it the ways the issue found and more: wrong types at every field graphdoctor
reads, NaN and infinity, huge integers, deep nesting, shared references, truncation, byte flips,
gzip around it, control characters in names. Everything is small: large shapes are built at
test time by corpus.py.
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
SYNTHETIC_TRACE = REPO / "fixtures" / "data" / "launches" / "synthetic_kineto_trace.json"
DIFF_REPORTS = sorted((REPO / "fixtures" / "data" / "diff").glob("*.json"))

_FRAME = {"filename": "/w/train.py", "line": 31, "name": "forward"}
BASE_SNAPSHOT: dict[str, Any] = {
    "segments": [{
        "device": 0, "address": 1 << 40, "total_size": 2 << 20, "allocated_size": 512, "stream": 0,
        "segment_type": "large", "segment_pool_id": (0, 0),
        "blocks": [
            {"address": 1 << 40, "size": 512, "requested_size": 500, "state": "active_allocated", "frames": [_FRAME]},
            {"address": (1 << 40) + 512, "size": (2 << 20) - 512, "state": "inactive", "frames": []},
        ],
    }],
    "device_traces": [[
        {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 1, "frames": [_FRAME],
         "user_metadata": "replay:1"},
        {"action": "free_requested", "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 2, "frames": []},
    ]],
    "allocator_settings": {},
}
SNAPSHOT_PATHS: list[tuple[Any, ...]] = [
    ("segments",), ("segments", 0), ("segments", 0, "address"), ("segments", 0, "total_size"),
    ("segments", 0, "allocated_size"), ("segments", 0, "stream"), ("segments", 0, "device"),
    ("segments", 0, "segment_type"), ("segments", 0, "segment_pool_id"), ("segments", 0, "blocks"),
    ("segments", 0, "blocks", 0), ("segments", 0, "blocks", 0, "size"), ("segments", 0, "blocks", 0, "address"),
    ("segments", 0, "blocks", 0, "requested_size"), ("segments", 0, "blocks", 0, "state"),
    ("segments", 0, "blocks", 0, "frames"), ("segments", 0, "blocks", 0, "frames", 0),
    ("segments", 0, "blocks", 0, "frames", 0, "line"), ("segments", 0, "blocks", 0, "frames", 0, "name"),
    ("segments", 0, "blocks", 0, "frames", 0, "filename"), ("device_traces",), ("device_traces", 0),
    ("device_traces", 0, 0), ("device_traces", 0, 0, "action"), ("device_traces", 0, 0, "addr"),
    ("device_traces", 0, 0, "size"), ("device_traces", 0, 0, "stream"), ("device_traces", 0, 0, "time_us"),
    ("device_traces", 0, 0, "frames"), ("device_traces", 0, 0, "user_metadata"), ("device_traces", 0, 0, "frames", 0),
    ("allocator_settings",),
]


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _shared(depth: int) -> Any:
    value: Any = [1]
    for _ in range(depth):
        value = [value, value]
    return value


ESCAPES = ["\x1b]0;owned\x07", "\x1b[2J", "a\rb", "\x00", "\u202e", "\x9b31m"]
_plain_hostile = st.one_of(
    st.sampled_from([None, True, False, -1, 0, 2**63, 2**64, 10**400, -(10**400), float("nan"), float("inf"),
                     -float("inf"), 1e308, "", "big", "0x10", b"bytes", (), (1, 2, 3), [], {}, [[1]], {"a": [1]}]
                    + ESCAPES),
    st.integers(), st.floats(), st.text(max_size=12), st.binary(max_size=12),
    st.builds(_nested, st.integers(1, 3000)),
    st.lists(st.integers(), max_size=4), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)
hostile_values = st.one_of(_plain_hostile, st.builds(_shared, st.integers(1, 90)))
"""Values to put where a field should be; shared references only where the format has them
(pickle memo, YAML aliases), since JSON would spell them out."""


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    target = doc
    for key in path[:-1]:
        target = target[key]
    if delete and isinstance(target, dict):
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value


def _mutated(base: Any, paths: list[tuple[Any, ...]], changes: list[tuple[int, Any, bool]]) -> Any:
    doc = copy.deepcopy(base)
    for index, value, delete in changes:
        try:
            _set(doc, paths[index % len(paths)], value, delete)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced the container on this path
    return doc


def _damage(data: bytes, how: str, cut: int) -> bytes:
    if how == "gzip":
        return gzip.compress(data, mtime=0)
    if how == "truncate" and data:
        return data[: cut % len(data)]
    if how == "flip" and data:
        i = cut % len(data)
        return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
    if how == "gzip-truncate":
        packed = gzip.compress(data, mtime=0)
        return packed[: max(2, cut % len(packed))]
    return data


_damages = st.sampled_from(["none", "none", "gzip", "truncate", "flip", "gzip-truncate"])
_changes = st.lists(st.tuples(st.integers(0, 1000), hostile_values, st.booleans()), min_size=1, max_size=3)


def _pickle(doc: Any, protocol: int) -> bytes:
    try:
        return pickle.dumps(doc, protocol=protocol)
    except RecursionError:  # deeper than the pickler recurses: spell the nesting in opcodes
        return b"\x80\x04" + b"]" * 3000 + b"a" * 2999 + b"."


_opcode_soup = st.lists(st.sampled_from([
    b"\x80\x04", b"\x80\x02", b"]", b"}", b"(", b"e", b"u", b"a", b"s", b"t", b"\x94", b"q\x00", b"h\x00",
    b"j\xff\xff\xff\x7f", b"r\x00\x00\x00\x10", b"p268435456\n", b"g0\n", b"N", b"K\x01", b"J\xff\xff\xff\xff",
    b"\x8c\x08segments", b"\x8c\x05frame", b"X\xff\xff\xff\x7f", b"\x8a\x08" + b"\xff" * 8, b"\x95\x10\0\0\0\0\0\0\0",
    b"cos\nsystem\n", b"\x93", b"R", b"Q", b"\x82\x01", b".", b"0", b"2", b"1",
]), max_size=40).map(b"".join)


@st.composite
def snapshot_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    """(label, file bytes): a broken snapshot pickle."""
    kind = draw(st.sampled_from(["fields", "fields", "fields", "whole", "soup", "raw"]))
    if kind == "fields":
        doc = _mutated(BASE_SNAPSHOT, SNAPSHOT_PATHS, draw(_changes))
        data = _pickle(doc, draw(st.integers(0, 5)))
    elif kind == "whole":
        data = _pickle(draw(hostile_values), draw(st.integers(0, 5)))
    elif kind == "soup":
        data = draw(_opcode_soup)
    else:
        data = draw(st.binary(max_size=64))
    how = draw(_damages)
    return f"{kind}/{how}", _damage(data, how, draw(st.integers(0, 1 << 16)))


def _trace_base() -> dict[str, Any]:
    document = json.loads(SYNTHETIC_TRACE.read_text(encoding="utf-8"))
    keep = ("cuda_runtime", "kernel", "user_annotation", "cpu_op", "gpu_memcpy", "cuda_driver")
    seen: dict[str, int] = {}
    events = []
    for event in document["traceEvents"]:
        cat = event.get("cat")
        if cat in keep and seen.get(cat, 0) < 2:
            seen[cat] = seen.get(cat, 0) + 1
            events.append(event)
    return {"traceEvents": events}


BASE_TRACE = _trace_base()
TRACE_PATHS: list[tuple[Any, ...]] = [("traceEvents",)] + [
    ("traceEvents", i, key) for i in range(len(BASE_TRACE["traceEvents"]))
    for key in ("ts", "dur", "name", "cat", "ph", "args", "tid")
] + [("traceEvents", i) for i in range(len(BASE_TRACE["traceEvents"]))] + [
    ("traceEvents", i, "args", key) for i in range(len(BASE_TRACE["traceEvents"])) for key in ("correlation", "External id")
]
_json_values = _plain_hostile.filter(lambda v: not isinstance(v, bytes | tuple)).map(
    lambda v: v if not isinstance(v, int) or abs(v) < 10**300 else str(v))


def _json_text(doc: Any) -> bytes:
    try:
        return json.dumps(doc).encode()  # bare NaN / Infinity on purpose: strict readers must refuse them
    except (ValueError, RecursionError):
        return b"[" * 5000


@st.composite
def trace_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    """(label, file bytes): a broken Chrome trace."""
    kind = draw(st.sampled_from(["fields", "fields", "fields", "top", "raw", "literals"]))
    if kind == "fields":
        data = _json_text(_mutated(BASE_TRACE, TRACE_PATHS, draw(
            st.lists(st.tuples(st.integers(0, 1000), _json_values, st.booleans()), min_size=1, max_size=3))))
    elif kind == "top":
        data = _json_text(draw(_json_values))
    elif kind == "literals":
        data = draw(st.sampled_from([b'{"traceEvents": [{"cat": "kernel", "dur": NaN, "name": "k"}]}',
                                     b'{"traceEvents": [{"cat": "kernel", "dur": 1e400, "name": "k"}]}',
                                     b'{"traceEvents": [{"cat": "cuda_runtime", "name": "cudaLaunchKernel"}]}',
                                     b'{"traceEvents": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                                     b'{"traceEvents": [{"cat": ["kernel"]}]}', b"[1, 2, 3]", b"null", b"\xff\xfe"]))
    else:
        data = draw(st.binary(max_size=64))
    how = draw(_damages)
    return f"{kind}/{how}", _damage(data, how, draw(st.integers(0, 1 << 16)))


RUN_FILE_FRAGMENTS = [
    "transformer:\n  num_layers: \"four\"\n", "transformer:\n  num_layers: -4\n", "transformer:\n  hidden_dropout: .nan\n",
    "transformer:\n  hidden_dropout: .inf\n", "transformer:\n  num_layers: 4\n  num_layers: 5\n",
    "transformer:\n  offload_modules: [[1]]\n  fine_grained_activation_offloading: true\n",
    "transformer:\n  recompute_modules: [[1]]\n  recompute_granularity: selective\n",
    "transformer:\n  num_layers: " + "9" * 5000 + "\n", "transformer:\n  cuda_graph_impl: " + "[" * 3000 + "]" * 3000 + "\n",
    "transformer: !!python/object/apply:os.system [\"true\"]\n", "- 1\n- 2\n", "just text\n", "\t\x00\x01",
    "env:\n  A: &a [1, 2]\nrun:\n  steps: *a\n", "run:\n  steps: 1e400\n", "run:\n  seq_length: [0, -1]\n",
    "transformer:\n  num_layers: 4\nnot_a_section: 1\n", "run:\n  stepz: 3\n", "env:\n  A: {b: 1}\n",
    "transformer:\n  cuda_graph_impl: \"\x1b]0;owned\x07\"\n", "transformer:\n  moe_layer_freq: \"[0]*3+1\"\n",
    "run:\n  timeout_s: -1\n", "run:\n  dtype: fp64\n", "run:\n  impls: 7\n", "run:\n  layer_spec: 'x'\n",
]


def _yaml_dump(value: Any) -> str:
    import yaml

    try:
        return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return "[" * 200


@st.composite
def run_file_text(draw: st.DrawFn) -> tuple[str, bytes]:
    """(label, file bytes): a broken run file (YAML)."""
    kind = draw(st.sampled_from(["fragment", "field", "field", "raw"]))
    if kind == "fragment":
        text = draw(st.sampled_from(RUN_FILE_FRAGMENTS))
    elif kind == "field":
        section = draw(st.sampled_from(["transformer", "run", "env"]))
        key = draw(st.sampled_from(["num_layers", "hidden_size", "hidden_dropout", "steps", "seq_length",
                                    "offload_modules", "recompute_modules", "cuda_graph_impl", "dtype",
                                    "moe_layer_freq", "PYTHONHASHSEED", "impls", "dropout"]))
        value = draw(hostile_values.filter(lambda v: not isinstance(v, bytes)))
        text = f"{section}:\n  {key}: {_yaml_dump(value)}\n"
    else:
        return "raw", draw(st.binary(max_size=64))
    return kind, text.encode("utf-8", errors="surrogatepass")


_freq = st.recursive(
    st.sampled_from(["0", "1", "3", "[0]", "[1]", "[0, 1]", "[1]*3", "1000000000", "-1", "[[1]]", "x", "1.5", "'a'"]),
    lambda inner: st.one_of(st.tuples(inner, st.sampled_from(["+", "*", "**", "-", ","]), inner).map("".join),
                            inner.map(lambda s: f"({s})")),
    max_leaves=8,
)
_flags = ["--num-layers", "--hidden-size", "--hidden-dropout", "--moe-layer-freq", "--num-experts", "--cuda-graph-impl",
          "--seq-length", "--micro-batch-size", "--recompute-modules", "--offload-modules", "--cuda-graph-scope"]


@st.composite
def launch_line(draw: st.DrawFn) -> tuple[str, str]:
    """(label, text): a broken Megatron-LM launch line."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        flag = draw(st.sampled_from(_flags))
        value = draw(_freq) if flag == "--moe-layer-freq" else draw(st.one_of(
            st.sampled_from(["nan", "inf", "-4", "9" * 5000, "four", "", "1e400", "0x10", "'unclosed"]),
            st.text(alphabet="0123456789.-e+[]*() ", max_size=8)))
        parts.append(f"{flag} {value!s}" if " " not in value else f"{flag} '{value}'")
    return "launch", " ".join(parts)


@st.composite
def report_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    """(label, bytes): a broken saved `graphdoctor diff --json` report."""
    source = draw(st.sampled_from(DIFF_REPORTS))
    text = source.read_bytes()
    kind = draw(st.sampled_from(["literal", "truncate", "flip", "nest", "gzip-truncate"]))
    if kind == "literal":
        needle = draw(st.sampled_from([b"0.0", b"true", b"null", b"1"]))
        text = text.replace(needle, draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"9" * 5000])), 1)
    elif kind == "nest":
        text = b'{"schema_version": 1, "x": ' + b"[" * draw(st.integers(10, 200000)) + b"}"
    else:
        text = _damage(text, kind, draw(st.integers(0, 1 << 20)))
    return kind, text


__all__ = ["BASE_SNAPSHOT", "BASE_TRACE", "DIFF_REPORTS", "hostile_values", "launch_line", "report_bytes",
           "run_file_text", "snapshot_bytes", "trace_bytes"]
