"""Shrinking a model to fewer layers while it stays the user's model: the per-layer patterns (MoE layer frequency,
a hybrid model's layer pattern) keep every kind of layer they had, in their order, and a pipeline layout goes
with the pipeline it described; what cannot be shrunk that way is refused with the reason.

Pure: strings and lists in, strings and lists out (the launch line's and run file's own forms).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphdoctor.errors import UsageError

HYBRID_LAYER_SYMBOLS: frozenset[str] = frozenset("MG*D+-E")
"""Layer symbols of a hybrid pattern (megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols)."""
PIPE, MTP_SEPARATOR = "|", "/"


def layer_kinds(pattern: Any) -> int:
    """The kinds of layer a hybrid layer pattern holds (its decoder's, before any MTP part); 1 without one."""
    if not isinstance(pattern, str) or not pattern:
        return 1
    return max(1, len({c for c in pattern.split(MTP_SEPARATOR)[0] if c in HYBRID_LAYER_SYMBOLS}))


def keep_kinds(kinds: Sequence[Any], num_layers: int, what: str) -> list[Any]:
    """`num_layers` of the layers, in order: the first layer of each kind, then the earliest others.

    Raises:
        UsageError: fewer layers than kinds of layer (one kind would be lost).
    """
    if num_layers >= len(kinds):
        if num_layers > len(kinds):
            raise UsageError(f"--num-layers {num_layers}: {what} describes {len(kinds)} layers; diff shrinks a "
                             "pattern, it does not grow one")
        return list(kinds)
    firsts = list(dict.fromkeys(kinds))
    if num_layers < len(firsts):
        shown = ", ".join(map(str, firsts))
        raise UsageError(f"--num-layers {num_layers}: {what} has {len(firsts)} kinds of layer ({shown}); "
                         f"keeping each needs --num-layers {len(firsts)} or more")
    chosen = {kinds.index(kind) for kind in firsts}
    for index in range(len(kinds)):
        if len(chosen) == num_layers:
            break
        chosen.add(index)
    return [kinds[i] for i in sorted(chosen)]


def shrink_moe_layer_freq(pattern: int | list[int], num_layers: int) -> int | list[int]:
    """An MoE layer frequency for `num_layers` layers: an int (every N-th layer) as it is, a per-layer list
    shrunk by keep_kinds (dense and MoE layers both kept).

    Raises:
        UsageError: see keep_kinds.
    """
    if isinstance(pattern, int):
        return pattern
    return keep_kinds(pattern, num_layers, "--moe-layer-freq")


def shrink_hybrid_pattern(pattern: str, num_layers: int) -> str:
    """A hybrid layer pattern for `num_layers` decoder layers: pipeline separators dropped (diff's pipeline
    placement decides the stages), the layers shrunk by keep_kinds, the MTP part after `/` kept as it is.

    Raises:
        UsageError: see keep_kinds; a symbol Megatron does not know.
    """
    main, sep, mtp = pattern.partition(MTP_SEPARATOR)
    layers = [c for c in main if c != PIPE]
    unknown = sorted(set(layers) - HYBRID_LAYER_SYMBOLS)
    if unknown:
        raise UsageError(f"--hybrid-layer-pattern: got {unknown[0]!r}, expected layer symbols of "
                         f"{''.join(sorted(HYBRID_LAYER_SYMBOLS))}, {PIPE} and {MTP_SEPARATOR}")
    return "".join(keep_kinds(layers, num_layers, "--hybrid-layer-pattern")) + sep + mtp


def hybrid_layer_count(pattern: str) -> int:
    """Decoder layers of a hybrid pattern (its symbols before the MTP separator)."""
    return sum(c in HYBRID_LAYER_SYMBOLS for c in pattern.partition(MTP_SEPARATOR)[0])


def format_freq(pattern: int | list[int]) -> str:
    """A --moe-layer-freq value Megatron-LM's parser reads back (`[0,1]`, `2`)."""
    return str(pattern) if isinstance(pattern, int) else "[" + ",".join(map(str, pattern)) + "]"


__all__ = ["layer_kinds", "HYBRID_LAYER_SYMBOLS", "format_freq", "hybrid_layer_count", "keep_kinds", "shrink_hybrid_pattern",
           "shrink_moe_layer_freq"]
