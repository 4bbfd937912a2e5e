"""The decode kernel of tinyengine's ``triton`` backend.

A real engine keeps its own Triton kernel here. This example delegates to
pytest-mla's (``pytest_mla.kernels.triton_mla.mla_decode``) to show the
contract: a module-level function with the ``mla_decode`` signature, named
``"tinyengine.kernels:mla_decode"`` in the backend registry, which the
pytest-mla harness imports and checks against its float64 reference.

A module that defines ``@triton.jit`` kernels must be imported after
``TRITON_INTERPRET`` is decided; the harness calls
``pytest_mla.kernels._mode.ensure_triton_mode()`` before importing it, and
``triton_mla`` does so itself on its first line.
"""

from __future__ import annotations

from pytest_mla.kernels import triton_mla


def mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=True,
               kv_scale=None, num_splits=None, return_lse=True, *, v_cache=None, tree_mask=None,
               dcp_rank=0, dcp_world_size=1, dcp_interleave=1, global_seqlens=None, out=None,
               check_inputs=True):
    """Paged MLA decode: ``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])``; see ``triton_mla.mla_decode``."""
    return triton_mla.mla_decode(
        q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale, num_splits,
        return_lse, v_cache=v_cache, tree_mask=tree_mask, dcp_rank=dcp_rank, dcp_world_size=dcp_world_size,
        dcp_interleave=dcp_interleave, global_seqlens=global_seqlens, out=out, check_inputs=check_inputs,
    )
