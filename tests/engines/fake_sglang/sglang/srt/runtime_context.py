"""Platform facts, scoped overrides and the published configuration (like SGLang 0.5.20's)."""

import os
import types

# As in 0.5.20/0.5.21: no is_mps, no is_sm110.
_PLATFORM_PROBES = {name: name for name in (
    "is_cuda", "is_hip", "is_npu", "is_xpu", "is_musa", "is_sm90", "is_sm100", "is_sm100_or_sm110",
    "is_sm120", "is_blackwell", "is_hopper_with_cuda_12_3", "has_amx", "has_flashinfer")}
if os.environ.get("FAKE_SGLANG_EXTRA_FACT"):
    _PLATFORM_PROBES["is_sm999"] = "is_sm999_supported"
_PLATFORM_VALUES = {"device_sm": "get_device_sm", "device_capability": "get_device_capability"}

_OVERRIDES = {}
_PUBLISHED = {}


class _PlatformOverride:
    def __init__(self, **facts):
        self._facts = facts
        self._saved = None

    def __enter__(self):
        unknown = set(self._facts) - set(_PLATFORM_PROBES) - set(_PLATFORM_VALUES)
        if unknown:
            raise ValueError(f"unknown platform fact(s): {sorted(unknown)}")
        self._saved = dict(_OVERRIDES)
        _OVERRIDES.update(self._facts)
        return get_platform()

    def __exit__(self, *exc):
        _OVERRIDES.clear()
        _OVERRIDES.update(self._saved)


def override_platform(**facts):
    return _PlatformOverride(**facts)


def get_platform():
    return types.SimpleNamespace(**_OVERRIDES)


def publish(server_args, *, role):
    _PUBLISHED["args"] = server_args


def _args():
    return _PUBLISHED["args"]


def get_spec():
    return _args()


def get_schedule():
    return _args()


def get_model():
    return _args()


def get_device():
    return types.SimpleNamespace(device=_args().device)


def attention_backends():
    args = _args()
    return (args.prefill_attention_backend or args.attention_backend,
            args.decode_attention_backend or args.attention_backend)
