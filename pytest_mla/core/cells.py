"""Cells: points of a compatibility matrix, with ids that round-trip.

The canonical id joins the coordinates with ``/`` in axis order, the optional
axes tagged so they parse back without knowing the matrix::

    deepseek-v3/trtllm_mla/dcp4/eagle-1x3/sm100
    deepseek-v3/flashmla/dcp1/none/sm90/kv-fp8_e4m3/page64/tp8

A pytest item name joins the same parts with ``-``
(``deepseek-v3-trtllm_mla-dcp4-eagle-1x3-sm100``); values may contain dashes
themselves, so that form parses back only against the matrix's axes
(``Cell.from_name``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Iterable, Mapping, Sequence

#: Axis order: required axes, then the optional ones.
REQUIRED_AXES = ("model", "backend", "dcp", "spec", "arch")
OPTIONAL_AXES = ("kv_dtype", "page_size", "tp")
AXES = REQUIRED_AXES + OPTIONAL_AXES
INT_AXES = frozenset({"dcp", "page_size", "tp"})

#: NVIDIA compute capabilities (``sm90``; an ``a``/``f`` suffix for arch-specific builds) and
#: AMD GFX targets (``gfx90a``, ``gfx942``, ``gfx1100``). A typo such as ``sm9x`` or ``sm95``
#: is an error, not an arch no cell would ever run on.
NVIDIA_SMS = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)
_SM = re.compile(r"^sm(\d+)([af]?)$")
_GFX = re.compile(r"^gfx(\d{2}|\d{3})[0-9a-f]$")

#: The platforms an ``arch`` value belongs to, in report order: NVIDIA GPUs (``smNN``), AMD GPUs
#: (``gfxNNN``) and the devices the engines serve without a GPU arch of their own.
PLATFORMS = ("cuda", "rocm", "cpu", "xpu", "npu")
#: How reports name each platform.
PLATFORM_LABELS = {"cuda": "CUDA", "rocm": "ROCm", "cpu": "CPU", "xpu": "XPU", "npu": "NPU"}
#: Arch values that name a device rather than a GPU arch, and their platform: an x86-64 CPU
#: without and with Intel AMX tiles (both engines pick their CPU MLA backend by AMX), an
#: Intel GPU (XPU), an Ascend NPU.
DEVICE_ARCHS = {"cpu": "cpu", "cpu_amx": "cpu", "xpu": "xpu", "npu": "npu"}


class CellIdError(ValueError):
    pass


def format_part(axis: str, value: Any) -> str:
    """One id part: ``dcp4``, ``page64``, ``tp8``, ``kv-fp8_e4m3``; others verbatim."""
    if axis == "dcp":
        return f"dcp{value}"
    if axis == "page_size":
        return f"page{value}"
    if axis == "tp":
        return f"tp{value}"
    if axis == "kv_dtype":
        return f"kv-{value}"
    return str(value)


def arch_number(arch: str) -> int | None:
    """``sm100`` → 100, ``sm90a`` → 90; None for non-NVIDIA archs."""
    m = re.match(r"^sm(\d+)", arch)
    return int(m.group(1)) if m else None


def platform_of(arch: str) -> str | None:
    """The platform of an arch value: ``sm90`` → cuda, ``gfx942`` → rocm, ``cpu_amx`` → cpu; None if unknown."""
    if _SM.match(arch):
        return "cuda"
    if _GFX.match(arch):
        return "rocm"
    return DEVICE_ARCHS.get(arch)


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    backend: str
    dcp: int
    spec: str
    arch: str
    kv_dtype: str | None = None
    page_size: int | None = None
    tp: int | None = None

    # A cell is frozen: what is derived from it is computed once (every cell's record, item
    # and report asks for these many times).
    @functools.cached_property
    def _items(self) -> tuple[tuple[str, Any], ...]:
        return tuple((a, getattr(self, a)) for a in AXES if getattr(self, a) is not None)

    @property
    def coords(self) -> dict[str, Any]:
        """Coordinates of the axes this cell has (optional axes only when set)."""
        return dict(self._items)

    @property
    def parts(self) -> list[str]:
        return list(self._parts)

    @functools.cached_property
    def _parts(self) -> tuple[str, ...]:
        return tuple(format_part(a, v) for a, v in self._items)

    @functools.cached_property
    def id(self) -> str:
        return "/".join(self._parts)

    @functools.cached_property
    def name(self) -> str:
        """The pytest item name."""
        return "-".join(self._parts)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def from_id(cls, text: str) -> "Cell":
        """Parse a canonical id (``model/backend/dcpN/spec/arch[/kv-X][/pageN][/tpN]``)."""
        parts = text.split("/")
        if len(parts) < len(REQUIRED_AXES):
            raise CellIdError(
                f"cell id {text!r} has {len(parts)} parts; expected model/backend/dcpN/spec/arch"
            )
        model, backend, dcp, spec, arch, *extra = parts
        m = re.fullmatch(r"dcp(\d+)", dcp)
        if not m:
            raise CellIdError(f"cell id {text!r}: third part must be dcpN, got {dcp!r}")
        fields: dict[str, Any] = dict(model=model, backend=backend, dcp=int(m.group(1)), spec=spec, arch=arch)
        for part in extra:
            if part.startswith("kv-") and "kv_dtype" not in fields:
                fields["kv_dtype"] = part[3:]
            elif (m := re.fullmatch(r"page(\d+)", part)) and "page_size" not in fields:
                fields["page_size"] = int(m.group(1))
            elif (m := re.fullmatch(r"tp(\d+)", part)) and "tp" not in fields:
                fields["tp"] = int(m.group(1))
            else:
                raise CellIdError(f"cell id {text!r}: cannot parse part {part!r} (expected kv-X, pageN or tpN)")
        return cls(**fields)

    @classmethod
    def from_name(cls, name: str, axes: Mapping[str, Sequence[Any]]) -> "Cell":
        """Parse an item name (dash-joined) against the matrix's axis values."""
        order = [a for a in AXES if a in axes]

        def walk(rest: str, i: int) -> dict[str, Any] | None:
            if i == len(order):
                return {} if rest == "" else None
            axis = order[i]
            # Longest value first, so "eagle-4x3" wins over a shorter prefix value.
            for value in sorted(axes[axis], key=lambda v: -len(format_part(axis, v))):
                part = format_part(axis, value)
                if rest == part and i == len(order) - 1:
                    return {axis: value}
                if rest.startswith(part + "-"):
                    tail = walk(rest[len(part) + 1 :], i + 1)
                    if tail is not None:
                        return {axis: value, **tail}
            return None

        found = walk(name, 0)
        if found is None:
            raise CellIdError(f"item name {name!r} matches no cell of the axes {', '.join(order)}")
        return cls(**found)


