import math

import pytest

from pytest_mla.core.models import BUILTIN_MODELS, INDEXER_FIELDS, ModelConfig, ModelConfigError


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
    assert path.exists(), f"the catalogue's {name} has no {path}: the engines cannot read it"
    config = json.loads(path.read_text())
    m = BUILTIN_MODELS[name]
    assert config.get("rope_scaling") == m.config_json().get("rope_scaling")
    assert config.get("quantization_config") == m.config_json().get("quantization_config")
    assert (config.get("num_nextn_predict_layers") or 0) == m.mtp_layers
    assert config["num_attention_heads"] == m.num_heads
    if m.mla:
        assert (config["kv_lora_rank"], config["qk_rope_head_dim"], config["qk_nope_head_dim"], config["v_head_dim"]) \
            == (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim)
        # DeepSeek's convention, which every MLA checkpoint follows: one (decompressed) KV head per query head.
        assert config["num_key_value_heads"] == config["num_attention_heads"]
        if m.q_lora_rank is not None:
            assert config["q_lora_rank"] == m.config_json()["q_lora_rank"]
    else:
        assert (config["num_key_value_heads"], config.get("head_dim", m.head_dim)) == (m.num_kv_heads, m.head_dim)
    assert {k: config.get(k, 0) for k in INDEXER_FIELDS} == {k: getattr(m, k) for k in INDEXER_FIELDS}
    # Both engines' DeepSeek attention reads Mistral's per-position query scaling from a top-level
    # llama_4_scaling (vLLM's Mistral-format remap writes it there), not from rope_scaling.
    rope = dict(m.rope_scaling or ())
    if "llama_4_scaling_beta" in rope:
        assert config["llama_4_scaling"] == {"beta": rope["llama_4_scaling_beta"],
                                             "original_max_position_embeddings": rope["original_max_position_embeddings"]}
    else:
        assert "llama_4_scaling" not in config


def test_mistral_native_params_json_is_the_catalogues_checkpoint():
    """SGLang reads a model whose path names mistral-small-4 from a Mistral-native params.json (its
    mistral_utils.is_mistral_model), not from config.json: that file must be the same checkpoint.
    The key names are Mistral's (``n_heads``, ``yarn.beta`` for beta_fast, ``yarn.alpha`` for beta_slow)."""
    import json

    from pytest_mla.engines.common import MODEL_CONFIGS

    with_params = sorted(p.parent.name for p in MODEL_CONFIGS.glob("*/params.json"))
    assert with_params == ["mistral-small-4"]
    m = BUILTIN_MODELS["mistral-small-4"]
    params = json.loads((MODEL_CONFIGS / "mistral-small-4" / "params.json").read_text())
    assert (params["n_heads"], params["n_kv_heads"]) == (m.num_heads, m.num_heads)
    assert (params["kv_lora_rank"], params["qk_rope_head_dim"], params["qk_nope_head_dim"], params["v_head_dim"],
            params["q_lora_rank"]) == (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, 1024)
    rope = dict(m.rope_scaling)
    assert params["yarn"] == {"factor": rope["factor"], "original_max_position_embeddings":
                              rope["original_max_position_embeddings"], "beta": rope["beta_fast"],
                              "alpha": rope["beta_slow"]}
    # SGLang's remap gives every Mistral YaRN mscale_all_dim 1, the catalogue's value (softmax scale x2.206).
    assert rope["mscale_all_dim"] == 1.0
    assert params["llama_4_scaling"] == {"beta": rope["llama_4_scaling_beta"],
                                         "original_max_position_embeddings": rope["original_max_position_embeddings"]}
    assert "quantization" not in params and m.quant_method == "none"
    # Mistral Large 3's remap (MistralLarge3ForCausalLM, model_type deepseek_v3) needs MoE with shared experts.
    assert params["moe"]["num_shared_experts"] > 0


def test_every_catalogue_model_has_a_checkpoint_and_a_config_json():
    from pytest_mla.engines.common import MODEL_CONFIGS
    from pytest_mla.report.serving import CHECKPOINTS

    missing = [n for n in BUILTIN_MODELS if n not in CHECKPOINTS and n != "deepseek-v3.2"]
    assert missing == []
    assert [n for n in BUILTIN_MODELS if not (MODEL_CONFIGS / n / "config.json").exists()] == []


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


# Issue 39: the other MLA families, written out by hand from transformers 5.24's configuration classes
# (transformers/models/<type>/configuration_<type>.py: class defaults and auto_docstring checkpoints).
@pytest.mark.parametrize("name, heads, kv_lora, rope, nope, v, q_lora, indexer", [
    # MiniCPM3Config (openbmb/MiniCPM3-4B): v_head_dim None -> hidden_size 2560 // 40 heads = 64.
    ("minicpm3-4b", 40, 256, 32, 64, 64, 768, (0, 0, 0)),
    # Mistral4Config (mistralai/Mistral-Small-4-119B-2603).
    ("mistral-small-4", 32, 256, 64, 64, 128, 1024, (0, 0, 0)),
    # MistralLarge4TextConfig (mistralai/Mistral-Large-4-1T-A52B): no q_lora_rank field, DSA indexer.
    ("mistral-large-4", 64, 512, 64, 64, 128, 0, (2048, 32, 128)),
    # Glm4MoeLiteConfig (GLM-4.7-Flash geometry).
    ("glm-4.7-flash", 20, 512, 64, 192, 256, 768, (0, 0, 0)),
    # GlmMoeDsaConfig (zai-org/GLM-5): DSA indexer.
    ("glm-5", 64, 512, 64, 192, 256, 2048, (2048, 32, 128)),
])
def test_issue_39_families_are_the_transformers_classes(name, heads, kv_lora, rope, nope, v, q_lora, indexer):
    m = BUILTIN_MODELS[name]
    assert m.mla and (m.num_heads, m.num_kv_heads) == (heads, 1)
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank) == \
        (kv_lora, rope, nope, v, q_lora)
    assert (m.index_topk, m.index_n_heads, m.index_head_dim) == indexer and m.sparse == (indexer[0] > 0)
    assert m.mtp_layers == 0 and m.quant_method == "none"  # none of the classes carries either


