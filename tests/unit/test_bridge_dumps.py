"""Real Megatron-Bridge 0.6.2 recipe dumps and Megatron PretrainConfigContainer YAMLs (fixtures/bridge/real/,
written by their owners' own `to_yaml`, fixtures/bridge/record_bridge_dumps.py): `check` reads each without a
traceback, `diff --plan --fit --num-layers 2` describes the recipe's own model, field by field against the facts
its provider object held, and the bad dumps give exactly Bridge's refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from graphdoctor.cli import main

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "bridge" / "real"
DUMPS = sorted(p.name for p in REAL.glob("*.yaml"))
GOOD = [name for name in DUMPS if not name.startswith("bad_")]
REFUSED = {"bad_local_attn": "GD141", "bad_full_iteration_nan_check": "GD142", "bad_no_te_rng_tracker": "GD143"}
"""Each bad dump and the rule that quotes Bridge's refusal (fixtures/bridge/real/<name>.refusal.txt)."""


def _facts(name: str) -> dict[str, Any]:
    stem = name.removesuffix(".yaml")
    stage = "post" if stem.endswith(".post") else "pre"
    data = json.loads((REAL / f"{stem.rsplit('.', 1)[0] if '.' in stem else stem}.facts.json").read_text())
    return data.get(stage) or data.get("post") or data["facts"]  # a container's: `facts`


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("name", DUMPS)
def test_check_reads_every_real_dump(name: str) -> None:
    code, out, err = _invoke("check", str(REAL / name), "--format", "json")
    assert code in (0, 1), err
    assert "Traceback" not in out + err
    findings = json.loads(out)["findings"]
    stem = name.split(".")[0]
    bridge = {f["code"] for f in findings if f["code"] in ("GD141", "GD142", "GD143", "GD144", "GD145")}
    assert bridge == ({REFUSED[stem]} if stem in REFUSED else set()), findings


@pytest.mark.parametrize("stem", sorted(REFUSED))
def test_the_bad_dumps_give_bridges_own_words(stem: str) -> None:
    lines = (REAL / f"{stem}.refusal.txt").read_text().splitlines()
    words = next(x for x in lines if x.startswith("message: ")).removeprefix("message: ").strip()
    for name in (n for n in DUMPS if n.startswith(stem)):
        _, out, _ = _invoke("check", str(REAL / name), "--format", "json")
        (finding,) = [f for f in json.loads(out)["findings"] if f["code"] == REFUSED[stem]]
        assert words[:60] in finding["message"], (words, finding["message"])


def _expected_line(facts: dict[str, Any]) -> list[str]:
    """The parts of the plan's model line the recipe's own provider decides."""
    parts = [f"{facts['hidden_size']}"]
    experts = facts.get("num_moe_experts")
    if experts:
        parts += [f"MoE {experts} experts top-{facts['moe_router_topk']}", f"expert ffn {facts['moe_ffn_hidden_size']}"]
    else:
        parts.append(f"ffn {facts['ffn_hidden_size']}")
    if facts.get("multi_latent_attention"):
        parts += ["(MLA)", f"kv_lora {facts['kv_lora_rank']}", f"v {facts['v_head_dim']}"]
    else:
        groups = facts.get("num_query_groups") or facts["num_attention_heads"]
        parts.append(f"{facts['num_attention_heads']} heads" + (f" / {groups} query groups" if groups !=
                                                                   facts["num_attention_heads"] else ""))
    parts.append(str(facts["normalization"]))
    parts.append(f"{facts['activation_func']}{' gated' if facts['gated_linear_unit'] else ''}")
    position = facts.get("position_embedding_type")
    parts.append(f"rope (base {facts['rotary_base']}" if position == "rope" else str(position))
    if facts.get("fp8"):
        parts.append(f"fp8 {facts['fp8']} {facts['fp8_recipe']}")
    parts.append("bf16" if facts.get("bf16") else "fp16" if facts.get("fp16") else "fp32")
    pattern = facts.get("hybrid_layer_pattern") or facts.get("hybrid_override_pattern")
    if pattern:
        parts.append("hybrid ")
    return parts


@pytest.mark.parametrize("name", GOOD)
def test_the_plan_describes_the_recipes_own_model(name: str) -> None:
    code, out, err = _invoke("diff", "--plan", "--fit", "--num-layers", "2", "--config", str(REAL / name))
    assert code in (0, 1), err
    (line,) = [x for x in out.splitlines() if x.startswith("  model: ")]
    facts = _facts(name)
    if name.startswith("container_"):  # the dump leaves functions out: Megatron's own loader builds gelu
        assert "activation_func is not in the file" in out + err
        facts = {**facts, "activation_func": "gelu"}
    for part in _expected_line(facts):
        assert part in line, (part, line)
    kinds = 3 if (facts.get("hybrid_layer_pattern") or facts.get("hybrid_override_pattern")) else 2
    assert line.startswith(f"  model: {kinds} layers x ")
    (header,) = [x for x in out.splitlines() if x.startswith("graphdoctor diff --plan: ")]
    assert "mbs" in header and "x1," in header  # --fit: one micro-batch per step, not the cluster's hundreds
    notes = out + err
    assert "--fit:" in notes
    if facts.get("eval_iters") or facts.get("validation", {}).get("eval_iters"):
        assert "evaluation" in notes
