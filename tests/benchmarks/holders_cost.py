"""Benchmark: cost of the holder watch (graphdoctor.child.holders) per training step, against the step itself.

Usage (on a CUDA machine, from the repository root):
    python tests/benchmarks/holders_cost.py [--impl local,full_iteration] [--dtype fp16] [--num-layers 24]
        [--hidden-size 1024] [--steps 24] [--repeats 2]

For each implementation it runs graphed children of the same model one after the other in one invocation, without
the watch and with it, alternating (`--repeats` pairs; the fastest of each kind is kept, since a host-bound local
step varies by a tenth from one child to the next). The watch's seconds per step are its step hooks' seconds (the
check of every holder, ChildSeconds.hooks) over the steps; its one-off seconds (reading the captured operations,
searching the holders, its finish) are the rest of its seconds. Each watched child also reports how many paths it
watched, by kind (ChildSeconds.watched). The step is the median CUDA-event replay step time: the ratio of the two kinds says whether the watch slows the GPU's work.
Target: the per-step part at or below about 1 % of a step. The layer count matters more than the width: the
check's cost grows with the number of watched paths, and a 7B model has 32 layers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.parent.children import run_child
from graphdoctor.protocol.spec import ChildSpec, Role, placement_for_child, run_name


def _run(impl: str, cfg: DiffConfig, work: Path, steps: int, holders: bool, index: int) -> dict[str, Any]:
    name = run_name(impl, cfg.dropout, Role.GRAPHED) + f"-{'on' if holders else 'off'}-{index}"
    spec = ChildSpec(impl=impl, dropout=cfg.dropout, config=cfg.replace(steps=steps), role=Role.GRAPHED, name=name,
                     events_path=str(work / f"events-{name}.jsonl"), reference_dir=str(work),
                     placement=placement_for_child(index), fingerprints=False, holders=holders)
    record = run_child(spec, work)
    if record.status != "ok":
        raise SystemExit(f"{impl} steps={steps} holders={holders}: {record.status} {record.diagnosis}")
    replay = [s.step_time_ms for s in record.steps if s.phase == "replay" and not s.profiled][2:]
    seconds = record.seconds.observers.get("holders", 0.0) if record.seconds is not None else 0.0
    hooks = record.seconds.hooks.get("holders", 0.0) if record.seconds is not None else 0.0
    trained = sum(1 for s in record.steps if not s.profiled)
    sizes = record.seconds.watched.get("holders", {}) if record.seconds is not None else {}
    return {"median_replay_ms": statistics.median(replay), "holders_s": seconds, "sizes": sizes,
            "hooks_ms_per_step": 1000.0 * hooks / max(1, trained),
            "hazards": float(sum(1 for h in record.hazards if h.rule in ("GD518", "GD522")))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="local,full_iteration")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--num-layers", type=int, default=24)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2,
                        help="pairs of children per implementation, off and on alternating; the fastest of each kept")
    args = parser.parse_args(argv)
    cfg = DiffConfig(impls=tuple(args.impl.split(",")), dtype=args.dtype, num_layers=args.num_layers,
                     hidden_size=args.hidden_size, num_attention_heads=max(1, args.hidden_size // 64),
                     dropout=0.0, memory=False, launches=False, localize=False, timeout_s=400.0)
    work = Path(tempfile.mkdtemp(prefix="gd-holders-bench-"))
    rows = []
    for i, impl in enumerate(cfg.impls):
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for repeat in range(args.repeats):
            for holders in ((False, True) if repeat % 2 == 0 else (True, False)):
                index = 2 * (i * args.repeats + repeat) + int(holders)
                runs[holders].append(_run(impl, cfg, work, args.steps, holders, index))
        plain = min(runs[False], key=lambda r: r["median_replay_ms"])
        watched = min(runs[True], key=lambda r: r["hooks_ms_per_step"])
        step_ms = plain["median_replay_ms"]
        step_on_ms = min(r["median_replay_ms"] for r in runs[True])
        per_step_ms = watched["hooks_ms_per_step"]
        one_off_s = watched["holders_s"] - per_step_ms * args.steps / 1000.0
        rows.append({"impl": impl, "step_ms_off": round(step_ms, 3), "step_ms_on": round(step_on_ms, 3),
                     "step_ratio": round(step_on_ms / step_ms, 4),
                     "step_ms_off_all": [round(r["median_replay_ms"], 3) for r in runs[False]],
                     "step_ms_on_all": [round(r["median_replay_ms"], 3) for r in runs[True]],
                     "watch_ms_per_step": round(per_step_ms, 4),
                     "watch_pct_of_step": round(100.0 * per_step_ms / step_ms, 3),
                     "watch_one_off_s": round(one_off_s, 3), "watch_s": round(watched["holders_s"], 3),
                     "hazards": watched["hazards"], "sizes": watched["sizes"]})
        print(f"{impl}: step {step_ms:.2f} -> {step_on_ms:.2f} ms ({rows[-1]['step_ratio']:.3f}x); "
              f"watch {per_step_ms:.3f} ms/step ({rows[-1]['watch_pct_of_step']:.2f} % of a step), one-off "
              f"{one_off_s:.2f} s; {sum(watched['sizes'].values())} paths", file=sys.stderr)
    print(json.dumps({"config": {"dtype": cfg.dtype, "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
                                 "seq_length": cfg.seq_length, "steps": args.steps,
                                 "repeats": args.repeats}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
