"""Matrix files: semantics, and every kind of mistake reported with file and line."""

import textwrap

import pytest

from pytest_mla.core.cells import Cell
from pytest_mla.core.errors import MatrixError
from pytest_mla.core.matrix import load_matrix

AXES = """
[axes]
model   = ["deepseek-v3", "llama-3.1-8b"]
backend = ["triton", "trtllm_mla", "fa3"]
dcp     = [1, 2, 4]
spec    = ["none", "eagle-1x3", "eagle-4x3"]
arch    = ["sm90", "sm100"]
"""


def write(tmp_path, body, axes=AXES, name="m.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(axes) + textwrap.dedent(body))
    return path


def problems(tmp_path, body, axes=AXES):
    path = write(tmp_path, body, axes)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    return str(info.value).splitlines()


def line_of(path, needle):
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(needle)


# -- semantics ---------------------------------------------------------------------------

def test_first_matching_rule_wins_and_placeholders_fill(tmp_path):
    m = load_matrix(write(tmp_path, """
        [[rule]]
        when = { backend = "trtllm_mla", "model.mla" = false }
        reject = { error = "ValueError", message = "{backend} backend can only be used with MLA models." }
        [[rule]]
        when = { backend = "trtllm_mla" }
        reject = { error = "ValueError", match = "^TRTLLM" }
    """))
    first = m.expectation(Cell("llama-3.1-8b", "trtllm_mla", 1, "none", "sm100"))
    assert (first.kind, first.error, first.message, first.rule) == (
        "reject", "ValueError", "trtllm_mla backend can only be used with MLA models.", 0)
    second = m.expectation(Cell("deepseek-v3", "trtllm_mla", 1, "none", "sm100"))
    assert (second.match, second.rule) == ("^TRTLLM", 1)
    assert m.expectation(Cell("deepseek-v3", "triton", 1, "none", "sm100")).kind == "accept"


def test_comparisons_negation_lists_and_not_tables(tmp_path):
    m = load_matrix(write(tmp_path, """
        [[rule]]
        when = { dcp = ">1", spec = "!none", backend = { not = ["triton", "fa3"] } }
        reject = { error = "ValueError", message = "dcp {dcp} with {spec}" }
        [[rule]]
        when = { "spec.topk" = ">=2", "arch.sm" = "<100" }
        reject = { error = "ValueError", message = "tree on {arch}" }
    """))
    e = m.expectation(Cell("deepseek-v3", "trtllm_mla", 2, "eagle-1x3", "sm100"))
    assert e.message == "dcp 2 with eagle-1x3"
    assert m.expectation(Cell("deepseek-v3", "trtllm_mla", 1, "eagle-1x3", "sm100")).kind == "accept"
    assert m.expectation(Cell("deepseek-v3", "triton", 2, "eagle-1x3", "sm100")).kind == "accept"
    assert m.expectation(Cell("deepseek-v3", "triton", 1, "eagle-4x3", "sm90")).message == "tree on sm90"
    assert m.expectation(Cell("deepseek-v3", "triton", 1, "eagle-4x3", "sm100")).kind == "accept"


def test_engine_version_gates_and_xfail_fall_through(tmp_path):
    m = load_matrix(write(tmp_path, """
        [[rule]]
        when = { backend = "fa3", arch = "sm100" }
        xfail = "accepted by mistake before 0.5.20"
        engine_version = "<0.5.20"
        [[rule]]
        when = { backend = "trtllm_mla", dcp = ">1", spec = "!none" }
        reject = { error = "ValueError", match = "Select cutedsl_mla\\\\.$" }
        engine_version = ">=0.5.23"
        [[rule]]
        when = { backend = "trtllm_mla", dcp = ">1", spec = "!none" }
        reject = { error = "ValueError", match = "Select cutedsl_mla or tokenspeed_mla\\\\.$" }
        [[rule]]
        when = { backend = "fa3", arch = "sm100" }
        reject = { error = "AssertionError", match = "SM<=90" }
    """))
    dcp_spec = Cell("deepseek-v3", "trtllm_mla", 2, "eagle-1x3", "sm100")
    assert m.expectation(dcp_spec, "0.5.23").rule == 1
    assert m.expectation(dcp_spec, "0.5.22").rule == 2
    fa3 = Cell("deepseek-v3", "fa3", 1, "none", "sm100")
    old, new = m.expectation(fa3, "0.5.19"), m.expectation(fa3, "0.5.23")
    assert (old.rule, old.xfail) == (3, "accepted by mistake before 0.5.20")
    assert (new.rule, new.xfail) == (3, None)


def test_models_table_adds_to_the_catalogue(tmp_path):
    m = load_matrix(write(tmp_path, """
        [models.tiny-mla]
        mla = true
        num_heads = 4
        kv_lora_rank = 64
        qk_rope_head_dim = 16
        qk_nope_head_dim = 32
        v_head_dim = 32
    """, axes=AXES.replace('"llama-3.1-8b"]', '"llama-3.1-8b", "tiny-mla"]')))
    assert m.models["tiny-mla"].d_qk == 80
    assert m.axes["model"] == ("deepseek-v3", "llama-3.1-8b", "tiny-mla")
    assert m.size == 3 * 3 * 3 * 3 * 2


def test_model_head_size_is_what_an_attention_layer_is_built_with(tmp_path):
    """``model.head_size``: an MLA layer's cached row (kv_lora_rank + qk_rope_head_dim: DeepSeek 576, Mistral
    Small 4's 256 + 64 = 320), a GQA layer's head_dim (Llama 128); a backend listing head sizes refuses others."""
    axes = AXES.replace('"llama-3.1-8b"]', '"llama-3.1-8b", "mistral-small-4"]')
    m = load_matrix(write(tmp_path, """
        [[rule]]
        when = { backend = "fa3" }
        reject = { error = "ValueError", message = "Reason: {reasons}" }
        reasons = [
          { when = { "model.head_size" = { not = [512, 576] } }, text = "head_size {model.head_size} not supported" },
          { when = { dcp = ">1" }, text = "DCP not supported" },
        ]
    """, axes=axes))
    for model, head_size in (("deepseek-v3", 576), ("mistral-small-4", 320), ("llama-3.1-8b", 128)):
        assert m.models[model].field("head_size") == head_size
    assert m.expectation(Cell("deepseek-v3", "fa3", 1, "none", "sm90")).kind == "accept"
    assert m.expectation(Cell("mistral-small-4", "fa3", 2, "none", "sm90")).message == \
        "Reason: ['head_size 320 not supported', 'DCP not supported']"
    assert m.expectation(Cell("llama-3.1-8b", "fa3", 1, "none", "sm90")).message == "Reason: ['head_size 128 not supported']"


# -- every mistake says where ---------------------------------------------------------------

def test_unknown_axis_value_names_file_line_path_and_known_values(tmp_path):
    path = write(tmp_path, """
        [[rule]]
        when = { backend = "triton" }
        reject = { error = "ValueError", message = "x" }
        [[rule]]
        when = { arch = "sm95" }
        reject = { error = "ValueError", message = "x" }
    """)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, 'arch = "sm95"')
    assert str(info.value) == f"matrix/m.toml:{line}: rule[1].when.arch: unknown value 'sm95' (known: sm90, sm100)"


