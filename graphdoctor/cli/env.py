"""`graphdoctor env`: the facts of this machine (torch, CUDA, NCCL, TE, GPU, job environment) that
`check --target FILE` judges a run file against; run it on the training machine.
"""

from __future__ import annotations

import json
import os

import click


def env_payload(gpu_arch: str | None = None) -> dict[str, object]:
    """The `env` JSON payload: `facts` of this machine, its GPUs and the relevant environment."""
    import torch

    from graphdoctor.rules.facts import detect_facts
    from graphdoctor.rules.target import relevant_env

    facts = detect_facts(gpu_arch)
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            gpus.append({"index": index, "name": torch.cuda.get_device_name(index), "sm": f"sm_{major}{minor}"})
    data = facts.to_dict()
    data["env"] = relevant_env(os.environ)
    return {"facts": data, "gpus": gpus}


@click.command("env")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="Print JSON for `graphdoctor check --target FILE`. Default: a text summary.")
@click.option("--gpu-arch", metavar="SM", default=None,
              help="Record this compute capability instead of the visible GPU's. Default: the GPU's.")
def env_command(as_json: bool, gpu_arch: str | None) -> None:
    """Record this machine's torch, CUDA, NCCL, Transformer Engine, GPU architecture and relevant
    environment variables: `graphdoctor env --json > target.json` on the training machine, then
    `graphdoctor check --target target.json run.yaml` anywhere."""
    from graphdoctor.envelope import envelope

    payload = env_payload(gpu_arch)
    if as_json:
        click.echo(json.dumps(envelope("env", payload), indent=2))
        return
    facts = payload["facts"]
    assert isinstance(facts, dict)
    for key in ("torch_version", "cuda_version", "nccl_version", "te_version", "te_has_torch_extension",
                "torch_has_stale_capture_override", "torch_has_graph_safe_rng", "apex_installed", "gpu_capability"):
        click.echo(f"{key}: {facts.get(key)}")
    for gpu in payload["gpus"]:  # type: ignore[attr-defined]
        click.echo(f"gpu {gpu['index']}: {gpu['name']} ({gpu['sm']})")
    for name, value in facts["env"].items():
        click.echo(f"env {name}={value}")


__all__ = ["env_command", "env_payload"]
