"""The ``Engine`` base class: its optional steps' defaults mean "not offered", as a missing step does."""

import ast
from pathlib import Path

import pytest

import pytest_mla.engines
from pytest_mla.core.matrix import load_matrix
from pytest_mla.engines.protocol import OPTIONAL_STEPS, Configured, Engine, optional_step
from pytest_mla.engines.reference import ReferenceEngine
from pytest_mla.engines.registry import EngineNotFoundError, load_engine
from pytest_mla.runner import check_known_archs, coverage_of

from ..plugin.helpers import matrix


class Minimal(Engine):
    """Only what an adapter must have."""

    name = "minimal"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        return Configured({"decode": cell.backend})


class DuckTyped:
    """An adapter that does not subclass ``Engine`` and has none of the optional steps."""

    name = "duck"
    version = "1.0"
    refusal_errors = (ValueError,)

    def configure(self, cell, model):
        return Configured({"decode": cell.backend})


class SaysNone(DuckTyped):
    """Duck-typed, with every optional step answering None ("cannot say")."""

    def registered_backends(self):
        return None

    def known_archs(self):
        return None


@pytest.fixture
def m(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(matrix(["triton"], engine="minimal", archs=("sm90", "npu")))
    return load_matrix(path)


@pytest.mark.parametrize("engine", [Minimal(), DuckTyped(), SaysNone()], ids=["subclass", "duck", "says-none"])
def test_an_adapter_without_optional_steps_reads_as_the_defaults(engine, m):
    assert optional_step(engine, "metadata")() == {}
    assert optional_step(engine, "registered_backends")() is None
    assert optional_step(engine, "known_archs")() is None
    assert optional_step(engine, "run_check")("case", "spec", where="sm90", dcp_mode="in-process", timeout_s=1) is None
    assert coverage_of(m, engine) is None  # the report: coverage unknown
    check_known_archs(m, engine, "m.toml")  # no arch refused, not even "npu"


def test_an_adapters_own_step_wins_over_the_default():
    class Listing(Minimal):
        def registered_backends(self):
            return {"triton": True, "flashmla": True, "torch_native": False}

    assert optional_step(Listing(), "registered_backends")() == {"triton": True, "flashmla": True,
                                                                 "torch_native": False}
    assert optional_step(ReferenceEngine(), "metadata")()["backends"][0] == "triton"


def test_only_the_optional_steps_have_defaults():
    assert OPTIONAL_STEPS == ("metadata", "registered_backends", "known_archs", "run_check")
    with pytest.raises(ValueError, match="'configure' is not an optional step"):
        optional_step(Minimal(), "configure")


def test_the_builtin_adapters_subclass_engine():
    """Read from the source: importing the SGLang and vLLM adapters imports their engines."""
    assert issubclass(ReferenceEngine, Engine)
    engines = Path(pytest_mla.engines.__file__).parent
    for path, cls in (("sglang/adapter.py", "SGLangEngine"), ("vllm/adapter.py", "VLLMEngine")):
        tree = ast.parse((engines / path).read_text(encoding="utf-8"))
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        assert [ast.unparse(b) for b in node.bases] == ["Engine"], cls


def test_a_subclass_without_configure_fails_at_load(monkeypatch):
    class NoConfigure(Engine):
        name = "x"
        version = "1.0"
        refusal_errors = (ValueError,)

    with pytest.raises(EngineNotFoundError, match=r"^engine 'nc' \(registered by a pytest_mla_engines hook as 'nc'\): "
                                                  r"constructing the adapter raised TypeError: .*configure"):
        load_engine("nc", {"nc": NoConfigure})
