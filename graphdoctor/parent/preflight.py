"""diff's plan-time checks that import Megatron or Transformer Engine, run beside its first children.

Importing Megatron for the rule catalogue's installation refusals, and Transformer Engine's import probe,
take the parent seconds. The first children start at once instead: they spend those seconds importing
torch and building their models, then wait at the gate (graphdoctor.protocol.gate) before their first
training step. A refusal shuts the gate and ends them there, and diff exits 2 as it would have before
starting them; checks that pass open the gate.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from graphdoctor.config import DiffConfig
from graphdoctor.config.impl import Impl
from graphdoctor.protocol.gate import open_gate, shut_gate
from graphdoctor.rules.finding import Finding


class Preflight:
    """refuse_beside_children(config) on a thread, and the gate it opens or shuts; once the checks pass, the same
    thread makes what the report needs of Megatron and of the rule catalogue while the children run: each row's
    static findings and the model's facts (graphdoctor.config.description.model_facts)."""

    def __init__(self, config: DiffConfig, workdir: Path) -> None:
        self.config = config
        self.gate = str(workdir / "gate")
        self._error: BaseException | None = None
        self._checked = threading.Event()
        self._findings: dict[str, list[Finding]] = {}
        self._model: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._run, name="graphdoctor-preflight", daemon=True)

    def start(self) -> Preflight:
        """Begin the checks; returns self."""
        self._thread.start()
        return self

    def _run(self) -> None:
        from graphdoctor.parent.static import refuse_beside_children

        try:
            refuse_beside_children(self.config)
            if Impl.TRANSFORMER_ENGINE in self.config.impls:
                from graphdoctor.parent.availability import te_available

                te_available()  # the probe the rows read (why_unavailable), run here rather than after the children
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread by finish()
            self._error = exc
            return
        finally:
            self._checked.set()
        self._prepare_report()

    def _prepare_report(self) -> None:
        """Each row's static findings and the model's facts, made now; a failure leaves them to be made after."""
        from graphdoctor.config.description import model_facts
        from graphdoctor.parent.static import static_findings

        try:
            for impl in self.config.impls:
                self._findings[impl] = static_findings(self.config, impl)
            self._model = model_facts(self.config.model)
        except Exception:  # noqa: BLE001, S110 - the report makes them itself (and raises there, as before)
            pass

    def findings(self, impl: str) -> list[Finding] | None:
        """The static findings of `impl`'s row (None: not made here, make them now)."""
        return self._findings.get(impl) if self._done() else None

    def model(self, *, wait: bool = True) -> dict[str, Any]:
        """The model's facts: those the thread made (waiting for it unless `wait` is False), else made now (raising
        what model_facts raises)."""
        from graphdoctor.config.description import model_facts

        finished = self._done() if wait else self._thread.ident is not None and not self._thread.is_alive()
        made = self._model if finished else None
        return made if made is not None else model_facts(self.config.model)

    def _done(self) -> bool:
        """Waits for the thread, if it was started; whether it was."""
        if self._thread.ident is None:
            return False
        self._thread.join()
        return True

    def finish(self) -> None:
        """Wait for the checks: open the gate when they pass; shut it and raise their refusal otherwise.

        Raises:
            MissingDependencyError: what refuse_beside_children refused.
        """
        self._checked.wait()
        if self._error is not None:
            shut_gate(self.gate)
            raise self._error
        open_gate(self.gate)

    def abandon(self) -> None:
        """The diff is ending before its checks were read (stopped, failed): waiting children end too."""
        shut_gate(self.gate)


__all__ = ["Preflight"]
