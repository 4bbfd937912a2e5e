"""tinyengine's own tests over matrix cells: here, a smoke test of every accepted cell.

``@pytest.mark.mla_matrix`` parametrizes the test with one ``mla_cell`` per
selected cell of the matrix file, named like the matrix's own tests
(``test_smoke[tiny-mla-triton-dcp2-eagle-1x3-sm100]``). Under
``pytest --mla-matrix`` the outcomes join the cells' records in the report
(``user_tests``).
"""

import pytest

from tinyengine.attention import EngineArgs, ModelInfo, select_backend


@pytest.mark.mla_matrix("matrix/tiny.toml", select={"model": ["tiny-mla"], "dcp": [1]}, expect="accept")
def test_smoke(mla_cell):
    cell, model = mla_cell.cell, mla_cell.model
    args = EngineArgs(
        model=ModelInfo(model.name, use_mla=model.mla, num_kv_heads=model.num_kv_heads),
        attention_backend=cell.backend,
        compute_capability=(10, 0) if cell.arch == "sm100" else (9, 0),
    )
    # A real engine would start a server here and generate a few tokens.
    assert select_backend(args).name == cell.backend
