"""SGLang's load-time arch constants answer the check's arch (``engines/sglang/platform_check.py``).

No SGLang needed: a tiny ``sglang`` package written here stands in, with the
shape of SGLang's own statements (``_is_gfx95 = _is_hip and is_gfx95_supported()``).
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from pytest_mla.engines.sglang.backends import BACKENDS
from pytest_mla.engines.sglang.platform_check import derived_constants, notes

PROBES_SOURCE = '''
ANSWER = {"gfx95": False}


def is_hip():
    return True


def is_gfx95_supported():
    return ANSWER["gfx95"]
'''

USER_SOURCE = '''
from sglang.probes import is_gfx95_supported, is_hip

_is_hip = is_hip()
_is_gfx95 = _is_hip and is_gfx95_supported()
_wide_tiles = _is_gfx95 and True
_TABLE = {"tuned": is_gfx95_supported()}
UNRELATED = 3
'''

# fp8_kernel.py's shape: the platform fp8 type chosen in a top-level if-block, imported elsewhere
FP8_SOURCE = '''
import functools

import torch

from sglang.probes import ANSWER


@functools.lru_cache()
def is_fp8_fnuz():
    return not ANSWER["gfx95"]


if is_fp8_fnuz():
    fp8_dtype = torch.float8_e4m3fnuz
    fp8_max = 224.0
else:
    fp8_dtype = torch.float8_e4m3fn
    fp8_max = torch.finfo(fp8_dtype).max
fp8_min = -fp8_max
'''

KV_SOURCE = '''
from sglang.fp8 import fp8_dtype, fp8_max

OWN_MAX = 224.0
'''


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probes.py").write_text(textwrap.dedent(PROBES_SOURCE))
    (package / "user.py").write_text(textwrap.dedent(USER_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    import sglang.probes
    import sglang.user

    yield sglang.probes, sglang.user
    for name in ("sglang", "sglang.probes", "sglang.user"):
        sys.modules.pop(name, None)


def test_constants_derived_from_a_probe_answer_the_active_arch_and_are_put_back(fake_sglang):
    probes, user = fake_sglang
    assert user._is_gfx95 is False and user._wide_tiles is False  # loaded on the other arch
    probes.ANSWER["gfx95"] = True  # the check's arch (ArchProbes answers it in the child)
    with derived_constants(("is_gfx95_supported",)) as changed:
        assert user._is_gfx95 is True
        assert user._wide_tiles is True  # derived from a derived name, in source order
        assert user._TABLE == {"tuned": False}  # an object, not a plain value: left as it loaded
        assert sorted(changed) == ["sglang.user._is_gfx95", "sglang.user._wide_tiles"]
    assert user._is_gfx95 is False and user._wide_tiles is False
    assert user.UNRELATED == 3


def test_a_statement_that_cannot_run_again_is_the_adapters_error(fake_sglang):
    from pytest_mla.core.errors import AdapterError

    probes, user = fake_sglang
    del probes.ANSWER["gfx95"]  # the probe now raises KeyError
    with pytest.raises(AdapterError, match=r"cannot derive sglang\.user\._is_gfx95 again .*KeyError"):
        with derived_constants(("is_gfx95_supported",)):
            pass
    assert user._is_gfx95 is False


def test_the_platform_fp8_type_of_an_if_block_answers_the_active_arch_where_it_was_imported(fake_sglang, tmp_path):
    """fp8_kernel.py picks e4m3fnuz or e4m3fn in an if-block over its lru-cached probe; kv_cache_dtype.py imports
    the dtype. Both answer the active arch inside the scope, and go back after (the probe's cache emptied)."""
    import torch

    probes, _ = fake_sglang
    (tmp_path / "sglang" / "fp8.py").write_text(textwrap.dedent(FP8_SOURCE))
    (tmp_path / "sglang" / "kv.py").write_text(textwrap.dedent(KV_SOURCE))
    import sglang.fp8 as fp8
    import sglang.kv as kv

    try:
        assert kv.fp8_dtype is torch.float8_e4m3fnuz and fp8.fp8_min == -224.0  # loaded on gfx942
        probes.ANSWER["gfx95"] = True
        with derived_constants(("is_gfx95_supported", "is_fp8_fnuz")) as changed:
            assert fp8.fp8_dtype is torch.float8_e4m3fn and fp8.fp8_max == 448.0 and fp8.fp8_min == -448.0
            assert kv.fp8_dtype is torch.float8_e4m3fn and kv.fp8_max == 448.0  # imported under its name
            assert kv.OWN_MAX == 224.0  # an equal float of its own: not the imported object, left alone
            assert {"sglang.fp8.fp8_dtype", "sglang.kv.fp8_dtype", "sglang.fp8.fp8_min"} <= set(changed)
        probes.ANSWER["gfx95"] = False
        assert kv.fp8_dtype is torch.float8_e4m3fnuz and fp8.fp8_max == 224.0 and fp8.is_fp8_fnuz() is True
    finally:
        for name in ("sglang.fp8", "sglang.kv"):
            sys.modules.pop(name, None)


def test_notes_say_where_the_check_ran_and_what_stood_in_for_the_device():
    assert {platform for b in BACKENDS.values() for platform in b.checked_on} == {"rocm", "cpu", "xpu"}
    said = notes({"platform": "rocm", "arch": "gfx950", "backend": "triton"},
                 ["sglang.kernels.ops.attention.extend_attention._is_gfx95", "sglang.srt.layers.moe.topk._is_gfx95"])
    assert said[0] == "ran in a process that imported SGLang on its ROCm platform, answering for gfx950"
    assert "extend_attention._is_gfx95 (and 1 in other modules)" in said[1]
    assert "Triton's interpreter" in said[2]
    cpu = notes({"platform": "cpu", "arch": "cpu", "backend": "torch_native"}, [])
    assert cpu == ("ran in a process that imported SGLang on its CPU platform, answering for cpu",
                   "torch ran on this host's CPU")


def test_intel_amx_runs_in_the_cpu_child_with_sgl_kernels_cpu_attention_ops_emulated():
    """SGLang's IntelAMXAttnBackend calls sgl-kernel's CPU attention ops, which this host's torch lacks: its
    check runs in the CPU child with both emulated (a GQA pool's write too), and the notes say what ran."""
    from types import SimpleNamespace

    from pytest_mla.engines.sglang.checks import platform_emulations

    assert "cpu" in BACKENDS["intel_amx"].checked_on
    attention = ("torch.ops.sgl_kernel:decode_attention_cpu", "torch.ops.sgl_kernel:extend_attention_cpu")
    cell = SimpleNamespace(arch="cpu_amx", dcp=1)
    assert platform_emulations(cell, SimpleNamespace(mla=True), "cpu", "intel_amx") == attention
    assert platform_emulations(cell, SimpleNamespace(mla=False), "cpu", "intel_amx") == (
        "torch.ops.sgl_kernel:store_cache_cpu", *attention)
    assert platform_emulations(cell, SimpleNamespace(mla=True), "cpu", "torch_native") == ()
    said = notes({"platform": "cpu", "arch": "cpu_amx", "backend": "intel_amx"}, [])
    assert said[1] == "SGLang's IntelAMXAttnBackend ran on this host's CPU around sgl-kernel's CPU attention ops"


def test_xpu_checks_install_sgl_kernel_xpus_flash_attn_with_kvcache_not_fa3s():
    """``sgl_kernel.flash_attn:flash_attn_with_kvcache`` is FA3 on CUDA and sgl-kernel-xpu's op on XPU: an XPU
    check installs the latter (its output is ragged ``[total_q, H, dv]`` even for a batched q; FA3's is
    ``[b, s, H, dv]``), another platform's the former."""
    import importlib

    import torch

    from pytest_mla.engines.sglang.platform_check import emulations

    name = "sgl_kernel.flash_attn:flash_attn_with_kvcache"
    assert BACKENDS["intel_xpu"].platform_ops[("xpu", False)] == (name,)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, 64, generator=gen).to(torch.bfloat16)
    cache = torch.randn(2, 64, 2, 64, generator=gen).to(torch.bfloat16)
    args = dict(cache_seqlens=torch.tensor([5, 9], dtype=torch.int32),
                page_table=torch.tensor([[0], [1]], dtype=torch.int32), causal=True)
    shapes = {}
    for platform in ("xpu", "cpu"):
        with emulations((name,), platform) as log:
            op = importlib.import_module("sgl_kernel.flash_attn").flash_attn_with_kvcache
            shapes[platform] = tuple(op(q, cache, cache, **args).shape)
        assert log.called == [name], log.called
    assert shapes == {"xpu": (2, 4, 64), "cpu": (2, 1, 4, 64)}, shapes