@pytest.mark.parametrize("body, needle, expected", [
    ("""
     [[rule]]
     when = { backend = "triton", bogus = 1 }
     reject = { error = "ValueError", message = "x" }
     """, "bogus", "rule[0].when.bogus: unknown key 'bogus'"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     reject = { error = "ValueError", match = "([" }
     """, "match", "rule[0].reject.match: bad regex '(['"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     reject = { error = "ValueError", message = "x" }
     engine_version = ">>0.5"
     """, "engine_version", "rule[0].engine_version: invalid version specifier '>>0.5'"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     reject = { error = "ValueError", message = "{backend} on {gpu}" }
     """, "{gpu}", "rule[0].reject.message: placeholder {gpu} names no axis or field"),
    ("""
     [[rule]]
     when = { backend = "triton", arch = "sm90" }
     reject = { error = "ValueError", message = "x" }
     [[rule]]
     when = { backend = "triton", arch = "sm90", dcp = 2 }
     reject = { error = "ValueError", message = "y" }
     """, "dcp = 2", "rule[1].when: rule is unreachable: every cell it matches is decided earlier by rule[0]"),
    ("""
     [[rule]]
     when = { backend = "triton", "model.num_heads" = ">1000" }
     reject = { error = "ValueError", message = "x" }
     """, "num_heads", "rule[0].when: rule matches no cell of the matrix"),
    ("""
     [models.deepseek-v3]
     mla = true
     num_heads = 1
     """, "[models.deepseek-v3]", "models.deepseek-v3: duplicate model name 'deepseek-v3' (already in the built-in catalogue)"),
    ("""
     [[rule]]
     when = { backend = "triton", dcp = ">x" }
     reject = { error = "ValueError", message = "x" }
     """, 'dcp = ">x"', "rule[0].when.dcp: dcp takes int values, got '>x'"),
    ("""
     [[rule]]
     when = { backend = "triton", arch = ">90" }
     reject = { error = "ValueError", message = "x" }
     """, 'arch = ">90"', "rule[0].when.arch: comparison '>90' needs a numeric field; arch is str"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     reject = { error = "Value Error", message = "x" }
     """, "Value Error", "rule[0].reject.error: error must name an exception type"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     reject = { error = "ValueError", message = "x", match = "y" }
     """, "match", "rule[0].reject: reject needs exactly one of 'message' (exact text) or 'match' (regex)"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     """, "[[rule]]", "rule[0]: a rule needs an outcome"),
    ("""
     [[rule]]
     when = { backend = "triton" }
     accept = true
     colour = "red"
     """, "colour", "rule[0].colour: unknown key 'colour' in rule"),
    ("""
     [engine]
     name = "reference"
     flavour = 1
     """, "flavour", "engine.flavour: unknown key 'flavour'"),
])
def test_each_mistake_is_reported_with_its_line(tmp_path, body, needle, expected):
    path = write(tmp_path, body)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, needle)
    assert any(p.startswith(f"matrix/m.toml:{line}: {expected}") for p in str(info.value).splitlines()), str(info.value)


