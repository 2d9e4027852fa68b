"""The bisection planner: the sequence of scopes and layer subsets it asks about, given verdicts.

The scope verdicts are the H200's (docs/diff.md, "transformer_engine on the H200": TE spec, bf16,
dropout 0, 2 layers: whole layer, attn and attn+mlp differ from the capture step, mlp matches
bitwise; fixtures/data/forensics/h200_te_attn_scope.json.gz is the attn run)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from graphdoctor.advise.bisect import Bisection, bisect, bisect_start, scope_parts
from graphdoctor.advise.candidates import Candidate

FORENSICS = Path(__file__).resolve().parents[2] / "fixtures" / "data" / "forensics"
TE = "transformer_engine"


def h200_te_scopes() -> dict[tuple[str, ...], bool]:
    attn = json.loads(gzip.open(FORENSICS / "h200_te_attn_scope.json.gz").read())
    assert attn["live_verdict"] == "numeric-divergence" and attn["live_first_divergence"]["step"] == 2
    return {(): True, ("attn",): True, ("attn", "mlp"): True, ("mlp",): False}


class Recorded:
    """Answers from recorded verdicts; every question asked is kept in order."""

    def __init__(self, scopes: dict[tuple[str, ...], bool], layers: dict[tuple[str, ...], set[int]]) -> None:
        self.scopes = scopes
        self.layers = layers
        """scope -> the layers whose graphing alone makes that scope differ."""
        self.asked: list[str] = []

    def __call__(self, candidate: Candidate) -> bool | None:
        self.asked.append(candidate.label)
        if not candidate.layers:
            return self.scopes.get(candidate.modules)
        differing = self.layers.get(candidate.modules)
        return None if differing is None else bool(differing & set(candidate.layers))


def test_te_whole_layer_narrows_to_attention_then_to_layer_0() -> None:
    judge = Recorded(h200_te_scopes(), {("attn",): {0, 1}})
    found = bisect(Candidate(TE), 2, judge)
    assert judge.asked == ["transformer_engine attn", "transformer_engine mlp", "transformer_engine attn (layer 0)"]
    assert found.narrowed == Candidate(TE, ("attn",), (0,)) and found.stopped == "one layer"
    assert [(s.stage, s.differs) for s in found.steps] == [("scope", True), ("scope", False), ("layers", True)]


def test_second_half_is_asked_when_the_first_matches() -> None:
    judge = Recorded({("attn",): True, ("mlp",): False}, {("attn",): {5}})
    found = bisect(Candidate(TE), 8, judge)
    assert judge.asked[2:] == [f"{TE} attn (layers 0,1,2,3)", f"{TE} attn (layers 4,5,6,7)",
                               f"{TE} attn (layers 4,5)", f"{TE} attn (layer 4)", f"{TE} attn (layer 5)"]
    assert found.narrowed == Candidate(TE, ("attn",), (5,))


def test_divergence_that_needs_both_halves_stops_there() -> None:
    judge = Recorded({("attn",): True, ("mlp",): False}, {("attn",): set()})
    found = bisect(Candidate(TE), 4, judge)
    assert found.stopped == "needs both halves" and found.narrowed == Candidate(TE, ("attn",))


def test_local_is_bisected_over_layers_only() -> None:
    """megatron-core 0.19.2: local `attn` / `mlp` are the whole GPT layer, the MoE scopes graph nothing
    (GD219), so no scope of a local candidate is asked."""
    judge = Recorded({}, {(): {3}})
    found = bisect(Candidate("local"), 4, judge)
    assert judge.asked == ["local whole layer (layers 0,1)", "local whole layer (layers 2,3)",
                           "local whole layer (layer 2)", "local whole layer (layer 3)"]
    assert found.narrowed == Candidate("local", (), (3,)) and found.stopped == "one layer"
    assert scope_parts(Candidate("local"), moe=True) == [()]


def test_scopes_that_differ_only_together_keep_the_combination() -> None:
    judge = Recorded({("attn",): False, ("mlp",): False, ("attn", "mlp"): True}, {("attn", "mlp"): {1}})
    found = bisect(Candidate(TE, ("attn", "mlp")), 2, judge)
    assert found.narrowed == Candidate(TE, ("attn", "mlp"), (1,))
    assert any("only together" in n for n in found.notes)


def test_an_unknown_verdict_ends_the_bisection_with_what_it_has() -> None:
    judge = Recorded({("attn",): True, ("mlp",): False}, {})
    found = bisect(Candidate(TE), 2, judge)
    assert found.stopped == "unknown verdict" and found.narrowed == Candidate(TE, ("attn",))
    assert Bisection.from_dict(json.loads(json.dumps(found.to_dict()))) == found


def test_moe_parts_and_starts() -> None:
    assert scope_parts(Candidate(TE), moe=True) == [("attn",), ("moe",)]
    assert scope_parts(Candidate(TE, ("attn", "moe_router", "moe_preprocess")), moe=True) == [
        ("attn",), ("moe_router", "moe_preprocess")]
    starts = bisect_start([(Candidate(TE, ("attn",)), True), (Candidate(TE), True), (Candidate(TE, ("mlp",)), False),
                           (Candidate("full_iteration"), True), (Candidate("local", ("attn", "mlp")), True),
                           (Candidate("local"), None)])
    assert starts == [Candidate(TE), Candidate("local", ("attn", "mlp"))]
