"""Run-file loading and DiffConfig validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphdoctor.config import DiffConfig, RunFile, diff_config_from, load_run_file
from graphdoctor.errors import InputFileError, UsageError


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_run_file_three_sections(tmp_path: Path) -> None:
    path = write(tmp_path, "transformer:\n  num_layers: 2\n  hidden_dropout: 0.0\n"
                           "env:\n  CUDA_DEVICE_MAX_CONNECTIONS: 1\nrun:\n  steps: 6\n")
    run = load_run_file(path)
    assert run.transformer == {"num_layers": 2, "hidden_dropout": 0.0}
    assert run.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    config = diff_config_from(run)
    assert config.steps == 6
    assert config.num_layers == 2
    assert config.dropout == 0.0
    assert config.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_flags_override_run_file(tmp_path: Path) -> None:
    run = load_run_file(write(tmp_path, "run:\n  steps: 6\n  impls: [local]\n"))
    config = diff_config_from(run, steps=9, impls="local,full_iteration")
    assert config.steps == 9
    assert config.impls == ("local", "full_iteration")


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    assert diff_config_from(load_run_file(write(tmp_path, ""))) == DiffConfig()


@pytest.mark.parametrize(("text", "needle"), [
    ("model:\n  x: 1\n", "unknown section 'model'"),
    ("run:\n  stepz: 3\n", "run.stepz"),
    ("run: [1, 2]\n", "section 'run' must be a mapping"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("run:\n  steps: [\n", "not valid YAML at line"),
    ("env:\n  A: {b: 1}\n", "env.A must be a scalar"),
])
def test_bad_run_files(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises((InputFileError, UsageError)) as info:
        load_run_file(write(tmp_path, text))
    assert needle in str(info.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        load_run_file(tmp_path / "missing.yaml")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputFileError, match="not UTF-8"):
        load_run_file(path)


@pytest.mark.parametrize(("changes", "field"), [
    ({"impls": ("eager",)}, "impl"),
    ({"impls": ()}, "impls"),
    ({"impls": ("local", "local")}, "impls"),
    ({"num_layers": 0}, "num_layers"),
    ({"hidden_size": 100, "num_attention_heads": 8}, "hidden_size"),
    ({"dtype": "fp8"}, "dtype"),
    ({"dropout": 1.0}, "dropout"),
    ({"cuda_graph_warmup_steps": 0}, "cuda_graph_warmup_steps"),
    ({"steps": 3}, "steps"),
    ({"rtol": -1.0}, "rtol"),
    ({"timeout_s": 0.0}, "timeout_s"),
    ({"layer_spec": "not a path"}, "layer_spec"),
    ({"model_provider": "pkg.mod"}, "model_provider"),
])
def test_diff_config_validation_names_field(changes: dict, field: str) -> None:
    with pytest.raises(UsageError) as info:
        DiffConfig(**changes)
    assert str(info.value).startswith(f"{field}:")
    assert "expected" in str(info.value)


def test_wrong_type_in_run_section(tmp_path: Path) -> None:
    # refused when the run file is read (one schema for check and diff), with the line
    with pytest.raises(UsageError, match=r"run.yaml:2: run.steps: expected an integer >= 1, got 'eight'"):
        load_run_file(write(tmp_path, "run:\n  steps: eight\n"))
    with pytest.raises(UsageError, match="steps: got 'eight'"):
        diff_config_from(RunFile(path="<mapping>", transformer={}, env={}, run={"steps": "eight"}))


def test_bitwise_policy() -> None:
    assert DiffConfig().bitwise
    assert not DiffConfig(rtol=1e-5).bitwise


def test_env_keys_that_change_startup_are_refused_unless_allowed() -> None:
    import pytest

    from graphdoctor.config import DiffConfig
    from graphdoctor.errors import UsageError

    with pytest.raises(UsageError, match="LD_PRELOAD changes how Python or the loader start"):
        DiffConfig(env={"LD_PRELOAD": "/tmp/x.so", "NCCL_DEBUG": "INFO"})
    allowed = DiffConfig(env={"PYTHONPATH": "/opt/models"}, allow_env=("PYTHONPATH",))
    assert allowed.env["PYTHONPATH"] == "/opt/models"
    assert DiffConfig.from_dict(allowed.to_dict()) == allowed
    assert DiffConfig(env={"NCCL_DEBUG": "INFO"}).env == {"NCCL_DEBUG": "INFO"}
