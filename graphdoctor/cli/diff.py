"""`graphdoctor diff` (placeholder until the harness lands)."""

from __future__ import annotations

import click


@click.command("diff")
def diff_command() -> None:
    """Run a Megatron-Core model eager and graphed side by side and give a verdict."""