@pytest.mark.parametrize("axes, needle, expected", [
    (AXES.replace('"sm100"]', '"sm95x!"]'), "sm95x!", "axes.arch: unknown arch 'sm95x!'"),
    (AXES.replace('["none",', '["medusa-3",'), "medusa", "axes.spec: unknown spec setting 'medusa-3'"),
    (AXES.replace('"llama-3.1-8b"]', '"gpt-7"]'), "gpt-7", "axes.model: unknown model 'gpt-7'"),
    (AXES.replace("[1, 2, 4]", "[1, 2, 2]"), "dcp", "axes.dcp: duplicate value 2"),
    (AXES.replace("[1, 2, 4]", '["1"]'), "dcp", "axes.dcp: dcp values must be integers, got '1'"),
    (AXES + "colour = [\"red\"]\n", "colour", "axes.colour: unknown axis 'colour'"),
])
def test_bad_axes(tmp_path, axes, needle, expected):
    path = write(tmp_path, "", axes=axes)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, needle)
    assert any(p.startswith(f"matrix/m.toml:{line}: {expected}") for p in str(info.value).splitlines()), str(info.value)


def test_missing_required_axis(tmp_path):
    lines = problems(tmp_path, "", axes=AXES.replace('arch    = ["sm90", "sm100"]\n', ""))
    assert lines == ["matrix/m.toml:2: axes: missing required axis 'arch'"]


