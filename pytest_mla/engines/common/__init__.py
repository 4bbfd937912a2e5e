"""Pieces every real-engine adapter shares: import stubs, GPU-step stops, quiet logging, model configs."""

from __future__ import annotations

from pathlib import Path

#: Weightless ``config.json`` files of the catalogue's models, one folder per model name
#: (what the adapters hand an engine as its model path).
MODEL_CONFIGS = Path(__file__).resolve().parent.parent / "model_configs"
