"""``engines.common.import_stubs``: placeholders an engine may import, subclass and build, but not call."""

from __future__ import annotations

import pytest

from pytest_mla.core.errors import StubCalled
from pytest_mla.engines.common.import_stubs import StubModule


def test_a_placeholder_functions_answer_raises_when_used_naming_it():
    """Called for a side effect (a warm-up) or kept, nothing happens; unpacked, indexed, added or handed to
    torch, the answer raises StubCalled naming the function."""
    import torch

    stub = StubModule("kernel_lib")
    stub.warmup_compile(3)  # dropped: fine, as a start-up's warm-up call
    kept = stub.decode.mla_decode_fwd(1, 2)
    uses = (lambda: tuple(kept), lambda: kept[0], lambda: kept + 1, lambda: kept.shape, lambda: torch.add(kept, 1),
            lambda: torch.zeros(2) * kept, lambda: int(kept))
    for use in uses:
        with pytest.raises(StubCalled, match=r"^kernel_lib\.decode\.mla_decode_fwd is an import stub"):
            use()


def test_a_placeholder_class_is_built_and_subclassed_as_an_engine_does_at_import():
    stub = StubModule("kernel_lib")
    wrapper = stub.BatchMLAPagedAttentionWrapper("workspace")  # a class name: built, inert
    assert isinstance(wrapper, stub.BatchMLAPagedAttentionWrapper)

    class EngineWrapper(stub.BatchMLAPagedAttentionWrapper):
        def plan(self):
            return "planned"

    assert EngineWrapper().plan() == "planned"
    with pytest.raises(StubCalled, match="BatchMLAPagedAttentionWrapper.run is an import stub"):
        out, lse = wrapper.run()  # a method of a placeholder class is a placeholder function
