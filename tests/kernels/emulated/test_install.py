"""Installing emulations where an engine looks its kernels up, and logging what it called."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest

from pytest_mla.kernels.emulated.glue import OutOfContractError
from pytest_mla.kernels.emulated.install import emulations_installed


def test_a_missing_library_becomes_importable_with_only_its_emulations():
    assert importlib.util.find_spec("pytest_mla_nolib") is None
    registry = {"pytest_mla_nolib.mla:decode": lambda x: x + 1}
    with emulations_installed(["pytest_mla_nolib.mla:decode"], registry) as log:
        assert importlib.util.find_spec("pytest_mla_nolib") is not None  # an "is it installed" probe says yes
        from pytest_mla_nolib.mla import decode, other  # noqa: F401  (engines import names they never call)
        import pytest_mla_nolib

        assert log.called == []  # installed is not called
        assert decode(1) == 2 and pytest_mla_nolib.mla.decode(2) == 3
        assert log.called == ["pytest_mla_nolib.mla:decode"]
        with pytest.raises(OutOfContractError, match=r"^pytest_mla_nolib\.mla\.other: has no emulation"):
            other(1)

        class Subclass(pytest_mla_nolib.mla.SomeBase):  # class statements over library bases still import
            pass
    assert "pytest_mla_nolib" not in sys.modules and "pytest_mla_nolib.mla" not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module("pytest_mla_nolib")


def test_names_bound_by_from_imports_are_rebound_and_restored():
    lib = types.ModuleType("pytest_mla_reallib")

    def real(x):
        raise RuntimeError("a CUDA kernel")

    lib.kernel = real
    user = types.ModuleType("pytest_mla_user")
    user.kernel = real  # `from pytest_mla_reallib import kernel`
    sys.modules.update({"pytest_mla_reallib": lib, "pytest_mla_user": user})
    try:
        with emulations_installed(["pytest_mla_reallib:kernel"], {"pytest_mla_reallib:kernel": lambda x: -x}) as log:
            assert user.kernel(3) == -3 and lib.kernel(4) == -4
            assert log.called == ["pytest_mla_reallib:kernel"]
        assert user.kernel is real and lib.kernel is real
    finally:
        del sys.modules["pytest_mla_reallib"], sys.modules["pytest_mla_user"]


def test_classes_are_logged_when_a_method_runs_not_when_built_and_keep_their_name():
    class Wrapper:
        def __init__(self, n):
            self.n = n

        def run(self, x):
            return self.n * x

    with emulations_installed(["pytest_mla_nolib2:Wrapper"], {"pytest_mla_nolib2:Wrapper": Wrapper}) as log:
        from pytest_mla_nolib2 import Wrapper as Installed

        built = Installed(5)
        assert Installed.__name__ == "Wrapper" and isinstance(built, Wrapper) and log.called == []
        assert built.run(2) == 10 and log.called == ["pytest_mla_nolib2:Wrapper"]


def test_torch_ops_namespaces_get_the_op():
    import torch

    with emulations_installed(["torch.ops._pytest_mla_C:op"], {"torch.ops._pytest_mla_C:op": lambda: "emulated"}) as log:
        assert torch.ops._pytest_mla_C.op() == "emulated"
        assert log.called == ["torch.ops._pytest_mla_C:op"]
    assert "op" not in torch.ops._pytest_mla_C.__dict__


def test_guarded_imports_skipped_without_the_library_are_bound_late(tmp_path, monkeypatch):
    (tmp_path / "pytest_mla_engine_pkg").mkdir()
    (tmp_path / "pytest_mla_engine_pkg" / "__init__.py").write_text("")
    (tmp_path / "pytest_mla_engine_pkg" / "backend.py").write_text(
        "import importlib.util\n"
        "if importlib.util.find_spec('pytest_mla_nolib3') is not None:\n"
        "    from pytest_mla_nolib3.mla import Wrapper, helper as h\n"
        "    import pytest_mla_nolib3\n"
        "    import pytest_mla_nolib3.mla as mla\n"
        "def build(n):\n"
        "    return Wrapper(n)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pytest_mla_engine_pkg.backend as backend

    assert not hasattr(backend, "Wrapper")  # imported on a host without the library

    class Wrapper:
        def __init__(self, n):
            self.n = n

        def run(self):
            return self.n

    names = ["pytest_mla_nolib3.mla:Wrapper"]
    with emulations_installed(names, {names[0]: Wrapper}, late_imports=("pytest_mla_engine_pkg",)) as log:
        assert backend.build(3).run() == 3 and log.called == names
        assert backend.pytest_mla_nolib3.mla.Wrapper is backend.Wrapper and backend.mla.Wrapper is backend.Wrapper
        with pytest.raises(OutOfContractError, match="pytest_mla_nolib3.mla.helper"):
            backend.h()
    assert not any(hasattr(backend, n) for n in ("Wrapper", "h", "mla", "pytest_mla_nolib3"))


def test_a_library_class_without_emulation_builds_but_refuses_to_run():
    with emulations_installed(["pytest_mla_nolib4:decode"], {"pytest_mla_nolib4:decode": lambda: 1}):
        from pytest_mla_nolib4 import PrefillWrapper

        wrapper = PrefillWrapper(workspace=None)  # an engine builds it in its constructor
        with pytest.raises(OutOfContractError, match=r"^pytest_mla_nolib4\.PrefillWrapper\.run: has no emulation"):
            wrapper.run(1, 2)


def test_a_stood_in_package_re_exports_its_submodules_emulations():
    names = ["pytest_mla_nolib5.mla:Wrapper"]
    with emulations_installed(names, {names[0]: lambda: "w"}) as log:
        from pytest_mla_nolib5 import Wrapper  # flashinfer exports its mla wrapper at the top

        assert Wrapper() == "w" and log.called == names  # a function: logged when called


def test_any_submodule_of_a_stood_in_library_imports_and_its_names_refuse_to_run():
    names = ["pytest_mla_nolib6.mla:decode"]
    with emulations_installed(names, {names[0]: lambda: 1}):
        from pytest_mla_nolib6.comm.alltoall import exchange  # a submodule no emulation covers

        with pytest.raises(OutOfContractError, match=r"^pytest_mla_nolib6\.comm\.alltoall\.exchange: has no emulation"):
            exchange()
    assert not any(n.startswith("pytest_mla_nolib6") for n in sys.modules)
    with pytest.raises(ImportError):
        importlib.import_module("pytest_mla_nolib6.comm")


def test_a_handle_cached_in_an_earlier_check_reports_to_the_current_one_and_refuses_outside():
    names = ["pytest_mla_nolib7:kernel"]
    registry = {names[0]: lambda: 7}
    with emulations_installed(names, registry):
        from pytest_mla_nolib7 import kernel as cached  # an engine's cache_once loader keeps this
    with emulations_installed(names, registry) as log:
        assert cached() == 7 and log.called == names
    with pytest.raises(OutOfContractError, match="outside one"):
        cached()


def test_a_module_kept_from_an_earlier_check_answers_with_the_installation_in_force():
    """An engine module's top-level ``import flash_mla`` keeps the first check's stand-in module; a later
    check's call through it must reach the emulation in force (it used to find a placeholder)."""
    names = ["pytest_mla_nolib8:decode"]
    registry = {names[0]: lambda: 8}
    with emulations_installed(names, registry):
        kept = importlib.import_module("pytest_mla_nolib8")
    with emulations_installed(names, registry) as log:
        assert kept.decode() == 8 and log.called == names
    with pytest.raises(OutOfContractError, match="has no emulation"):
        kept.decode()