def test_toml_syntax_error_has_line_and_column(tmp_path):
    lines = problems(tmp_path, """
        [[rule]]
        when = { backend = "triton"
    """)
    assert len(lines) == 1
    assert lines[0].startswith("matrix/m.toml:10: invalid TOML: ")
    assert "(column" in lines[0]


def test_duplicate_model_table_in_toml(tmp_path):
    lines = problems(tmp_path, """
        [models.a]
        mla = false
        num_heads = 2
        head_dim = 8
        [models.a]
        mla = false
        num_heads = 2
        head_dim = 8
    """)
    assert lines[0].startswith("matrix/m.toml:13: invalid TOML: Cannot declare ('models', 'a') twice")


def test_all_problems_are_reported_at_once(tmp_path):
    lines = problems(tmp_path, """
        [[rule]]
        when = { arch = "sm95" }
        reject = { error = "ValueError", message = "x" }
        [[rule]]
        when = { backend = "nope" }
        reject = { error = "ValueError", match = "(" }
    """)
    assert len(lines) == 3
    assert [int(l.split(":")[1]) for l in lines] == sorted(int(l.split(":")[1]) for l in lines)


def test_missing_file_and_binary_file(tmp_path):
    with pytest.raises(MatrixError, match="cannot read matrix file"):
        load_matrix(tmp_path / "absent.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(MatrixError, match="not UTF-8"):
        load_matrix(bad)


def test_builtin_matrix_loads_with_1440_cells():
    import pathlib

    m = load_matrix(pathlib.Path(__file__).parents[2] / "matrix" / "reference.toml")
    assert m.size == 1440
    assert len(list(m.cells())) == 1440


def test_inconsistent_rope_scaling_and_quantization_name_file_line_and_field(tmp_path):
    body = """
    [models.yarn-without-length]
    mla = true
    num_heads = 16
    kv_lora_rank = 512
    qk_rope_head_dim = 64
    qk_nope_head_dim = 128
    v_head_dim = 128
    rope_scaling = { type = "yarn", factor = 40, mscale_all_dim = 0.707 }

    [models.odd-quant]
    mla = false
    num_heads = 8
    head_dim = 64

    [models.odd-quant.quantization]
    quant_method = "int3"
    """
    axes = AXES.replace('["deepseek-v3", "llama-3.1-8b"]', '["yarn-without-length", "odd-quant"]')
    path = write(tmp_path, body, axes)
    lines = problems(tmp_path, body, axes)
    assert lines == [
        f"matrix/m.toml:{line_of(path, 'rope_scaling =')}: models.yarn-without-length.rope_scaling.factor: "
        "a YaRN factor (40) needs original_max_position_embeddings",
        f"matrix/m.toml:{line_of(path, 'quant_method')}: models.odd-quant.quantization.quant_method: "
        "unknown quantization method 'int3' (known: fp8, modelopt, modelopt_fp4, compressed-tensors, w8a8_fp8)",
    ]


# -- hostile values: every one a problem with its line, never a crash ------------------------

@pytest.mark.parametrize("value", ['[["x"]]', '[{ name = "x" }]', '["triton", ["fa3"]]', '[{}]'])
def test_an_axis_value_that_is_a_list_or_a_table_is_a_problem_not_a_crash(tmp_path, value):
    axes = AXES.replace('backend = ["triton", "trtllm_mla", "fa3"]', f"backend = {value}")
    path = write(tmp_path, "", axes=axes)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, "backend =")
    assert any(p.startswith(f"matrix/m.toml:{line}: axes.backend: backend values must be non-empty strings, got ")
               for p in str(info.value).splitlines()), str(info.value)


