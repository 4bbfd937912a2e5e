"""pytest-mla hooks of the tinyengine repo: the engine adapter, a model, a note per refusal."""

from __future__ import annotations

DOCS = "docs/attention-backends.md"


def pytest_mla_engines(config):
    """``[engine] name = "tinyengine"`` in a matrix file means this adapter."""
    from mla_adapter import TinyEngine

    return {"tinyengine": TinyEngine}


def pytest_mla_models(config):
    """tinyengine's own small MLA test model, beside the built-in catalogue."""
    return {
        "tiny-mla": {
            "mla": True,
            "num_heads": 8,
            "kv_lora_rank": 128,
            "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
        },
    }


def pytest_mla_cell_record(config, cell, record):
    """Point every refused cell of the report at the docs section its users land on."""
    if (record.get("outcome") or {}).get("kind") == "rejected":
        record.setdefault("notes", []).append(f"documented in {DOCS}#{cell.backend}")
