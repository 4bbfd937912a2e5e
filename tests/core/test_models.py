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


@pytest.mark.parametrize("name, scale", [
    # mscale = 0.1 * mscale_all_dim * ln(factor) + 1, squared, over sqrt(qk_nope + qk_rope) = sqrt(192):
    # numbers worked out by hand from each checkpoint's config.json.
    ("deepseek-v3", 1.8738 / math.sqrt(192)),  # factor 40, mscale_all_dim 1: (1 + 0.36889)^2
    ("kimi-k2", 1.8131 / math.sqrt(192)),  # factor 32, mscale_all_dim 1: (1 + 0.34657)^2
    ("deepseek-v2-lite", 0.11472),  # factor 40, mscale_all_dim 0.707 (SGLang's model_config.scaling)
    ("llama-3.1-8b", 1 / math.sqrt(128)),  # llama3 rope scaling changes frequencies, not the scale
])
def test_softmax_scale_is_the_engines_yarn_scale(name, scale):
    assert BUILTIN_MODELS[name].softmax_scale == pytest.approx(scale, rel=1e-4)


def test_an_mla_model_without_rope_scaling_has_the_plain_scale():
    m = ModelConfig.from_mapping("m", {"mla": True, "num_heads": 8, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                       "qk_nope_head_dim": 128, "v_head_dim": 128})
    assert m.softmax_scale == pytest.approx(1 / math.sqrt(192)) and m.quant_method == "none"


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_catalogue_matches_the_config_json_the_engines_read(name):
    """The check's scale comes from the catalogue, the engine's from config.json: they must be one checkpoint."""
    import json

    from pytest_mla.engines.common import MODEL_CONFIGS

    path = MODEL_CONFIGS / name / "config.json"
    if not path.exists():
        pytest.skip(f"no config.json for {name}")
    config = json.loads(path.read_text())
    m = BUILTIN_MODELS[name]
    assert config.get("rope_scaling") == m.config_json().get("rope_scaling")
    assert config.get("quantization_config") == m.config_json().get("quantization_config")
    assert (config.get("num_nextn_predict_layers") or 0) == m.mtp_layers
    assert config["num_attention_heads"] == m.num_heads
    if m.mla:
        assert (config["kv_lora_rank"], config["qk_rope_head_dim"], config["qk_nope_head_dim"]) == \
            (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim)


def test_served_checkpoints_are_fp8_where_the_official_release_is():
    assert [n for n, m in sorted(BUILTIN_MODELS.items()) if m.quant_method == "fp8"] == \
        ["deepseek-r1", "deepseek-v3", "deepseek-v3.2", "kimi-k2"]


@pytest.mark.parametrize("fields, key", [
    ({"mla": True, "num_heads": 8}, "kv_lora_rank"),
    ({"mla": False, "num_heads": 8}, "head_dim"),
    ({"mla": False, "num_heads": 6, "num_kv_heads": 4, "head_dim": 64}, "num_kv_heads"),
    ({"mla": "yes", "num_heads": 8}, "mla"),
    ({"mla": True, "num_heads": 8, "heads": 3}, "heads"),
    ({"num_heads": 8}, "mla"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 4.0}},
     "rope_scaling.factor"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "rope_scaling": {"type": "warp", "factor": 4.0}},
     "rope_scaling.type"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "rope_scaling": {"type": "yarn", "factor": -1}},
     "rope_scaling.factor"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "rope_scaling": {"type": "yarn", "factr": 4}},
     "rope_scaling.factr"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "quantization": {"quant_method": "int3"}},
     "quantization.quant_method"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "quantization": {"fmt": "e4m3"}}, "quantization"),
    ({"mla": False, "num_heads": 8, "head_dim": 64,
      "quantization": {"quant_method": "fp8", "weight_block_size": [128]}}, "quantization.weight_block_size"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "quantization": "fp8"}, "quantization"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "mtp_layers": -1}, "mtp_layers"),
])
def test_bad_model_entries_name_the_field(fields, key):
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_mapping("m", fields)
    assert info.value.key == key


def test_deepseek_v32_is_v3_attention_with_the_published_indexer():
    # deepseek-ai/DeepSeek-V3.2 config.json: index_topk 2048, index_n_heads 64, index_head_dim 128.
    m = BUILTIN_MODELS["deepseek-v3.2"]
    assert (m.num_heads, m.d_qk, m.d_v) == (128, 576, 512)
    assert (m.index_topk, m.index_n_heads, m.index_head_dim, m.sparse) == (2048, 64, 128, True)
    assert not BUILTIN_MODELS["deepseek-v3"].sparse and BUILTIN_MODELS["deepseek-v3"].index_topk == 0


MLA = {"mla": True, "num_heads": 8, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
       "v_head_dim": 128}


@pytest.mark.parametrize("fields, key, text", [
    ({**MLA, "index_topk": 2048, "index_n_heads": 64}, "index_head_dim", "needs all of index_topk"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "index_topk": 512}, "index_topk", "only an MLA model"),
    ({**MLA, "index_topk": -1, "index_n_heads": 64, "index_head_dim": 128}, "index_topk", "non-negative"),
])
def test_bad_indexer_fields_name_the_field(fields, key, text):
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_mapping("m", fields)
    assert info.value.key == key and text in info.value.message


def test_a_matrix_model_may_be_sparse_and_rules_test_its_indexer(tmp_path):
    from pytest_mla.core.cells import Cell
    from pytest_mla.core.matrix import load_matrix

    path = tmp_path / "m.toml"
    path.write_text("""
[models.tiny-dsa]
mla = true
num_heads = 16
kv_lora_rank = 512
qk_rope_head_dim = 64
qk_nope_head_dim = 128
v_head_dim = 128
index_topk = 512
index_n_heads = 16
index_head_dim = 128

[axes]
model = ["tiny-dsa", "deepseek-v3"]
backend = ["sparse_only"]
dcp = [1]
spec = ["none"]
arch = ["sm90"]

[[rule]]
when = { "model.index_topk" = 0 }
reject = { error = "ValueError", message = "{backend} needs index_topk, {model} has {model.index_topk}" }
""")
    m = load_matrix(path)
    assert m.models["tiny-dsa"].sparse
    assert m.expectation(Cell("tiny-dsa", "sparse_only", 1, "none", "sm90")).kind == "accept"
    dense = m.expectation(Cell("deepseek-v3", "sparse_only", 1, "none", "sm90"))
    assert dense.message == "sparse_only needs index_topk, deepseek-v3 has 0"
