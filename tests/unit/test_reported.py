"""Loss-function returns on CPU tensors, through Megatron-Core's own forward_step_calc_loss: every form
its schedules accept gives the step's loss and reported values as Megatron-LM reduces them; a return
graphdoctor cannot read is one line naming the accepted forms."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from fixtures.planted import forward_forms
from graphdoctor.child.reported import (
    ACCEPTED_FORMS,
    MicrobatchReport,
    StepValues,
    checked_forward_step,
    read_loss_return,
    reduce_step,
)
from graphdoctor.errors import UsageError

VOCAB, SEQ, MBS = 32, 8, 2
WHERE = "--forward-step tests:form"


class TokenLosses(torch.nn.Module):
    """A real (tiny) language model with Megatron GPTModel's call: per-token cross-entropy [b, s]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(tokens))
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")


def batches(num_microbatches: int) -> list[dict[str, torch.Tensor]]:
    """Micro-batches whose loss masks keep different numbers of tokens (token-weighted and
    micro-batch-averaged values then differ)."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for m in range(num_microbatches):
        data = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=gen)
        mask = torch.ones(MBS, SEQ)
        if m:
            mask[:, SEQ - 2 * m:] = 0.0
        out.append({"tokens": data[:, :-1], "labels": data[:, 1:], "loss_mask": mask,
                    "position_ids": torch.arange(SEQ).expand(MBS, SEQ),
                    "attention_mask": torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)})
    return out


def transformer_config(per_token: bool = False) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

        return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=1,
                                 calculate_per_token_loss=per_token)


def run_schedule(forward_step: Callable[..., Any], num_microbatches: int, *, per_token: bool = False,
                 cp_size: int = 1) -> tuple[list[Any], list[torch.Tensor]]:
    """What forward_backward_no_pipelining does per micro-batch, on CPU: forward_step, then Megatron's
    forward_step_calc_loss (the in-place loss scaling and the forward_data_store), then backward."""
    from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss

    config, model = transformer_config(per_token), TokenLosses()
    store: list[Any] = []
    trained: list[torch.Tensor] = []
    data: Iterator[dict[str, torch.Tensor]] = iter(batches(num_microbatches))
    step = checked_forward_step(forward_step, WHERE)
    for _ in range(num_microbatches):
        output, loss_func = step(data, model)
        loss, _ = forward_step_calc_loss(model, output, loss_func, config, None, False, num_microbatches,
                                         store, cp_size, True)
        trained.append(loss.detach().clone())
        loss.backward()
    return store, trained


def token_sums() -> list[tuple[float, float]]:
    """(masked loss sum, tokens) per micro-batch of a two-micro-batch step, computed directly."""
    model = TokenLosses()
    out = []
    for batch in batches(2):
        with torch.no_grad():
            losses = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], batch["labels"])
        mask = batch["loss_mask"].view(-1)
        out.append((float((losses.view(-1) * mask).sum()), float(mask.sum())))
    return out


@pytest.mark.parametrize("form", sorted(forward_forms.FORMS))
def test_every_accepted_form_reports_its_keys_and_the_trained_loss(form: str) -> None:
    store, trained = run_schedule(getattr(forward_forms, form), 2)
    assert all(isinstance(m, MicrobatchReport) for m in store)
    values = reduce_step(store, per_token_loss=False, where=WHERE)
    loss, reported = values.host()
    assert tuple(k for k, _ in reported) == forward_forms.FORMS[form]
    # The step's loss is what the schedule trains on: the scaled losses it backpropagates, summed.
    assert loss == pytest.approx(float(sum(trained)), rel=1e-6)
    (s0, n0), (s1, n1) = token_sums()
    assert n0 != n1
    token_weighted, averaged = (s0 + s1) / (n0 + n1), (s0 / n0 + s1 / n1) / 2
    lm = dict(reported).get("lm loss", dict(reported).get("loss"))
    # Megatron-LM's reduction: [sum, count] is token-weighted, a scalar is averaged over micro-batches.
    expected = token_weighted if form in ("two_tuple_sum_count", "three_tuple") else averaged
    assert lm == pytest.approx(expected, rel=1e-6)
    assert loss == pytest.approx(averaged, rel=1e-6)


def test_custom_keys_reduce_each_as_megatron_lm_does() -> None:
    store, _ = run_schedule(forward_forms.custom_keys, 2)
    reported = dict(reduce_step(store, per_token_loss=False, where=WHERE).host()[1])
    (s0, n0), (s1, n1) = token_sums()
    assert reported["tokens"] == pytest.approx((n0 + n1) / 2)
    assert reported["loss per token"] == pytest.approx((s0 + s1) / (n0 + n1), rel=1e-6)
    assert reported["worst token loss"] > reported["loss"]


def test_per_token_loss_divides_the_summed_loss_by_the_step_tokens() -> None:
    store, trained = run_schedule(forward_forms.three_tuple, 2, per_token=True)
    (s0, n0), (s1, n1) = token_sums()
    # calculate_per_token_loss: the schedule leaves the loss a token sum; the grads are divided later.
    assert float(sum(trained)) == pytest.approx(s0 + s1, rel=1e-6)
    loss, _ = reduce_step(store, per_token_loss=True, where=WHERE).host()
    assert loss == pytest.approx((s0 + s1) / (n0 + n1), rel=1e-6)


def test_two_tuple_loss_is_scaled_by_context_parallel_size_as_the_schedule_does() -> None:
    store, trained = run_schedule(forward_forms.two_tuple_scalar, 2, cp_size=2)
    loss, reported = reduce_step(store, per_token_loss=False, where=WHERE).host()
    assert loss == pytest.approx(float(sum(trained)), rel=1e-6)
    assert loss == pytest.approx(2 * dict(reported)["lm loss"], rel=1e-6)


def _loss() -> torch.Tensor:
    return torch.tensor(2.0, requires_grad=True) * 1.5


BAD_RETURNS: dict[str, tuple[Callable[[], Any], str]] = {
    "bare loss": (lambda: _loss(), "its loss function returned Tensor"),
    "four items": (lambda: (_loss(), torch.tensor(3), {}, {}), "returned a tuple of 4 items"),
    "a list, not a dict": (lambda: (_loss(), [torch.tensor(1.0)]), "its last item is list, not a dict"),
    "python float value": (lambda: (_loss(), {"lm loss": 1.5}), "reports 'lm loss' as float, not a tensor"),
    "three elements": (lambda: (_loss(), {"lm loss": torch.zeros(3)}), "reports 'lm loss' with shape (3,)"),
    "int num_tokens": (lambda: (_loss(), 5, {}), "its num_tokens is int, not a tensor"),
    "float loss": (lambda: (2.5, {}), "its loss is float, not a tensor"),
    "vector loss": (lambda: (torch.ones(4), {}), "its loss has shape (4,), not one element"),
    "non-string key": (lambda: (_loss(), {0: torch.tensor(1.0)}), "its dict has the key 0, not a string"),
}


@pytest.mark.parametrize("case", sorted(BAD_RETURNS))
def test_a_return_it_cannot_read_is_one_line_naming_the_accepted_forms(case: str) -> None:
    make, problem = BAD_RETURNS[case]
    with pytest.raises(UsageError) as caught:
        read_loss_return(make(), WHERE)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    assert message.startswith(f"{WHERE}: ") and problem in message and message.endswith(ACCEPTED_FORMS)
    assert "(loss, dict) or (loss, num_tokens, dict)" in message


def test_a_bad_return_stops_megatrons_schedule_with_that_line() -> None:
    def forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module) -> Any:
        batch = next(data_iterator)
        output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
        return output, lambda out: (out.sum(), {"lm loss": out.sum().item()})

    with pytest.raises(UsageError, match="reports 'lm loss' as float, not a tensor; accepted: "):
        run_schedule(forward_step, 1)


def test_forward_step_must_return_output_and_loss_func() -> None:
    step = checked_forward_step(lambda data_iterator, model: torch.zeros(1), WHERE)
    with pytest.raises(UsageError, match=r"returned Tensor; forward_step\(data_iterator, model\) must return "
                                         r"\(output_tensor, loss_func\)"):
        step(iter(()), None)


def test_micro_batches_reporting_different_keys_are_refused() -> None:
    first = MicrobatchReport(values={"a": torch.tensor(1.0)}, loss=torch.tensor(1.0), num_tokens=None)
    second = MicrobatchReport(values={"b": torch.tensor(1.0)}, loss=torch.tensor(1.0), num_tokens=None)
    with pytest.raises(UsageError, match=r"micro-batches report different keys \(\['a'\] and \['b'\]\)"):
        reduce_step([first, second], per_token_loss=False, where=WHERE)


def test_reported_values_come_back_in_one_vector_in_key_order() -> None:
    report = MicrobatchReport(values={"z": torch.tensor([6.0, 3.0]), "a": torch.tensor(0.5)},
                              loss=torch.tensor(1.25), num_tokens=None)
    values = reduce_step([report, report], per_token_loss=False, where=WHERE)
    assert isinstance(values, StepValues) and values.values.shape == (3,)
    assert values.host() == (2.5, (("z", 2.0), ("a", 0.5)))


def test_a_step_without_reports_records_nan() -> None:
    loss, reported = reduce_step([], per_token_loss=False, where=WHERE).host()
    assert loss != loss and reported == ()


def test_the_planted_item_loss_func_is_an_accepted_form_outside_capture_and_marks_its_line() -> None:
    import inspect

    store, trained = run_schedule(forward_forms.item_in_loss_func, 2)
    loss, reported = reduce_step(store, per_token_loss=False, where=WHERE).host()
    assert tuple(k for k, _ in reported) == ("lm loss",) and loss == pytest.approx(float(sum(trained)))
    source = inspect.getsource(forward_forms)
    assert source.count("# [GD501]") == 1
    assert ".item()" in next(line for line in source.splitlines() if "# [GD501]" in line)
