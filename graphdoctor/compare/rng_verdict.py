"""Fold tap forensics into an implementation's verdict: frozen random draws, where a numeric
divergence starts, and whether an implementation aligns its RNG with eager by itself.
"""

from __future__ import annotations

import dataclasses

from graphdoctor.compare.forensics import Forensics, FrozenDraw, TapDivergence
from graphdoctor.compare.verdict import ImplResult
from graphdoctor.config.impl import Impl
from graphdoctor.rules import rule_fix
from graphdoctor.types import Diagnosis, Verdict

RNG_SHIFT_RULE: dict[str, str] = {Impl.LOCAL: "GD401"}
"""Catalogue rule for implementations known not to restore the RNG around warmup and capture."""

RNG_SELF_ALIGNED: dict[str, str] = {
    Impl.TRANSFORMER_ENGINE: ": Transformer Engine saves and restores the RNG states around its "
                             "warmup and capture (make_graphed_callables), which Megatron's local "
                             "implementation does not",
    Impl.FULL_ITERATION: ": full_iteration warms up with real training steps and captures without "
                         "extra passes, so nothing shifts the random stream",
}
"""Why an implementation's draws match eager's without --align-rng."""


def _where(item: FrozenDraw | TapDivergence) -> str:
    module = item.module or "<no module>"
    return f"{module}" + (f" ({item.location})" if item.location else "")


def _frozen_diagnosis(frozen: FrozenDraw) -> Diagnosis:
    host = frozen.kind == "host-random"
    rule = "GD506" if host else "GD505"
    source = ("a host-drawn random tensor copied in through pinned memory: the capture kept the "
              "copy from one pinned buffer" if host else
              "a random draw whose generator state the graph does not advance")
    return Diagnosis(
        error_type="frozen-rng",
        message=(f"{frozen.op} in {_where(frozen)} replays the same random values at every replay "
                 f"from step {frozen.first_step} ({frozen.num_replay_steps} replays) while eager "
                 f"draws new ones: {source}"),
        fix=rule_fix(rule), rule=rule, module=frozen.module, location=frozen.location, step=frozen.first_step,
        phase="replay")


TAP_WHAT = {"output": "output", "grad": "gradient w.r.t. the output", "input-grad": "gradient w.r.t. the input"}
"""What a value tap of each kind fingerprints, in a sentence."""


def _numeric_diagnosis(div: TapDivergence, impl: str, forensics: Forensics | None = None) -> Diagnosis:
    message = (f"first difference inside the step: the {TAP_WHAT.get(div.kind, div.kind)} of {_where(div)} at step "
               f"{div.step} (fingerprint max abs {div.max_abs:.3g}, max rel {div.max_rel:.3g}) "
               f"with every dropout mask and random draw identical to eager")
    backward = forensics.first_input_grad_divergence if forensics is not None else None
    if div.kind != "output" and backward is not None and backward.module != div.module:
        message += (f"; in backward order the first module whose input gradient differs is {_where(backward)} "
                    f"(step {backward.step})")
    fix = ("check what this module reads that eager recomputes each step (tensor attributes "
           "rebound between steps, host values, Python state): a graph replays the addresses "
           f"and values it saw when {impl} captured it")
    if impl == Impl.TRANSFORMER_ENGINE:
        # TE replaces the graphed modules' forwards: their hooks never fire, so the first tapped
        # difference can sit just downstream of the graphed module that caused it.
        message += ("; modules inside Transformer Engine's graphs are not tapped, so the "
                    "difference may start in a graphed module that runs before this one")
        fix = ("narrow --cuda-graph-modules (attn, mlp) to find the graphed module that differs; "
               + fix)
    return Diagnosis(error_type="numeric-divergence", message=message, fix=fix,
                     module=div.module, location=div.location, step=div.step,
                     phase=div.phase)


def apply_forensics(result: ImplResult, forensics: Forensics, *, aligned_requested: bool) -> ImplResult:
    """The result with the forensics attached and, where they say more, a sharper verdict.

    Args:
        result: the judged implementation.
        forensics: graphdoctor.compare.forensics.Forensics of a tapped eager/graphed pair.
        aligned_requested: whether the graphed run restored RNG states around graph creation.
    """
    notes = list(result.notes)
    verdict, diagnosis = result.verdict, result.diagnosis
    if forensics.frozen:
        verdict, diagnosis = Verdict.FROZEN_RNG, _frozen_diagnosis(forensics.frozen[0])
        if len(forensics.frozen) > 1:
            notes.append(f"{len(forensics.frozen)} random draws replay frozen values: "
                         + ", ".join(_where(f) for f in forensics.frozen[:5]))
    elif verdict == Verdict.NUMERIC_DIVERGENCE and forensics.first_numeric_divergence is not None:
        diagnosis = _numeric_diagnosis(forensics.first_numeric_divergence, result.impl, forensics)
    mismatch = forensics.first_draw_mismatch
    if mismatch is not None and not forensics.frozen:
        rule = RNG_SHIFT_RULE.get(result.impl)
        notes.append(
            f"random streams differ from eager from step {mismatch.step}, first at "
            f"{_where(mismatch)} ({mismatch.op})"
            + ("" if aligned_requested else f"; {result.impl} does not align its RNG with eager "
               "by itself" + (f" ({rule})" if rule else "") + "; --align-rng restores the "
               "generator states around warmup and capture"))
    elif forensics.rng_aligned:
        notes.append("every dropout mask and random draw is identical to eager"
                     + (" (with --align-rng)" if aligned_requested else
                        RNG_SELF_ALIGNED.get(result.impl, "")))
    for anomaly in forensics.keep_rate_anomalies:
        notes.append(f"dropout keep rate at {anomaly.module} is {anomaly.keep_rate:.4f}, expected "
                     f"{anomaly.expected_keep_rate:.4f}")
    return dataclasses.replace(result, verdict=verdict, diagnosis=diagnosis, notes=tuple(notes),
                               forensics=forensics)


__all__ = ["RNG_SHIFT_RULE", "TAP_WHAT", "apply_forensics"]
