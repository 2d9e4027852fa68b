"""One `path:line` format for probes and taps."""

from __future__ import annotations

import os

from graphdoctor.locations import format_location, short_path


def test_installed_packages_are_package_relative() -> None:
    path = "/usr/lib/python3.12/site-packages/megatron/core/transformer/mlp.py"
    assert short_path(path) == "megatron/core/transformer/mlp.py"
    assert format_location(path, 7) == "megatron/core/transformer/mlp.py:7"


def test_files_under_the_working_directory_are_relative_to_it() -> None:
    assert short_path(os.path.join(os.getcwd(), "fixtures", "planted", "x.py")) == os.path.join(
        "fixtures", "planted", "x.py")


def test_a_checkout_outside_the_working_directory_is_cut_at_its_package_root() -> None:
    assert short_path("/nonexistent/Megatron-LM/megatron/core/utils.py") == "megatron/core/utils.py"


def test_other_paths_and_pseudo_files_are_kept() -> None:
    assert short_path("/nonexistent/elsewhere/model.py") == "/nonexistent/elsewhere/model.py"
    assert short_path("<string>") == "<string>"
