"""The model diff builds is the model Megatron-LM builds from the same line: for Megatron-LM's Llama-3 8B and
Mixtral 8x7B examples and a DeepSeek-style MLA + MTP line, every TransformerConfig field and every GPTModelConfig
field (what GPTModelBuilder passes GPTModel) are equal between Megatron-LM's own `core_transformer_config_from_args`
/ `gpt_config_from_args` on the argv and graphdoctor's resolve, but for graphdoctor's documented overrides
(docs/diff.md "The model"): the layer count the user shrinks to, the graph settings per implementation, the CPU
initialisation, and the processes. The layer and MTP block specs are compared where Megatron can build them here.

On this CPU machine without Transformer Engine one flag is added to the examples as written: --no-rope-fusion
(rotary fusion is Transformer Engine's kernel, which Megatron's TransformerConfig asks for); the GPU test
tests/gpu/test_model_description_gpu.py compares the lines as written where Transformer Engine imports.
"""

from __future__ import annotations

import pytest
from megatron_reference import SHRINK, assert_same_model, graphdoctor_config

CPU_FLAGS = ["--no-rope-fusion"]


@pytest.mark.parametrize("name", sorted(SHRINK))
@pytest.mark.parametrize("impl", ["eager", "full_iteration", "local", "transformer_engine"])
def test_every_field_is_megatron_lms_own(name: str, impl: str) -> None:
    assert_same_model(name, impl, CPU_FLAGS)


def test_the_lines_are_the_models_users_train() -> None:
    """What each resolved model is, as the header and JSON show it."""
    llama, mixtral, deepseek = (graphdoctor_config(n, CPU_FLAGS).model
                                for n in ("llama3_8b", "mixtral_8x7b", "deepseek_mla_mtp"))
    assert llama is not None and mixtral is not None and deepseek is not None
    assert (llama.value("position_embedding_type"), llama.value("share_embeddings_and_output_weights"),
            llama.value("activation_func"), llama.value("num_query_groups"), llama.value("normalization")) == \
        ("rope", False, "torch.nn.functional.silu", 8, "RMSNorm")
    assert (llama.value("fp8"), llama.value("transformer_impl"), llama.value("hidden_size")) == \
        ("hybrid", "transformer_engine", 4096)
    assert (mixtral.value("num_moe_experts"), mixtral.value("moe_router_topk"),
            mixtral.value("moe_token_dispatcher_type"), mixtral.value("moe_grouped_gemm")) == (8, 2, "alltoall", True)
    assert deepseek.transformer_class.endswith("MLATransformerConfig")
    assert (deepseek.value("mtp_num_layers"), deepseek.value("moe_layer_freq"), deepseek.value("q_lora_rank")) == \
        (1, [0, 1], None)
