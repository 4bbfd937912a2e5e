"""The model level's independent model: transformers' class at a small size (``engines/common/independent_model.py``).

The config and error tests run anywhere (they read JSON); the checkpoint and
logits tests run in ``.venv-sglang``, which has transformers, and skip
without it.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from pytest_mla.core.models import BUILTIN_MODELS
from pytest_mla.engines.common import MODEL_CONFIGS
from pytest_mla.engines.common.independent_model import ATTENTION_FIELDS, SMALL, small_config

from ._venv import ROOT, venv_python


def real_config(model: str) -> dict:
    return json.loads((MODEL_CONFIGS / model / "config.json").read_text(encoding="utf-8"))


def test_the_cost_cuts_leave_the_attention_geometry_alone():
    assert not set(SMALL) & set(ATTENTION_FIELDS)


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite", "kimi-k2", "deepseek-v3.2"])
def test_the_small_config_is_the_real_checkpoints_attention(model):
    real = real_config(model)
    small = small_config(model, heads=8)
    for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
                "rope_scaling", "rope_theta", "model_type", "index_topk"):
        assert small.get(key) == real.get(key), key
    assert small["num_attention_heads"] == small["num_key_value_heads"] == 8
    assert small["num_hidden_layers"] == 2 and small["first_k_dense_replace"] == 1
    assert "quantization_config" not in small
    if "quantization_config" in real:
        assert small_config(model, heads=8, quantized=True)["quantization_config"] == real["quantization_config"]


@pytest.mark.parametrize("model, heads, message", [
    ("llama-3.1-8b", 8, "no kv_lora_rank: not an MLA checkpoint"),
    ("no-such-model", 8, "'no-such-model': no checkpoint config at"),
    ("deepseek-v3", 3, "128 heads do not split into ranks of 3"),
    ("deepseek-v3", 0, "heads must be a positive integer, got 0"),
])
def test_what_it_cannot_build_is_one_line(model, heads, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        small_config(model, heads=heads)


def test_a_quantization_it_cannot_write_is_refused_before_any_work(tmp_path):
    from pytest_mla.engines.common.independent_model import write_checkpoint

    config = small_config("deepseek-v3", heads=8, quantized=True)
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}
    with pytest.raises(ValueError, match="only DeepSeek's fp8 e4m3 block format is written"):
        write_checkpoint(config, tmp_path, seed=1)
    assert not any(tmp_path.iterdir())


_FP8_SCRIPT = r"""
import json, sys, tempfile
import torch
from safetensors.torch import load_file
from pytest_mla.engines.common.independent_model import small_config, write_checkpoint, reference_logits

plain = write_checkpoint(small_config("deepseek-v3", heads=8), tempfile.mkdtemp(), seed=3)
fp8 = write_checkpoint(small_config("deepseek-v3", heads=8, quantized=True), tempfile.mkdtemp(), seed=3)
w, q = load_file(plain / "model.safetensors"), load_file(fp8 / "model.safetensors")
out = {"dtypes": {k: str(v.dtype) for k, v in q.items()}, "shapes": {k: list(v.shape) for k, v in q.items()}}
worst = 0.0
for name, scale in q.items():
    if not name.endswith("weight_scale_inv"):
        continue
    weight = name.removesuffix("_scale_inv")
    # the test's own dequantization: each 128x128 block of values times its scale
    s = scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    deq = q[weight].double() * s[: q[weight].shape[0], : q[weight].shape[1]]
    ref = w[weight].double()
    bound = 2.0 ** -4 * ref.abs() + 2.0 ** -9 * s[: ref.shape[0], : ref.shape[1]]
    worst = max(worst, float(((deq - ref).abs() / bound).max()))
