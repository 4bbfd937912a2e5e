import math

import pytest

from pytest_mla.core.models import BUILTIN_MODELS, ModelConfig, ModelConfigError


@pytest.mark.parametrize("name, heads, kv_heads, d_qk, d_v", [
    # Published dims (config.json of each model), written out here by hand.
    ("deepseek-v3", 128, 1, 576, 512),
    ("deepseek-v2-lite", 16, 1, 576, 512),
    ("kimi-k2", 64, 1, 576, 512),
    ("llama-3.1-8b", 32, 8, 128, 128),
    ("qwen2.5-7b", 28, 4, 128, 128),
])
def test_catalogue_dims(name, heads, kv_heads, d_qk, d_v):
    m = BUILTIN_MODELS[name]
    assert (m.num_heads, m.num_kv_heads, m.d_qk, m.d_v) == (heads, kv_heads, d_qk, d_v)


def test_mla_softmax_scale_is_over_nope_plus_rope():
    assert BUILTIN_MODELS["deepseek-v3"].softmax_scale == pytest.approx(1 / math.sqrt(192))


@pytest.mark.parametrize("fields, key", [
    ({"mla": True, "num_heads": 8}, "kv_lora_rank"),
    ({"mla": False, "num_heads": 8}, "head_dim"),
    ({"mla": False, "num_heads": 6, "num_kv_heads": 4, "head_dim": 64}, "num_kv_heads"),
    ({"mla": "yes", "num_heads": 8}, "mla"),
    ({"mla": True, "num_heads": 8, "heads": 3}, "heads"),
    ({"num_heads": 8}, "mla"),
])
def test_bad_model_entries_name_the_field(fields, key):
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_mapping("m", fields)
    assert info.value.key == key
