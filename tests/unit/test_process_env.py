"""A child's environment is never taken while a launch line's parse borrows os.environ on another thread
(graphdoctor.process_env): the parent resolves its graphed children's models on worker threads while other workers
build their children's environments."""

from __future__ import annotations

import os
import threading
import time

from graphdoctor.config.megatron_line import _megatron_process
from graphdoctor.parent.runner import child_env

PLANTED = "GRAPHDOCTOR_TEST_PARSE_ONLY"


def test_child_env_never_sees_a_parse_in_progress() -> None:
    assert PLANTED not in os.environ
    world = os.environ.get("WORLD_SIZE")
    stop = threading.Event()
    parses = 0

    def parse_again_and_again() -> None:
        nonlocal parses
        while not stop.is_set():
            with _megatron_process(["--num-layers", "2"], 8, {PLANTED: "1"}, (9, 0)):
                time.sleep(0.002)  # the parse itself
            parses += 1

    parser = threading.Thread(target=parse_again_and_again)
    parser.start()
    seen = []
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            env = child_env()
            seen.append((PLANTED in env, env.get("WORLD_SIZE") != world, "PATH" not in env))
    finally:
        stop.set()
        parser.join()
    assert parses > 10 and len(seen) > 10
    assert not any(any(flags) for flags in seen), [flags for flags in seen if any(flags)][:3]
    assert PLANTED not in os.environ and os.environ.get("WORLD_SIZE") == world