@pytest.mark.parametrize("field, text, char", [
    ("message", "flashmla serves MLA\\u00a0models only", "U+00A0 NO-BREAK SPACE"),
    ("message", "\\u200bflashmla", "U+200B ZERO WIDTH SPACE"),
    ("match", "^flash\\u202emla", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("error", "Value\\u200dError", "U+200D ZERO WIDTH JOINER"),
])
def test_invisible_characters_in_a_rule_are_named_with_their_line(tmp_path, field, text, char):
    other = 'message = "x"' if field == "error" else ""
    reject = (f'error = "{text}", {other}' if field == "error" else f'error = "ValueError", {field} = "{text}"')
    path = write(tmp_path, f"""
        [[rule]]
        when = {{ backend = "fa3" }}
        reject = {{ {reject} }}
    """)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, "reject =")
    problem = next(p for p in str(info.value).splitlines() if "invisible" in p)
    assert problem.startswith(f"matrix/m.toml:{line}: rule[0].reject.{field}: value ")
    assert f"has an invisible character, {char}, at character" in problem


def test_an_invisible_character_in_an_axis_value_is_named(tmp_path):
    axes = AXES.replace('"fa3"]', '"fa3\\u200b"]')
    lines = problems(tmp_path, "", axes=axes)
    assert any("axes.backend: value 'fa3\\u200b' has an invisible character, U+200B ZERO WIDTH SPACE, at "
               "character 3" in line for line in lines), lines


@pytest.mark.parametrize("regex, says", [
    ("", "matches every message"),
    (".*", "matches every message"),
    ("(?x) ", "matches every message"),
    ("refused|", "matches every message"),
    ("(a+)+$", "catastrophic backtracking"),
    ("^(\\\\w+\\\\s?)+$", "catastrophic backtracking"),
    ("(.*,)+x", "catastrophic backtracking"),
])
def test_a_regex_that_cannot_fail_or_cannot_finish_is_a_problem(tmp_path, regex, says):
    path = write(tmp_path, f"""
        [[rule]]
        when = {{ backend = "fa3" }}
        reject = {{ error = "ValueError", match = "{regex}" }}
    """)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, "match =")
    assert str(info.value).startswith(f"matrix/m.toml:{line}: rule[0].reject.match: regex ")
    assert says in str(info.value)


@pytest.mark.parametrize("regex", ["^(\\\\d+\\\\.){3}", "(.*, )?only", "(a+)++b", "^Selected backend [A-Z_]+"])
def test_bounded_optional_and_possessive_repetitions_are_fine(tmp_path, regex):
    m = load_matrix(write(tmp_path, f"""
        [[rule]]
        when = {{ backend = "fa3" }}
        reject = {{ error = "ValueError", match = "{regex}" }}
    """))
    assert m.rules[0].match == regex.replace("\\\\", "\\")


def test_rules_can_ask_for_the_checkpoints_quantization(tmp_path):
    body = """
    [[rule]]
    when = { "model.quantization" = "fp8" }
    reject = { error = "ValueError", message = "fp8 checkpoints refused" }
    """
    m = load_matrix(write(tmp_path, body), display_path="matrix/m.toml")
    refused = {c.model for c in m.cells() if m.expectation(c).kind == "reject"}
    assert refused == {"deepseek-v3"}  # llama-3.1-8b is a bf16 checkpoint


# -- links: the upstream reports of a known bug ----------------------------------------------

