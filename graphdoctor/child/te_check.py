"""`python -P -m graphdoctor.child.te_check`: does transformer_engine.pytorch import here?

Prints `ok` or `no: <reason>` on its last line. Run in a child because loading TE's compiled library
can crash or hang a process (a CUDA or torch mismatch).
"""

from __future__ import annotations

from graphdoctor.child.megatron_setup import have_transformer_engine


def main() -> None:
    """Print the verdict line."""
    ok, why = have_transformer_engine()
    print("ok" if ok else f"no: {why}")


if __name__ == "__main__":
    main()
