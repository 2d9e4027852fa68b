"""GD13x configuration rules: what Megatron-LM's own parser and validate_args say of a launch line.

The reading is Megatron-LM's (graphdoctor.rules.megatron_reading: megatron/training/arguments.py `parse_args` and
`validate_args` from the megatron-core wheel, with the flags the line's script adds); these rules only report it.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphdoctor.rules.base import Hit, Rule
from graphdoctor.rules.context import CheckContext
from graphdoctor.rules.finding import FixAvailability, Severity

FAMILY = "configuration"


class UnknownMegatronFlag(Rule):
    """## What it does
    Flags a flag on a Megatron-LM line that neither Megatron-LM's argument parser (with the flags the line's
    script adds: the inference examples add `megatron/inference/utils.py`'s) nor torchrun knows, with the closest
    flag that exists.

    ## Why is this bad?
    Megatron-LM's parser refuses it and the job does not start (`pretrain_gpt.py: error: unrecognized arguments:
    --frobnicate 3`), after the allocation and the queue; a misspelt graph flag (`--cuda-graph-scop attn`) never
    reaches the rules either.

    ## Example
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine --cuda-graph-modul attn
    ```

    ## Use instead
    ```
    pretrain_gpt.py --cuda-graph-impl transformer_engine --cuda-graph-modules attn
    ```

    ## Fix
    Spell the flag as Megatron-LM's parser does (`pretrain_gpt.py --help`), or drop it.
    """

    code = "GD130"
    name = "unknown-megatron-flag"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "{flag} is not a Megatron-LM flag: Megatron-LM's parser refuses it{hint}"
    fix_template = "Use {use}"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.megatron is None:
            return
        for unknown in ctx.megatron.unknown:
            closest = unknown.hint.removeprefix(" (did you mean ").removesuffix("?)").strip("'")
            use = closest if unknown.hint else f"a flag Megatron-LM's parser knows, or drop {unknown.flag}"
            yield Hit((f"flag.{unknown.flag}",), {"flag": unknown.flag, "hint": unknown.hint, "use": use})


class MegatronRefusesLine(Rule):
    """## What it does
    Reports what Megatron-LM itself refuses on a launch line: a value its argument parser rejects (a choice it does
    not have, a number that does not parse), or a setting its `validate_args` asserts against, with Megatron's own
    message (and its file:line for a bare `assert`); a model parallelism the torchrun line's processes cannot hold.

    ## Why is this bad?
    The job stops at start-up with that message, on every rank. The other rules still judge the line, as given.

    ## Example
    ```
    pretrain_gpt.py --cuda-graph-impl local --enable-cuda-graph
    ```
    (`AssertionError: Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl.`)

    ## Use instead
    ```
    pretrain_gpt.py --cuda-graph-impl local
    ```

    ## Fix
    Change the settings Megatron's message names.
    """

    code = "GD131"
    name = "megatron-refuses-line"
    severity = Severity.ERROR
    fix = FixAvailability.SOMETIMES
    applies_to_inference = True
    template = "{said}"
    fix_template = "Change the settings Megatron-LM's message names"

    def detect(self, ctx: CheckContext) -> Iterator[Hit]:
        if ctx.megatron is not None and ctx.megatron.refusal is not None:
            yield Hit(("megatron_line",), {"said": ctx.megatron.refusal})