def test_links_follow_the_xfail_into_the_expectation(tmp_path):
    m = load_matrix(write(tmp_path, """
        [[rule]]
        when = { backend = "triton", dcp = ">1" }
        xfail = "triton + DCP raises in the KV write"
        links = ["https://github.com/example/engine/issues/7", "https://github.com/example/engine/pull/9"]
        [[rule]]
        when = { backend = "trtllm_mla", arch = "sm90" }
        reject = { error = "ValueError", match = "Blackwell" }
        xfail = "refused with the wrong text"
        links = ["https://example.org/bugs/1"]
        [[rule]]
        when = { backend = "fa3", dcp = ">1" }
        xfail = "no links here"
    """))
    marked = m.expectation(Cell("deepseek-v3", "triton", 2, "none", "sm90"))
    assert (marked.kind, marked.xfail, marked.xfail_after_accept) == ("accept", "triton + DCP raises in the KV write", True)
    assert marked.links == ("https://github.com/example/engine/issues/7", "https://github.com/example/engine/pull/9")
    assert marked.as_dict()["links"] == list(marked.links)
    refused = m.expectation(Cell("deepseek-v3", "trtllm_mla", 1, "none", "sm90"))
    assert (refused.kind, refused.links) == ("reject", ("https://example.org/bugs/1",))
    plain = m.expectation(Cell("deepseek-v3", "fa3", 2, "none", "sm90"))
    assert plain.xfail == "no links here" and plain.links == () and "links" not in plain.as_dict()
    assert "links" not in m.expectation(Cell("deepseek-v3", "triton", 1, "none", "sm90")).as_dict()


@pytest.mark.parametrize("links, expected", [
    ('"https://x.org/1"', "links must be a non-empty list of URLs"),
    ("[]", "links must be a non-empty list of URLs"),
    ('["github.com/o/e/issues/1"]', "link 0 must be an http(s) URL without spaces, got 'github.com/o/e/issues/1'"),
    ('["https://x.org/a b"]', "link 0 must be an http(s) URL without spaces"),
    ("[12]", "link 0 must be an http(s) URL without spaces, got 12"),
    ('["https://x.org/1", "https://x.org/1"]', "duplicate link 'https://x.org/1'"),
])
def test_bad_links_are_named_with_their_line(tmp_path, links, expected):
    body = f"""
        [[rule]]
        when = {{ backend = "triton", dcp = ">1" }}
        xfail = "known bug"
        links = {links}
    """
    path = write(tmp_path, body)
    lines = problems(tmp_path, body)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"matrix/m.toml:{line_of(path, 'links =')}: rule[0].links: {expected}"), lines


def test_links_without_an_xfail_are_a_problem(tmp_path):
    body = """
        [[rule]]
        when = { backend = "trtllm_mla", arch = "sm90" }
        reject = { error = "ValueError", match = "Blackwell" }
        links = ["https://x.org/1"]
    """
    path = write(tmp_path, body)
    assert problems(tmp_path, body) == [
        f"matrix/m.toml:{line_of(path, 'links =')}: rule[0].links: links name the upstream reports of a known "
        "bug: give the rule an xfail reason too"]
# -- platforms: arch values beyond GPU archs ----------------------------------------------

PLATFORM_AXES = AXES.replace('arch    = ["sm90", "sm100"]', 'arch    = ["sm90", "gfx942", "gfx950", "cpu", "cpu_amx", "xpu", "npu"]')


def test_device_archs_expand_and_rules_test_their_platform(tmp_path):
    m = load_matrix(write(tmp_path, """
        [[rule]]
        name = "a ROCm-only backend elsewhere"
        when = { backend = "trtllm_mla", "arch.platform" = { not = ["cuda"] } }
        reject = { error = "ValueError", message = "no {backend} on {arch.platform} ({arch})" }
        [[rule]]
        when = { "arch.platform" = ["cpu", "npu"], backend = "fa3" }
        skip = "not built there"
    """, axes=PLATFORM_AXES))
    cells = {c.arch for c in m.cells()}
    assert cells == {"sm90", "gfx942", "gfx950", "cpu", "cpu_amx", "xpu", "npu"}
    gfx = m.expectation(Cell("deepseek-v3", "trtllm_mla", 1, "none", "gfx950"))
    assert (gfx.kind, gfx.message) == ("reject", "no trtllm_mla on rocm (gfx950)")
    assert m.expectation(Cell("deepseek-v3", "trtllm_mla", 1, "none", "sm90")).kind == "accept"
    assert m.expectation(Cell("deepseek-v3", "fa3", 1, "none", "cpu_amx")).kind == "skip"
    assert m.expectation(Cell("deepseek-v3", "fa3", 1, "none", "xpu")).kind == "accept"
    # arch.sm is an NVIDIA number: a comparison never holds on another platform
    m2 = load_matrix(write(tmp_path, """
        [[rule]]
        when = { "arch.sm" = "<100" }
        reject = { error = "ValueError", message = "old" }
    """, axes=PLATFORM_AXES, name="m2.toml"))
    assert m2.expectation(Cell("deepseek-v3", "fa3", 1, "none", "cpu")).kind == "accept"
    assert m2.expectation(Cell("deepseek-v3", "fa3", 1, "none", "sm90")).kind == "reject"


