"""Obtaining one diff's children: asked for ahead (prefetch), waited for (obtain), cancelled once the first
results rule them out (prune, close). `ChildSchedule` is also the verdict tree's runs (graphdoctor.diff.decide.Runs)
for `graphdoctor diff`, over one ChildSession and one scratch directory."""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from graphdoctor.compare.prints import differing_steps
from graphdoctor.parent.children import ChildRequest, ChildSession
from graphdoctor.protocol.record import RunRecord
from graphdoctor.protocol.spec import EAGER, Role


def _scratch_dir(workdir: Path, name: str) -> Path:
    """A directory for reference tensors: /dev/shm when it has room, else the work directory."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and shutil.disk_usage(shm).free > (2 << 30) else workdir
    return Path(tempfile.mkdtemp(prefix=f"graphdoctor-{name}-", dir=root))


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


class ChildSchedule:
    """The children of one diff (or of one advise candidate), each started once however often it is asked for."""

    def __init__(self, session: ChildSession) -> None:
        self.session = session
        self.config = session.config
        self.ref_dir = _scratch_dir(session.workdir, "ref")
        self.scratch_bytes = 0
        self.first: list[ChildRequest] = []
        """The first children: the eager reference, then each runnable implementation (stopped_report)."""
        self._futures: dict[ChildRequest, Future[RunRecord]] = {}
        """Every child asked for, started or waiting for a GPU slot (obtain reads them)."""
        self._used: set[ChildRequest] = set()

    def request(self, impl: str, dropout: float, role: Role, **kwargs: Any) -> ChildRequest:
        """A child request against this diff's scratch directory."""
        return ChildRequest(impl, dropout, role, self.ref_dir, **kwargs)

    def prefetch(self, request: ChildRequest) -> None:
        """Start `request` as soon as a GPU slot is free (once: a second ask is the same child)."""
        if request not in self._futures:
            self._futures[request] = self.session.submit(request)

    def obtain(self, request: ChildRequest) -> RunRecord:
        """The record of `request`: of the child already asked for, or of one started now."""
        self.prefetch(request)
        self._used.add(request)
        return self._futures[request].result()

    def control_requests(self, impl: str) -> list[ChildRequest]:
        """The dropout-free control pair of `impl` (its reference is shared by every implementation)."""
        return [self.request(EAGER, 0.0, Role.REFERENCE), self.request(impl, 0.0, Role.GRAPHED)]

    def tapped_requests(self, impl: str) -> list[ChildRequest]:
        """The tapped pair of `impl` (its eager run is shared by every implementation)."""
        dropout = self.config.dropout
        return [self.request(EAGER, dropout, Role.TAPPED, taps=True), self.request(impl, dropout, Role.TAPPED, taps=True)]

    def speculative(self, runnable: list[str]) -> list[ChildRequest]:
        """The children a divergence of the first runs would need next, started beside them: at dropout > 0 the
        control pair of every implementation and, when forensics are automatic, the tapped pair."""
        cfg = self.config
        if cfg.dropout <= 0:
            return []
        wanted = [r for impl in runnable for r in self.control_requests(impl)]
        if cfg.localize is None:
            wanted += [r for impl in runnable for r in self.tapped_requests(impl)]
        return list(dict.fromkeys(wanted))

    def measure_requests(self, reference: RunRecord, graphed: RunRecord) -> list[ChildRequest]:
        """The re-run pair that measures where the fingerprints differ (VerdictTree.measure); none where they
        do not."""
        names = graphed.tensor_names or reference.tensor_names
        steps = differing_steps(names, reference.steps, graphed.steps)
        if not steps:
            return []
        io_steps = steps if not self.config.bitwise else steps[:1]
        scratch = self.ref_dir / f"d{graphed.dropout:g}"
        scratch.mkdir(exist_ok=True)
        last = max(io_steps)
        return [ChildRequest(EAGER, graphed.dropout, Role.REFERENCE, scratch, io_steps=io_steps, stop_after=last),
                ChildRequest(graphed.impl, graphed.dropout, Role.GRAPHED, scratch, io_steps=io_steps, stop_after=last)]

    def prefetch_measure(self, reference: RunRecord, graphed: RunRecord) -> None:
        """Start the measuring pair of a divergence now, beside the rest."""
        for request in self.measure_requests(reference, graphed):
            self.prefetch(request)

    def prune(self, diverged: list[str]) -> None:
        """After the first runs: cancel the speculative children of every implementation not in `diverged`
        (it matched, or failed)."""
        keep = {r for impl in diverged for r in (*self.control_requests(impl), *self.tapped_requests(impl))}
        self.session.cancel([f for r, f in self._futures.items()
                             if r not in keep and r not in self.first and not r.targeted and r not in self._used],
                            wait=False)

    def cancel_all(self) -> None:
        """Cancel every child asked for (the plan-time checks refused the run)."""
        self.session.cancel(list(self._futures.values()))

    def close(self) -> None:
        """Cancel the children nobody read, end the session's workers and remove the scratch directory."""
        self.session.cancel([f for r, f in self._futures.items() if r not in self._used])
        self.session.close()
        shutil.rmtree(self.ref_dir, ignore_errors=True)

    # The verdict tree's runs (graphdoctor.diff.decide.Runs).

    def control_reference(self) -> RunRecord:
        """The dropout-free eager reference (one child per diff, shared by every control pair)."""
        return self.obtain(self.request(EAGER, 0.0, Role.REFERENCE))

    def control(self, impl: str) -> RunRecord:
        """`impl` graphed without dropout: the graphed half of its control pair."""
        return self.obtain(self.control_requests(impl)[1])

    def saved(self, request: ChildRequest) -> RunRecord:
        """The eager half of a measuring pair (one child per dropout and steps), counting the tensors it saved."""
        record = self.obtain(request)
        self.scratch_bytes = max(self.scratch_bytes, _tree_bytes(self.ref_dir))
        return record

    def compared(self, request: ChildRequest) -> RunRecord:
        """The graphed half of a measuring pair."""
        return self.obtain(request)

    def eager_again(self, dropout: float) -> RunRecord:
        """Eager once more at `dropout`, as a second run to hold against the reference (eager noise)."""
        return self.obtain(self.request(EAGER, dropout, Role.GRAPHED))

    def tapped_pair(self, impl: str) -> tuple[RunRecord, RunRecord]:
        """The eager run with taps (once per diff, shared by every implementation) and `impl`'s."""
        tapped_ref, tapped = self.tapped_requests(impl)
        return self.obtain(tapped_ref), self.obtain(tapped)

    def hunt(self, impl: str) -> RunRecord:
        """`impl` again with sync errors raised at their call site during capture (the culprit hunt)."""
        return self.obtain(self.request(impl, self.config.dropout, Role.GRAPHED, hunt=True))


__all__ = ["ChildSchedule"]