@pytest.mark.parametrize("name, rope, scale", [
    ("minicpm3-4b", None, 1 / math.sqrt(96)),
    ("glm-4.7-flash", None, 1 / 16),
    ("glm-5", None, 1 / 16),
    # Mistral4Config.__post_init__'s default rope_parameters (rope_theta and max_position_embeddings aside):
    # (1 + 0.1 * ln 128)^2 = 1.485203^2 = 2.205828, over sqrt(64 + 64).
    ("mistral-small-4", {"type": "yarn", "factor": 128.0, "original_max_position_embeddings": 8192,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 0.5}, 2.205828 / math.sqrt(128)),
    # MistralLarge4TextConfig.__post_init__'s default (rope_theta aside): no magnitude scaling.
    ("mistral-large-4", {"rope_type": "yarn", "factor": 2048.0, "original_max_position_embeddings": 512,
                         "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0}, 1 / math.sqrt(128)),
])
def test_issue_39_families_rope_and_scale(name, rope, scale):
    m = BUILTIN_MODELS[name]
    assert m.config_json().get("rope_scaling") == rope
    assert m.softmax_scale == pytest.approx(scale, rel=1e-6)


@pytest.mark.parametrize("name, architecture, model_type", [
    # The architectures SGLang's and vLLM's registries serve each family under.
    ("minicpm3-4b", "MiniCPM3ForCausalLM", "minicpm3"),
    ("mistral-small-4", "MistralLarge3ForCausalLM", "deepseek_v3"),  # vLLM's Mistral-format remap of MLA + MoE
    ("mistral-large-4", "MistralLarge4ForCausalLM", "mistral_large_4"),  # vLLM's spelling (transformers: mistral_large4)
    ("glm-4.7-flash", "Glm4MoeLiteForCausalLM", "glm4_moe_lite"),
    ("glm-5", "GlmMoeDsaForCausalLM", "glm_moe_dsa"),
])
def test_issue_39_config_json_names_the_engines_architecture(name, architecture, model_type):
    import json

    from pytest_mla.engines.common import MODEL_CONFIGS

    config = json.loads((MODEL_CONFIGS / name / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == ([architecture], model_type)


def test_entries_recorded_before_q_lora_rank_keep_their_report_fields():
    # Existing reports carry run.models as as_dict(): an unrecorded q_lora_rank adds no key.
    assert "q_lora_rank" not in BUILTIN_MODELS["deepseek-v3"].as_dict()
    assert "q_lora_rank" not in BUILTIN_MODELS["deepseek-v3"].config_json()
    assert BUILTIN_MODELS["glm-5"].as_dict()["q_lora_rank"] == 2048
    assert BUILTIN_MODELS["mistral-large-4"].config_json()["q_lora_rank"] is None
    v3 = BUILTIN_MODELS["deepseek-v3"].as_dict()
    assert ModelConfig.from_mapping("x", {k: v for k, v in v3.items() if k != "name"}).as_dict() == {**v3, "name": "x"}


@pytest.mark.parametrize("fields, key, text", [
    ({**MLA, "q_lora_rank": -1}, "q_lora_rank", "non-negative"),
    ({**MLA, "q_lora_rank": 1.5}, "q_lora_rank", "non-negative"),
    ({**MLA, "q_lora_rank": True}, "q_lora_rank", "non-negative"),
    ({"mla": False, "num_heads": 8, "head_dim": 64, "q_lora_rank": 768}, "q_lora_rank", "only an MLA model"),
    ({**MLA, "kv_lora_rank": -512}, "kv_lora_rank", "non-negative"),
    ({**MLA, "rope_scaling": {"type": "yarn", "factor": 128.0, "mscale_all_dim": 1.0}}, "rope_scaling.factor",
     "original_max_position_embeddings"),
    ({**MLA, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}},
     "rope_scaling.original_max_position_embeddings", "positive integer"),
    ({**MLA, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                              "partial_rotary_factor": 1.5}}, "rope_scaling.partial_rotary_factor", "(0, 1]"),
    ({**MLA, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                              "partial_rotary_factor": 0}}, "rope_scaling.partial_rotary_factor", "(0, 1]"),
    ({**MLA, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                              "llama_4_scaling_beta": -0.1}}, "rope_scaling.llama_4_scaling_beta", "non-negative"),
    ({**MLA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                              "attention_factor": "1"}}, "rope_scaling.attention_factor", "non-negative"),
    ({**MLA, "index_topk": 2048, "index_head_dim": 128}, "index_n_heads", "needs all of index_topk"),
])
def test_bad_issue_39_fields_name_the_field(fields, key, text):
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_mapping("m", fields)
    assert info.value.key == key and text in info.value.message


def test_a_matrix_model_may_record_q_lora_rank(tmp_path):
    m = ModelConfig.from_mapping("m", {**MLA, "q_lora_rank": 0})
    assert m.q_lora_rank == 0 and m.config_json()["q_lora_rank"] is None
