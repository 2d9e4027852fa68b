"""torch.distributed inside a child run: the teardown at its end (process-group destruction)."""

from __future__ import annotations


def teardown_distributed() -> None:
    """Destroy the default process group, when one is initialized (the child runs this under the
    teardown watchdog: graphdoctor.child.stacks.exit_within)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["teardown_distributed"]
