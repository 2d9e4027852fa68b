"""Identical weights without CPU initialisation (graphdoctor/child/weights.py), on the CPU: a tensor an init method
filled is filled again from a seed of its own name and rank, whatever the generators drew before; views of one
parameter get seeds of their own; constants need none; a random parameter nothing recorded is named."""

from __future__ import annotations

import dataclasses
import functools

import torch

from graphdoctor.child.weights import InitRecorder, parameter_seed, seeded_initialisation, weights_digest
from graphdoctor.compare.weights import weights_disagree
from graphdoctor.protocol.events import Weights, decode, encode
from graphdoctor.protocol.record import RunRecord

NORMAL = functools.partial(torch.nn.init.normal_, mean=0.0, std=0.02)


class Layer(torch.nn.Module):
    """A linear layer initialised as Megatron's are: weights through an init method, bias and norm constant."""

    def __init__(self, init: object, experts: int = 1) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(experts, 8, 4))
        self.bias = torch.nn.Parameter(torch.zeros(4))
        self.norm = torch.nn.Parameter(torch.ones(4))
        for expert in range(experts):
            init(self.weight[expert])  # type: ignore[operator]  # a view per expert, as grouped experts do


def _built(draws: int, ranks: tuple[int, ...] = (0, 0, 0)) -> tuple[Layer, Weights]:
    torch.manual_seed(draws)
    torch.randn(draws)  # what another child's RNG tracker or build order drew before
    recorder = InitRecorder()
    layer = Layer(recorder._wrap(NORMAL), experts=2)
    done = seeded_initialisation(layer, recorder, seed=1234, ranks=ranks)
    return layer, Weights(digest=weights_digest(layer), num_seeded=done.num_tensors, unseeded=done.unseeded)


def test_children_whose_generators_drew_differently_get_the_same_weights() -> None:
    (first, a), (second, b) = _built(1), _built(977)
    assert torch.equal(first.weight, second.weight) and a.digest == b.digest
    assert (a.num_seeded, a.unseeded) == (2, ())
    assert not torch.equal(first.weight[0], first.weight[1])  # each expert's view has a seed of its own
    assert 0.01 < float(first.weight.detach().std()) < 0.03  # the init method's own distribution


def test_another_tensor_parallel_rank_draws_another_shard() -> None:
    assert _built(1)[1].digest != _built(1, ranks=(1, 0, 0))[1].digest
    assert parameter_seed(1234, "w", 0, (0, 0, 0)) != parameter_seed(1234, "w", 0, (1, 0, 0))
    assert 0 <= parameter_seed(1234, "w", 0, (0, 0, 0)) < 1 << 63


def test_the_process_generators_are_left_as_they_were() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    recorder = InitRecorder()
    layer = Layer(recorder._wrap(NORMAL))
    torch.manual_seed(5)
    seeded_initialisation(layer, recorder, seed=1, ranks=(0, 0, 0))
    assert torch.equal(torch.rand(3), expected)


def test_a_random_parameter_no_init_method_filled_is_named() -> None:
    recorder = InitRecorder()
    layer = Layer(recorder._wrap(NORMAL))
    layer.stray = torch.nn.Parameter(torch.randn(4))
    assert seeded_initialisation(layer, recorder, seed=1, ranks=(0, 0, 0)).unseeded == ("stray",)


def test_the_recorder_wraps_every_init_method_of_a_transformer_config() -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    tconfig = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4)
    recorder = InitRecorder()
    assert {"init_method", "output_layer_init_method"} <= set(recorder.install(tconfig))
    tensor = torch.empty(3, 3)
    tconfig.output_layer_init_method(tensor)
    assert recorder.calls[0][0] is tensor


def test_the_weights_event_folds_into_the_record_and_the_parent_names_children_that_differ() -> None:
    event = Weights(digest="ab" * 16, num_seeded=12, unseeded=("decoder.x",))
    assert decode(encode(event)) == event
    same = RunRecord(impl="eager", dropout=0.0, status="ok", name="eager", weights=event)
    assert RunRecord.from_dict(same.to_dict()).weights == event
    other = RunRecord(impl="local", dropout=0.0, status="ok", name="local",
                      weights=Weights(digest="cd" * 16, num_seeded=12))
    line = weights_disagree([same, other])
    assert line == "initial weights differ from eager's in local; parameters not seeded per name: decoder.x"
    clean = Weights(digest="ab" * 16, num_seeded=12)
    assert weights_disagree([RunRecord(impl="eager", dropout=0.0, status="ok", weights=clean),
                             RunRecord(impl="local", dropout=0.0, status="ok", weights=clean)]) is None
    assert weights_disagree([RunRecord(impl="eager", dropout=0.0, status="ok")]) is None


def test_a_row_whose_runs_started_from_different_weights_says_its_comparison_does_not_hold() -> None:
    """The verdict tree's row gets a note naming the run whose digest differs; equal digests add none."""
    from graphdoctor.compare.verdict import ImplResult
    from graphdoctor.diff.decide import _with_weights_check
    from graphdoctor.types import Verdict

    _, same = _built(draws=3)
    _, other = _built(draws=3, ranks=(1, 0, 0))
    reference = RunRecord(impl="eager", dropout=0.0, status="ok", name="eager-reference-0", weights=same)
    graphed = RunRecord(impl="local", dropout=0.0, status="ok", name="local-graphed-0", weights=same)
    row = ImplResult(impl="local", verdict=Verdict.MATCH)
    assert _with_weights_check(row, reference, graphed).notes == ()
    moved = dataclasses.replace(graphed, weights=other)
    notes = _with_weights_check(row, reference, moved).notes
    assert len(notes) == 1 and "local-graphed-0" in notes[0] and "does not hold" in notes[0]