out["worst"] = worst
ids = [5, 17, 300, 2, 2, 99, 511, 0, 42, 64]
a, b = reference_logits(plain, ids), reference_logits(fp8, ids)
out["cos"] = float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))
out["differ"] = float((a - b).abs().max())
print("RESULT", json.dumps(out))
"""


def test_the_fp8_checkpoint_is_deepseeks_block_format(tmp_path):
    python = venv_python(".venv-sglang")
    run = subprocess.run([str(python), "-c", _FP8_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.split("RESULT ", 1)[1])
    dtypes, shapes = out["dtypes"], out["shapes"]
    attn = "model.layers.0.self_attn."
    for proj, rows in (("q_a_proj", 1536), ("q_b_proj", 8 * 192), ("kv_a_proj_with_mqa", 576),
                       ("kv_b_proj", 8 * 256), ("o_proj", 256)):
        assert dtypes[f"{attn}{proj}.weight"] == "torch.float8_e4m3fn", proj
        assert dtypes[f"{attn}{proj}.weight_scale_inv"] == "torch.float32", proj
        cols = 1536 if proj == "q_b_proj" else 512 if proj == "kv_b_proj" else 1024 if proj == "o_proj" else 256
        assert shapes[f"{attn}{proj}.weight_scale_inv"] == [-(-rows // 128), -(-cols // 128)], proj
    assert dtypes["model.layers.1.mlp.experts.0.gate_proj.weight"] == "torch.float8_e4m3fn"
    for unquantized in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight",
                        f"{attn}q_a_layernorm.weight"):
        assert dtypes[unquantized] == "torch.bfloat16", unquantized
        assert unquantized.replace("weight", "weight_scale_inv") not in dtypes
    assert 0 < out["worst"] <= 1.0  # every weight within e4m3's rounding of the bf16 one, none exact by luck
    assert out["cos"] > 0.99 and out["differ"] > 0  # the reference computes with the quantized weights


_SCRIPT = r"""
import hashlib, json, sys, tempfile
import torch
from safetensors import safe_open
from pytest_mla.engines.common.independent_model import small_config, write_checkpoint, reference_logits

model, heads = sys.argv[1], int(sys.argv[2])
config = small_config(model, heads=heads)
out = {}
for name, seed in (("a", 7), ("b", 7), ("c", 8)):
    folder = write_checkpoint(config, tempfile.mkdtemp(), seed=seed)
    out[name] = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
with safe_open(str(folder / "model.safetensors"), "pt") as f:
    out["shapes"] = {k: list(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("model.layers.0.self_attn.")}
    out["not_bf16"] = sorted(k for k in f.keys() if f.get_slice(k).get_dtype() != "BF16")
out["config"] = json.loads((folder / "config.json").read_text())
ids = [5, 17, 300, 2, 2, 99, 511, 0, 42, 64, 128, 7]
logits = reference_logits(folder, ids)
prefix = reference_logits(folder, ids[:5])
out["logits"] = [str(logits.dtype), list(logits.shape)]
out["causal_gap"] = float((logits[:5] - prefix).abs().max())
out["spread"] = float(logits.std())
from transformers import AutoModelForCausalLM
hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager")
out["scaling"] = hf.model.layers[0].self_attn.scaling
print("RESULT", json.dumps(out))
"""


@pytest.mark.parametrize("model, heads", [("deepseek-v3", 16), ("deepseek-v2-lite", 4)])
def test_the_checkpoint_and_its_float64_logits(tmp_path, model, heads):
    python = venv_python(".venv-sglang")
    run = subprocess.run([str(python), "-c", _SCRIPT, model, str(heads)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                      "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.split("RESULT ", 1)[1])
    real = real_config(model)
    assert out["a"] == out["b"] != out["c"]  # the seed decides the weights, and only it
    assert out["config"] == small_config(model, heads=heads)  # the real spelling, not transformers'
    # bf16 weights; the MoE router's bias stays float32, as in DeepSeek's checkpoints
    assert out["not_bf16"] == (["model.layers.1.mlp.gate.e_score_correction_bias"] if real.get("topk_method") == "noaux_tc" else [])
    # DeepSeek's checkpoint names and shapes, from the geometry of the real config.json
    hidden, rank, rope = SMALL["hidden_size"], real["kv_lora_rank"], real["qk_rope_head_dim"]
    nope, v, q_rank = real["qk_nope_head_dim"], real["v_head_dim"], real["q_lora_rank"]
    expected = {"kv_a_proj_with_mqa.weight": [rank + rope, hidden], "kv_a_layernorm.weight": [rank],
                "kv_b_proj.weight": [heads * (nope + v), rank], "o_proj.weight": [hidden, heads * v]}
    if q_rank:
        expected.update({"q_a_proj.weight": [q_rank, hidden], "q_a_layernorm.weight": [q_rank],
                         "q_b_proj.weight": [heads * (nope + rope), q_rank]})
    else:
        expected["q_proj.weight"] = [heads * (nope + rope), hidden]
    assert out["shapes"] == {f"model.layers.0.self_attn.{k}": s for k, s in expected.items()}
    assert out["logits"] == ["torch.float64", [12, SMALL["vocab_size"]]]
    # teacher forcing is causal: a prefix's logits are the longer request's first rows. transformers
    # computes the rotary cos/sin in float32, so "float64" is float64 up to ~1e-7 relative.
    assert out["causal_gap"] < 1e-5 * out["spread"]
    # transformers' softmax scale (YaRN mscale included) is the catalogue's, computed independently
    assert math.isclose(out["scaling"], BUILTIN_MODELS[model].softmax_scale, rel_tol=1e-12)