def test_unknown_platform_in_a_rule_is_reported_with_its_line(tmp_path):
    path = write(tmp_path, """
        [[rule]]
        when = { "arch.platform" = "tpu" }
        accept = true
    """, axes=PLATFORM_AXES)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, '"tpu"')
    assert f"matrix/m.toml:{line}: rule[0].when.\"arch.platform\": unknown value 'tpu' (known: cuda, rocm, cpu, xpu, npu)" \
        in str(info.value).splitlines()


def test_unknown_device_arch_is_an_error(tmp_path):
    path = write(tmp_path, "", axes=AXES.replace('"sm100"]', '"cpu-avx"]'))
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    assert "axes.arch: unknown arch 'cpu-avx'" in str(info.value)
    assert "cpu, cpu_amx, xpu, npu" in str(info.value)


# -- reasons: a message composed of every failing check, as vLLM's validate_configuration lists them ----

REASONS_RULE = """
    [[rule]]
    when = { backend = "fa3" }
    reject = { error = "ValueError", message = "Selected backend {backend} is not valid. Reason: {reasons}" }
    reasons = [
      { when = { "model.mla" = false }, text = "non-MLA not supported" },
      { when = { arch = "sm100" }, text = "compute capability not supported" },
      { when = { dcp = ">1" }, text = "DCP {dcp} not supported" },
    ]
    [[rule]]
    when = { backend = "fa3" }
    reject = { error = "ValueError", message = "later" }
"""


def test_reasons_render_the_holding_checks_in_order_as_a_python_list(tmp_path):
    m = load_matrix(write(tmp_path, REASONS_RULE))
    every = m.expectation(Cell("llama-3.1-8b", "fa3", 2, "none", "sm100"))
    assert (every.kind, every.rule, every.message) == ("reject", 0, "Selected backend fa3 is not valid. Reason: "
                                                       "['non-MLA not supported', 'compute capability not supported', "
                                                       "'DCP 2 not supported']")
    one = m.expectation(Cell("deepseek-v3", "fa3", 1, "none", "sm100"))
    assert one.message == "Selected backend fa3 is not valid. Reason: ['compute capability not supported']"
    # no reason holds: the engine finds nothing to refuse, the rule does not match, the next one decides
    none = m.expectation(Cell("deepseek-v3", "fa3", 1, "none", "sm90"))
    assert (none.rule, none.message) == (1, "later")


