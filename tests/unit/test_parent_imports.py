"""The parent starts its first children before it imports torch: resolving a child's model from graphdoctor's own
GPT model (ChildSession._child_model, config.child_model) encodes plain values without importing torch, which
would take seconds (3.0-3.2 s before the first child on the H100 while it did). Checked in a fresh interpreter,
where nothing else has imported torch yet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from graphdoctor.config.codec import decode, encode

PROBE = """
import sys
from graphdoctor.config import DiffConfig
from graphdoctor.config.child_model import child_model
for impl in ("local", "full_iteration"):
    for dropout in (0.1, 0.0):
        child_model(DiffConfig(impls=("local", "full_iteration")), impl, dropout)
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""


def test_a_builtin_child_model_resolves_without_importing_torch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "torch not imported"


def test_a_dtype_still_encodes_once_torch_is_imported() -> None:
    encoded = encode({"params_dtype": torch.bfloat16, "hidden_size": 64})
    assert encoded == {"params_dtype": {"_target_": "torch.bfloat16", "_call_": False}, "hidden_size": 64}
    assert decode(encoded) == {"params_dtype": torch.bfloat16, "hidden_size": 64}


ORDER = """
import json
import sys
from pathlib import Path
from graphdoctor.config import DiffConfig
from graphdoctor.diff import DiffRun
from graphdoctor.parent.preflight import Preflight
from tests.unit.sessions import DeferredSession

seen = []

class Session(DeferredSession):
    def __init__(self, workdir):
        self.config = DiffConfig(impls=("local", "full_iteration"))
        self.workdir = workdir

    def submit(self, request):
        seen.append(("child", "torch" in sys.modules))
        return super().submit(request)

    def run_request(self, request):
        raise AssertionError("no child runs here")

class Stop(Exception):
    pass

class Checks(Preflight):
    def start(self):
        seen.append(("checks", "torch" in sys.modules))
        raise Stop

workdir = Path(sys.argv[1])
try:
    DiffRun(Session(workdir), Checks(DiffConfig(), workdir)).run_all()
except Stop:
    pass
print(json.dumps(seen))
"""


def test_the_parent_imports_torch_whole_after_its_first_children_and_before_its_checks_thread(tmp_path: Path) -> None:
    """Children are asked for before torch is imported, the plan-time checks (whose thread imports Megatron) only
    after it is: no thread imports part of torch while another imports the whole (graphdoctor.diff.decide
    import_torch_whole)."""
    done = subprocess.run([sys.executable, "-c", ORDER, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          check=False, cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    children = [imported for what, imported in seen if what == "child"]
    assert children and not any(children)
    assert seen[-1] == ["checks", True]


EARLY = """
import json
import sys
import threading
from graphdoctor.cli import diff as cli_diff
from graphdoctor.parent import template

cli_diff.children_may_run_here = lambda values: True  # as on a GPU machine
asked = []
real_init = template.ForkTemplate.__init__

def init(self, *args, **kwargs):
    asked.append(sorted(m for m in sys.modules if m == "torch" or m.startswith("graphdoctor.")))
    real_init(self, *args, **kwargs)

template.ForkTemplate.__init__ = init
before = [t.name for t in threading.enumerate()]
cli_diff.start_template_early(cli_diff._under_torchrun({}))  # in diff_command's order
started = template._early is not None
torch = sys.modules.get("torch")
whole = torch is not None and hasattr(torch, "dtype") and hasattr(torch, "cuda")
template.close_early()
print(json.dumps({"threads_before": before, "started": started, "whole": whole, "asked": asked}))
"""


def test_graphdoctor_diff_starts_the_template_then_imports_torch_whole_before_any_worker() -> None:
    """On a machine that may run children, `graphdoctor diff` starts the early template and imports torch whole on
    its main thread before it reads the run, so no worker, checks or progress thread can import part of torch
    beside it; only the main thread existed before."""
    done = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True, timeout=300, check=False,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    asked = seen.pop("asked")
    assert seen == {"threads_before": ["MainThread"], "started": True, "whole": True}
    # The template is asked for before the command imports the diff, the launcher or the events: each tenth of a
    # second here is one the template's imports start later than a bare process's would.
    assert len(asked) == 1
    late = [m for m in asked[0] if m == "torch" or m.split(".")[:2] == ["graphdoctor", "diff"]
            or m in ("graphdoctor.parent.launch", "graphdoctor.protocol.events", "graphdoctor.protocol.record")]
    assert late == []
