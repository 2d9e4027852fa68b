"""`python -P -m graphdoctor.child.template`: the template process a session forks its children from.

Every child imports torch, Megatron and graphdoctor's child modules before it can build anything; run as
separate interpreters, several children of one diff import them side by side and each pays the whole cost.
The template imports them once (graphdoctor.child.entry.PRELOADED), without touching CUDA, and then forks
one child per request: the child starts with the imports done and creates its own CUDA context, as a
freshly started interpreter would. Torch's DataLoader forks after `import torch` in the same way.

Protocol (JSON lines; graphdoctor.parent.template is the other side):
- out: `{"ready": IMPORT_SECONDS, "env": {...}}` once the imports are done, with the environment as they left
  it (torch's and Megatron's imports set variables of their own, as they do in the parent); `{"error": TEXT}` and exit 3 where CUDA was
  initialised by an import (a forked child could not use the GPU);
- in: `{"id": N, "argv": [SPEC], "env": {...}, "cwd": DIR, "log": PATH}`: fork a child that runs
  `graphdoctor.child SPEC` with exactly that environment, in a session of its own, its output appended to
  PATH;
- out: `{"id": N, "pid": PID}` once the child is the leader of its own session (so the parent's
  process-group signals reach it), `{"id": N, "exit": CODE}` when it ends (negative: killed by that signal);
- in: end of input: the template waits for its children and exits. A child gets SIGTERM from the kernel
  when the template dies (graphdoctor.child.stacks.die_with_parent), and the template when the graphdoctor
  parent does, so nothing outlives the parent.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

from graphdoctor.collector import imports_frozen

NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""Makes torch.cuda.is_available() ask NVML instead of the CUDA driver, so an import that asks does not
initialise CUDA in the template."""

POLL_S = 0.05
"""How often the template looks for children that ended while it waits for requests."""


def _send(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _run_child(request: dict[str, Any], ready_fd: int, template_pid: int) -> None:
    """In the forked process: become a session leader, tell the template so, take the request's
    environment, output and working directory, and run the child to its exit."""
    code = 3
    try:
        os.setsid()
        os.write(ready_fd, b"x")
        os.close(ready_fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        from graphdoctor.protocol.processes import CHILD_MODULE, PARENT_PID_ENV

        os.environ[PARENT_PID_ENV] = str(template_pid)  # the child dies with the template, which dies with the parent
        os.chdir(request["cwd"])
        sys.argv = [CHILD_MODULE, *request["argv"]]
        from graphdoctor.child import entry

        entry.FORKED = True
        entry.main()  # runs the child as `python -m graphdoctor.child SPEC` does, and exits with its status
    except BaseException as exc:  # noqa: BLE001 - whatever happens, this process must not return to the loop
        try:
            os.write(2, f"graphdoctor template child: {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    os._exit(code)


def _fork(request: dict[str, Any], children: dict[int, int]) -> None:
    template_pid = os.getpid()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _run_child(request, write_fd, template_pid)
    os.close(write_fd)
    os.read(read_fd, 1)  # the child leads its own session now (or has died: the read sees end of file)
    os.close(read_fd)
    children[pid] = int(request["id"])
    _send({"id": request["id"], "pid": pid})


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = children.pop(pid, None)
        if ident is not None:
            _send({"id": ident, "exit": os.waitstatus_to_exitcode(status)})


def serve() -> int:
    """Read requests until end of input, forking a child for each; then wait for the children."""
    children: dict[int, int] = {}
    pending = b""
    open_input = True
    while open_input or children:
        if open_input:
            readable, _, _ = select.select([0], [], [], POLL_S)
            if readable:
                chunk = os.read(0, 65536)
                if not chunk:
                    open_input = False
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        _fork(json.loads(line), children)
        else:
            time.sleep(POLL_S)
        _reap(children)
    return 0


def main() -> None:
    """Import, say ready (or why not), serve."""
    began = time.time()
    os.environ.setdefault(NVML_CHECK_ENV, "1")
    with imports_frozen():
        from graphdoctor.child.stacks import die_with_parent

        die_with_parent()
        import warnings

        warnings.filterwarnings("ignore")  # megatron and torch warn at every import
        from graphdoctor.child.entry import preload

        preload()
        import torch

    if torch.cuda.is_initialized():
        _send({"error": "an import initialised CUDA in the template process: children cannot be forked from it"})
        os._exit(3)
    warnings.resetwarnings()
    # torch's import leaves one native thread that holds no lock a child needs (DataLoader workers fork the same way)
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning)
    _send({"ready": round(time.time() - began, 3), "env": dict(os.environ)})  # as the imports left it
    os._exit(serve())


if __name__ == "__main__":
    main()
