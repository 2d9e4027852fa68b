"""Multi-GPU children from the parent's side: each child's ranks start with torch's own launcher
(`python -P -m torch.distributed.run --standalone --nproc-per-node N -m graphdoctor.child SPEC`, one
rendezvous per child on a port the launcher picks), isolated like every child (parent.runner), and
their per-rank event files fold into one RunRecord (parent.ranks).

Also the other direction: a user who starts `torchrun ... -m graphdoctor diff` gets rank 0 running
the diff over all the launched processes and the other ranks leaving at once (under_user_torchrun).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from graphdoctor.parent.fold import record_from_events
from graphdoctor.parent.runner import ProcessResult, child_env, run_isolated
from graphdoctor.parent.torchrun import TORCHRUN_VARIABLES
from graphdoctor.protocol.events import End, read_events
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import ChildSpec, Placement, rank_path

LAUNCHER_MODULE = "torch.distributed.run"

MULTICAST_OFF_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast stays off in every rank (unless the user or the run file set these)."""


def multi_gpu_placement(nproc: int, tp: int, pp: int) -> Placement:
    """The placement a multi-GPU child's spec carries (each rank reads its own from the launcher)."""
    return Placement(world_size=nproc, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                     launcher=True)


def launch_command(spec_path: Path, nproc: int) -> list[str]:
    """torch.distributed.run for one child: standalone (its own rendezvous on a free port), N ranks."""
    from graphdoctor.protocol.processes import launcher_command

    # Through graphdoctor.child.stacks (protocol.processes.launcher_command): the launcher, too, dumps its stack at a timeout (SIGUSR1).
    return launcher_command("--standalone", "--nproc-per-node", str(nproc), "-m", "graphdoctor.child",
                            str(spec_path))


def launch_env(run_env: Mapping[str, str] | None, devices: str | None) -> dict[str, str]:
    """Every rank's environment: a child's (parent.runner.child_env, the run file's env: included),
    multicast off unless set, no outer torchrun's variables, the working directory kept off the ranks'
    import path (the launcher starts them without -P), and the child's GPUs."""
    env = child_env(run_env)
    for key in TORCHRUN_VARIABLES:
        if key not in (run_env or {}):
            env.pop(key, None)
    for key, value in MULTICAST_OFF_ENV.items():
        env.setdefault(key, value)
    env["PYTHONSAFEPATH"] = "1"
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


def rank_result(ended: ProcessResult, has_end: bool) -> ProcessResult:
    """How one rank ended, from how its launcher ended: a rank that wrote its end event has its
    result, whatever its tear-down did afterwards (results are written before tear-down)."""
    if has_end:
        return dataclasses.replace(ended, returncode=0, timed_out=False)
    return ended


def fold_launch(spec: ChildSpec, ended: ProcessResult) -> RunRecord:
    """Read every rank's events and fold them (parent.ranks.fold_ranks)."""
    from graphdoctor.parent.hangs import stopped_outcome, teardown_exits, timeout_outcome
    from graphdoctor.parent.ranks import fold_ranks

    nproc = spec.placement.world_size
    records = []
    logs = {}
    for rank in range(nproc):
        rank_spec = dataclasses.replace(spec, events_path=rank_path(spec.events_path, rank, nproc))
        logs[rank] = log = read_events(rank_spec.events_path)
        records.append(record_from_events(rank_spec, log, rank_result(ended, log.first(End) is not None)))
    folded = fold_ranks(records, wall_s=ended.wall_s)
    teardown = teardown_exits(logs, ended.stacks)
    if ended.timed_out:  # one diagnosis from every rank's phase, last step and stack (hang or timeout)
        status, diagnosis = timeout_outcome(spec.config.timeout_s, logs, ended.stacks, ended.group_gone,
                                            ended.left_running)
        return dataclasses.replace(folded, status=status, diagnosis=diagnosis, teardown=teardown)
    if ended.stopped is not None and any(log.first(End) is None for log in logs.values()):
        status, diagnosis = stopped_outcome(ended.stopped, logs, ended.stacks)
        return dataclasses.replace(folded, status=status, diagnosis=diagnosis, teardown=teardown)
    return dataclasses.replace(folded, teardown=teardown)


def run_launched(spec: ChildSpec, spec_path: Path, log_path: Path, env: dict[str, str]) -> RunRecord:
    """Start one multi-GPU child's ranks with the launcher, isolated with the child timeout; fold them."""
    nproc = spec.placement.world_size
    for rank in range(nproc):
        Path(rank_path(spec.events_path, rank, nproc)).unlink(missing_ok=True)
    ended = run_isolated(launch_command(spec_path, nproc), timeout_s=spec.config.timeout_s, log_path=log_path,
                         env=env, stacks_prefix=spec_path.parent / f"stacks-{spec.name}")
    return fold_launch(spec, ended)


__all__ = ["LAUNCHER_MODULE", "MULTICAST_OFF_ENV", "fold_launch", "launch_command", "launch_env",
           "multi_gpu_placement", "rank_result", "run_launched"]