def nodeid_name(nodeid: str) -> tuple[str, str]:
    """Split a pytest node id ``path::name`` into (path, name); parametrize brackets kept."""
    path, sep, name = nodeid.rpartition("::")
    if not sep:
        raise CellIdError(f"node id {nodeid!r} has no '::'")
    return path, name


def expand_cells(axes: Mapping[str, Sequence[Any]]) -> Iterable[Cell]:
    """Every cell of the matrix, in axis order (deterministic: same on every xdist worker)."""
    import itertools

    order = [a for a in AXES if a in axes]
    for values in itertools.product(*(axes[a] for a in order)):
        yield Cell(**dict(zip(order, values)))


def expand_ids(axes: Mapping[str, Sequence[Any]]) -> Iterable[str]:
    """The ids of ``expand_cells(axes)``, in the same order, without building the cells."""
    import itertools

    parts = [[format_part(a, v) for v in axes[a]] for a in AXES if a in axes]
    return ("/".join(p) for p in itertools.product(*parts))


ARCH_HINT = ("expected an NVIDIA arch sm" + "/".join(str(n) for n in NVIDIA_SMS)
             + " (optionally with an a or f suffix: sm90a), an AMD target such as gfx90a, gfx942, gfx950,"
             + " or a device: " + ", ".join(DEVICE_ARCHS))


def is_arch(text: str) -> bool:
    sm = _SM.match(text)
    if sm:
        return int(sm.group(1)) in NVIDIA_SMS
    return bool(_GFX.match(text)) or text in DEVICE_ARCHS