def test_an_unimportable_subpackage_of_a_real_package_is_stood_in_and_its_guarded_none_rebound(tmp_path, monkeypatch):
    """SGLang's vendored FA4 (``sglang.kernels...flash_attn.cute``) fails to import without NVIDIA's CuTe DSL;
    its wrapper binds ``None`` in a guarded import. Only that subpackage is stood in (the real parent
    package's other missing modules still fail to import), and the ``None`` gets the emulation."""
    pkg = tmp_path / "pytest_mla_real_pkg"
    (pkg / "vendored").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "vendored" / "__init__.py").write_text("import pytest_mla_no_such_dsl\n")
    (pkg / "wrapper.py").write_text(
        "try:\n"
        "    from pytest_mla_real_pkg.vendored import attend as _attend\n"
        "except Exception:\n"
        "    _attend = None\n"
        "def call(x):\n"
        "    if _attend is None:\n"
        "        raise ImportError('vendored kernels unavailable')\n"
        "    return _attend(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pytest_mla_real_pkg.wrapper as wrapper

    assert wrapper._attend is None
    names = ["pytest_mla_real_pkg.vendored:attend"]
    with emulations_installed(names, {names[0]: lambda x: x + 1}, late_imports=("pytest_mla_real_pkg",)) as log:
        assert wrapper.call(1) == 2 and log.called == names
        with pytest.raises(ImportError):  # the real package is not stood in: its absent modules stay absent
            importlib.import_module("pytest_mla_real_pkg.not_there")
        assert importlib.import_module("pytest_mla_real_pkg.vendored.interface")  # inside the stand-in: a stand-in
    assert wrapper._attend is None
    with pytest.raises(ImportError):
        importlib.import_module("pytest_mla_real_pkg.vendored")
