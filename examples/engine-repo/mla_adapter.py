"""The pytest-mla adapter of tinyengine: one matrix cell in, tinyengine's own answer out.

It translates a cell (model, backend, dcp, spec, arch) into ``EngineArgs``
and calls ``tinyengine.attention.select_backend``, letting tinyengine's
``AttentionConfigError`` propagate: that is the refusal the matrix file's
``reject`` rules are compared with. It never decides what the answer should
be; ``matrix/tiny.toml`` says that, written from tinyengine's docs.
"""

from __future__ import annotations

from typing import Any, Mapping

from pytest_mla.core.cells import Cell, arch_number
from pytest_mla.core.models import ModelConfig
from pytest_mla.core.spec import parse_spec
from pytest_mla.engines.protocol import Configured, KernelSpec

import tinyengine
from tinyengine.attention import BACKENDS, AttentionConfigError, EngineArgs, ModelInfo, select_backend


class TinyEngine:
    """``[engine] name = "tinyengine"`` (registered by ``pytest_mla_engines`` in conftest.py)."""

    name = "tinyengine"
    version = tinyengine.__version__
    refusal_errors: tuple[type[BaseException], ...] = (AttentionConfigError,)

    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        spec = parse_spec(cell.spec)
        sm = arch_number(cell.arch) or 0  # sm90 -> (9, 0), sm100 -> (10, 0)
        args = EngineArgs(
            model=ModelInfo(model.name, use_mla=model.mla, num_kv_heads=model.num_kv_heads),
            attention_backend=cell.backend,
            compute_capability=divmod(sm, 10),
            dcp_size=cell.dcp,
            speculative_num_steps=spec.steps,
            speculative_topk=spec.topk,
        )
        backend = select_backend(args)  # raises AttentionConfigError to refuse
        roles = {"decode": backend.name, "prefill": backend.name}
        if backend.decode_kernel is None:
            return Configured(roles, kernel_reason=f"tinyengine ships no {backend.name} decode kernel here")
        kernel = KernelSpec(
            name=f"tinyengine-{backend.name}",
            target=backend.decode_kernel,
            dcp_positions=backend.dcp_with_spec,
            tree_mask=backend.draft_trees,
        )
        return Configured(roles, kernel=kernel)

    def metadata(self) -> Mapping[str, Any]:
        return {"backends": list(BACKENDS)}