@pytest.mark.parametrize("body, needle, expected", [
    (REASONS_RULE.replace("{reasons}", "{why}"), "{why}", "rule[0].reject.message: placeholder {why} names no axis"),
    (REASONS_RULE.replace("Reason: {reasons}", "Reason: fixed"), "Reason: fixed",
     "rule[0].reject.message: a rule with reasons renders them: the message needs {reasons}"),
    (REASONS_RULE.replace('text = "non-MLA', 'txt = "non-MLA'), "reasons = [",
     "rule[0].reasons[0].txt: unknown key 'txt' in reason"),
    (REASONS_RULE.replace('{ dcp = ">1" }', '{ dcp = ">4" }'), "reasons = [",
     "rule[0].reasons[2].when: reason 'DCP {dcp} not supported' holds for no cell this rule decides"),
    ("""
     [[rule]]
     when = { backend = "fa3" }
     reject = { error = "ValueError", message = "x {reasons}" }
     """, "{reasons}", "rule[0].reject.message: placeholder {reasons} names no axis"),
])
def test_reasons_mistakes_are_reported_with_their_line(tmp_path, body, needle, expected):
    path = write(tmp_path, body)
    with pytest.raises(MatrixError) as info:
        load_matrix(path, display_path="matrix/m.toml")
    line = line_of(path, needle)
    assert any(p.startswith(f"matrix/m.toml:{line}: {expected}") for p in str(info.value).splitlines()), str(info.value)


@pytest.mark.parametrize("name", ["sglang", "vllm", "reference"])
def test_the_rule_index_matches_what_each_rule_says_on_the_shipped_matrices(name):
    """``RuleIndex`` answers from per-value bitmasks; each rule's own ``matches`` is the truth. Every
    13th cell of the shipped matrices (all their rule kinds: reasons, model fields, spec and arch
    fields, version gates), and the expectation each way."""
    from pathlib import Path

    from packaging.version import Version

    from pytest_mla.core.rules import RuleIndex, decide

    path = Path(__file__).resolve().parents[2] / "matrix" / f"{name}.toml"
    matrix = load_matrix(path)
    index = RuleIndex(matrix.rules, matrix.axes, matrix.models)
    assert any(rule.reasons for rule in matrix.rules) or name != "vllm"
    for n, cell in enumerate(matrix.cells()):
        if n % 13:
            continue
        model = matrix.models[cell.model]
        assert [r.index for r in index.rules_matching(cell)] == [r.index for r in matrix.rules if r.matches(cell, model)]
        for version in (None, Version("0.5.22"), Version("0.34.0")):
            assert decide(matrix.rules, cell, model, version, index) == decide(matrix.rules, cell, model, version), cell.id


def test_rule_index_honours_reasons_that_read_another_axis_than_the_rule(tmp_path):
    """A reject rule with reasons matches only where one of its reasons holds; the reasons may read
    axes its ``when`` does not (here ``dcp`` and ``model.mla``)."""
    axes = """
        [axes]
        model = ["deepseek-v3", "llama-3.1-8b"]
        backend = ["a", "b"]
        dcp = [1, 2]
        spec = ["none", "eagle-1x3"]
        arch = ["sm90", "gfx942"]
    """
    path = write(tmp_path, """
        [[rule]]
        when = { backend = "a" }
        reject = { error = "ValueError", message = "no: {reasons}" }
        reasons = [
          { when = { dcp = 2 }, text = "DCP not supported" },
          { when = { "model.mla" = false, "spec.enabled" = true }, text = "spec needs MLA" },
        ]

        [[rule]]
        when = { "arch.platform" = "rocm" }
        reject = { error = "ValueError", message = "rocm" }
    """, axes=axes)
    matrix = load_matrix(path)
    got = {cell.id: (e.kind, e.message) for cell in matrix.cells() for e in [matrix.expectation(cell)]}
    assert got["deepseek-v3/a/dcp1/none/sm90"] == ("accept", None)
    assert got["deepseek-v3/a/dcp2/none/sm90"] == ("reject", "no: ['DCP not supported']")
    assert got["llama-3.1-8b/a/dcp2/eagle-1x3/sm90"] == ("reject", "no: ['DCP not supported', 'spec needs MLA']")
    assert got["llama-3.1-8b/a/dcp1/eagle-1x3/gfx942"] == ("reject", "no: ['spec needs MLA']")
    assert got["deepseek-v3/a/dcp1/eagle-1x3/gfx942"] == ("reject", "rocm")
    assert got["llama-3.1-8b/b/dcp2/none/sm90"] == ("accept", None)
