"""Benchmark: cost of capture-time taps (forensics) on a steady-state replay step, and their memory.

Usage (on a CUDA machine, from the repository root):
    python tests/benchmarks/taps_cost.py [--impl eager,local,full_iteration] [--steps 14] [--dropout 0.1]
    python tests/benchmarks/taps_cost.py --size 0.54b     # a size of tests/benchmarks/diff_cost.py

For each implementation (eager too: its taps are module hooks and a dispatch mode on every operator) it
trains the model twice, one after the other in one invocation: plainly and with taps (dropout masks, random
draws, module outputs and output gradients fingerprinted, inside the graphs where there are graphs). Both are
`tapped`-role child runs (no reference I/O, no profiler, no memory history). Time: median CUDA-event step
time over the steady steps (from warmup + 3 on, the steps diff times; replays for the graphed runs). Memory:
the taps' own tables, and the difference in persistent allocated bytes at the end of the run, against the
untapped run's persistent allocated bytes (parameters, main_grads, optimizer states, graph pools). Targets:
time ratio <= 1.10 (issue 44: below it, diff may fold the taps into its first runs), memory <= 1% of model
memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from graphdoctor.config import DiffConfig
from graphdoctor.parent.children import run_child
from graphdoctor.protocol.spec import EAGER, ChildSpec, Role, placement_for_child, run_name


def _run(impl: str, cfg: DiffConfig, work: Path, taps: bool, index: int) -> dict[str, object]:
    name = run_name(impl, cfg.dropout, Role.TAPPED, taps=taps)
    spec = ChildSpec(impl=impl, dropout=cfg.dropout, config=cfg.replace(memory=False, launches=False),
                     role=Role.TAPPED, name=name, events_path=str(work / f"events-{name}.jsonl"),
                     reference_dir=str(work), placement=placement_for_child(index), taps=taps,
                     fingerprints=False)
    record = run_child(spec, work)
    if record.status != "ok":
        raise SystemExit(f"{impl} taps={taps}: {record.status} {record.diagnosis}")
    steady = [s.step_time_ms for s in record.steps
              if s.step >= cfg.cuda_graph_warmup_steps + 3 and s.phase in ("replay", "eager") and s.step_time_ms]
    return {"median_replay_ms": statistics.median(steady), "num_replay_steps": len(steady),
            "end_allocated_bytes": record.end_allocated_bytes,
            "peak_allocated_bytes": record.peak_allocated_bytes,
            "end_reserved_bytes": record.end_reserved_bytes,
            "taps_bytes": record.forensics.num_bytes if record.forensics else None,
            "num_sites": len(record.forensics.sites) if record.forensics else None}


def _delta(tapped: dict[str, object], plain: dict[str, object], key: str) -> int | None:
    if tapped.get(key) is None or plain.get(key) is None:
        return None
    return int(tapped[key]) - int(plain[key])  # type: ignore[call-overload]


def _pct_delta(tapped: dict[str, object], plain: dict[str, object], key: str) -> float | None:
    delta = _delta(tapped, plain, key)
    base = plain.get(key)
    return None if delta is None or not base else round(100.0 * delta / int(base), 3)  # type: ignore[call-overload]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="eager,local,full_iteration")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--hidden-size", type=int, default=DiffConfig().hidden_size)
    parser.add_argument("--seq-length", type=int, default=DiffConfig().seq_length)
    parser.add_argument("--size", default=None, help="a size of diff_cost.py without a Megatron-LM line "
                        "(0.54b, 1.08b); overrides --hidden-size and --seq-length")
    args = parser.parse_args(argv)
    shape: dict[str, object] = {"hidden_size": args.hidden_size, "seq_length": args.seq_length}
    if args.size:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from diff_cost import SIZES

        if args.size not in SIZES or "megatron-args" in SIZES[args.size]:
            parser.error(f"--size: one of {', '.join(k for k, v in SIZES.items() if 'megatron-args' not in v)}")
        shape = {key.replace("-", "_"): value for key, value in SIZES[args.size].items()}
    impls = args.impl.split(",")
    graphed = tuple(impl for impl in impls if impl != EAGER) or ("local",)  # the config names graphed ones only
    cfg = DiffConfig(impls=graphed, steps=args.steps, dropout=args.dropout,
                     memory=False, launches=False, timeout_s=300.0, **shape)  # type: ignore[arg-type]
    work = Path(tempfile.mkdtemp(prefix="gd-taps-bench-"))
    rows = []
    index = 0
    for impl in impls:
        plain = _run(impl, cfg, work, False, index)
        tapped = _run(impl, cfg, work, True, index + 1)
        index += 2
        model_bytes = int(plain["end_allocated_bytes"] or 0)  # type: ignore[call-overload]
        extra = int(tapped["end_allocated_bytes"] or 0) - model_bytes  # type: ignore[call-overload]
        rows.append({
            "impl": impl, "plain_ms": plain["median_replay_ms"],
            "tapped_ms": tapped["median_replay_ms"],
            "time_ratio": round(float(tapped["median_replay_ms"]) /  # type: ignore[arg-type]
                                float(plain["median_replay_ms"]), 4),  # type: ignore[arg-type]
            "num_sites": tapped["num_sites"], "taps_table_bytes": tapped["taps_bytes"],
            "model_bytes": model_bytes, "extra_allocated_bytes": extra,
            "memory_pct": round(100.0 * max(extra, int(tapped["taps_bytes"] or 0)) / model_bytes, 3)
            if model_bytes else None,
            "peak_delta_pct": _pct_delta(tapped, plain, "peak_allocated_bytes"),
            "reserved_delta_bytes": _delta(tapped, plain, "end_reserved_bytes"),
        })
        print(f"{impl}: {plain['median_replay_ms']:.3f} -> {tapped['median_replay_ms']:.3f} ms "
              f"({rows[-1]['time_ratio']:.3f}x), {tapped['num_sites']} sites, memory "
              f"{rows[-1]['memory_pct']}% persistent, {rows[-1]['peak_delta_pct']}% peak",
              file=sys.stderr)
    print(json.dumps({"config": {"steps": cfg.steps, "dropout": cfg.dropout, "size": args.size,
                                 "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
                                 "seq_length": cfg.seq_length, "micro_batch_size": cfg.micro_batch_size,
                                 "dtype": cfg.dtype},
                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
