import pytest

from pytest_mla.core.cells import Cell, CellIdError, expand_cells, nodeid_name
from pytest_mla.core.spec import SpecError, parse_spec

AXES = {
    "model": ("deepseek-v3", "deepseek-v2-lite", "llama-3.1-8b"),
    "backend": ("triton", "trtllm_mla"),
    "dcp": (1, 4),
    "spec": ("none", "eagle-1x3", "eagle-4x3"),
    "arch": ("sm90", "sm100"),
}


def test_canonical_id_matches_design_example():
    cell = Cell("deepseek-v3", "trtllm_mla", 4, "eagle-1x3", "sm100")
    assert cell.id == "deepseek-v3/trtllm_mla/dcp4/eagle-1x3/sm100"
    assert cell.name == "deepseek-v3-trtllm_mla-dcp4-eagle-1x3-sm100"


@pytest.mark.parametrize("text", [
    "deepseek-v3/trtllm_mla/dcp4/eagle-1x3/sm100",
    "kimi-k2/flashmla/dcp1/none/sm90/kv-fp8_e4m3/page64/tp8",
    "llama-3.1-8b/triton/dcp0/mtp-2/sm80/tp2",
])
def test_from_id_round_trips(text):
    assert Cell.from_id(text).id == text


@pytest.mark.parametrize("text", ["a/b/c", "m/b/4/none/sm90", "m/b/dcp4/none/sm90/bogus"])
def test_from_id_rejects_malformed(text):
    with pytest.raises(CellIdError, match="cell id"):
        Cell.from_id(text)


def test_every_name_parses_back_against_the_axes():
    cells = list(expand_cells(AXES))
    assert len(cells) == 3 * 2 * 2 * 3 * 2
    for cell in cells:
        assert Cell.from_name(cell.name, AXES) == cell


def test_name_with_dashes_in_values_is_not_ambiguous():
    # "deepseek-v2-lite" starts like "deepseek-v2"... and spec values have dashes too.
    axes = {**AXES, "model": ("deepseek-v2", "deepseek-v2-lite")}
    cell = Cell("deepseek-v2-lite", "triton", 4, "eagle-4x3", "sm90")
    assert Cell.from_name(cell.name, axes) == cell
    other = Cell("deepseek-v2", "triton", 4, "eagle-4x3", "sm90")
    assert Cell.from_name(other.name, axes) == other


def test_name_of_unknown_cell_is_an_error():
    with pytest.raises(CellIdError, match="matches no cell"):
        Cell.from_name("gpt-5-triton-dcp1-none-sm90", AXES)


def test_nodeid_name_splits_path():
    assert nodeid_name("matrix/x.toml::a-b") == ("matrix/x.toml", "a-b")


def test_expansion_order_is_axis_order_and_stable():
    first = [c.id for c in expand_cells(AXES)]
    assert first == [c.id for c in expand_cells(AXES)]
    assert first[0] == "deepseek-v3/triton/dcp1/none/sm90"
    assert first[1] == "deepseek-v3/triton/dcp1/none/sm100"
    assert first[-1] == "llama-3.1-8b/trtllm_mla/dcp4/eagle-4x3/sm100"


@pytest.mark.parametrize("text, topk, steps, s_q, tree", [
    ("none", 1, 0, 1, False),
    ("eagle-1x3", 1, 3, 4, False),
    ("eagle-4x3", 4, 3, 13, True),
    ("eagle3-2x2", 2, 2, 5, True),
    ("mtp-1", 1, 1, 2, False),
    ("nextn-3", 1, 3, 4, False),
])
def test_spec_settings_parse(text, topk, steps, s_q, tree):
    spec = parse_spec(text)
    assert (spec.topk, spec.steps, spec.s_q, spec.is_tree) == (topk, steps, s_q, tree)


@pytest.mark.parametrize("text", ["eagle", "eagle-0x3", "eagle-1x0", "medusa-2", "", "NONE"])
def test_bad_spec_settings(text):
    with pytest.raises(SpecError):
        parse_spec(text)
