"""The quick tier's covering sample: every (backend, family, feature column) the accepted cells have, once."""

import itertools
import textwrap

from pytest_mla.core.matrix import load_matrix
from pytest_mla.core.sample import covering_sample

MATRIX = """
[engine]
name = "reference"

[axes]
model    = ["deepseek-v3", "deepseek-v3.2", "kimi-k2", "llama-3.1-8b"]
backend  = ["a", "b"]
dcp      = [1, 2]
spec     = ["none", "eagle-1x3", "eagle-4x3"]
arch     = ["sm90", "sm100"]
kv_dtype = ["auto", "fp8_e4m3"]

[[rule]]   # b refuses every tree and everything on sm90
when   = { backend = "b", "spec.tree" = true }
reject = { error = "ValueError", match = "topk" }

[[rule]]
when   = { backend = "b", arch = "sm90" }
reject = { error = "ValueError", match = "Blackwell" }

[[rule]]   # a known bug on a's fp8 cache of kimi-k2: a cell the sample avoids where another covers the same
when   = { backend = "a", model = "kimi-k2", kv_dtype = "fp8_e4m3" }
xfail  = "known bug"
"""

FAMILY = {"deepseek-v3": "dense", "kimi-k2": "dense", "deepseek-v3.2": "sparse", "llama-3.1-8b": "gqa"}


def _matrix(tmp_path, text=MATRIX):
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent(text))
    return load_matrix(path)


def _cells(matrix):
    return [(cell, matrix.expectation(cell)) for cell in matrix.cells()]


def _keys(cell_id):
    """The (backend, family, column) keys of a cell id, read off its parts (not with the code under test)."""
    model, backend, dcp, spec, arch, kv = cell_id.split("/")
    kind = "none" if spec == "none" else ("tree" if spec.startswith("eagle-4") else "chain")
    columns = {arch, "spec " + kind, kv}
    if dcp != "dcp1":
        columns |= {"dcp"} | ({"dcp+spec"} if kind != "none" else set())
    return {(backend, FAMILY[model], c) for c in columns}


def test_the_sample_covers_every_key_of_the_accepted_cells_and_only_accepted_cells(tmp_path):
    matrix = _matrix(tmp_path)
    cells = _cells(matrix)
    sample = covering_sample(cells, matrix.models)
    accepted = {cell.id for cell, expect in cells if expect.kind == "accept"}
    assert set(sample) <= accepted
    wanted = set().union(*(_keys(i) for i in accepted))
    assert set().union(*(_keys(i) for i in sample)) == wanted
    # b is refused on sm90 and with trees: none of its keys names them, and its sample lives on sm100
    assert not any(k[0] == "b" and k[2] in ("sm90", "spec tree") for k in wanted)
    assert all("/sm100/" in i or not i.split("/")[1] == "b" for i in sample)
    # a sample, not the matrix: at most one cell per key
    assert len(sample) <= len(wanted) and len(sample) < len(accepted) / 5


def test_the_sample_is_the_same_whatever_process_asks_and_avoids_known_bugs(tmp_path):
    matrix = _matrix(tmp_path)
    first = covering_sample(_cells(matrix), matrix.models)
    assert covering_sample(_cells(matrix), matrix.models) == first == tuple(sorted(first, key=lambda i: [
        c.id for c, _ in _cells(matrix)].index(i)))  # in matrix order
    xfailed = {cell.id for cell, expect in _cells(matrix) if expect.xfail}
    assert xfailed and not xfailed & set(first)  # every key they have is had by a cell without the mark


def test_a_cell_that_alone_has_a_key_is_sampled_even_with_a_known_bug(tmp_path):
    matrix = _matrix(tmp_path, MATRIX.replace('model = "kimi-k2", kv_dtype = "fp8_e4m3"', 'kv_dtype = "fp8_e4m3"'))
    sample = covering_sample(_cells(matrix), matrix.models)
    assert any(i.split("/")[1] == "a" and i.endswith("/kv-fp8_e4m3") for i in sample)


def test_each_family_is_its_own_key(tmp_path):
    matrix = _matrix(tmp_path)
    sample = covering_sample(_cells(matrix), matrix.models)
    for backend, family in itertools.product("ab", ("dense", "sparse", "gqa")):
        assert any(i.split("/")[1] == backend and FAMILY[i.split("/")[0]] == family for i in sample)
