"""The compact encoding of a result file (schema version 2): every repeated value stored once.

A version-2 file keeps a table of values (``values``) and one line per cell.
A *slot* is how a value is written where it is used:

- an integer ``n`` refers to ``values[n]``;
- a string, a float, ``true``, ``false`` or ``null`` is itself;
- an array is an array of slots; an object is an object whose values are slots.

An entry of the table is any JSON value: a string, a number, ``true``,
``false`` or ``null`` is itself; an array or an object has slots for
elements. So any JSON value travels losslessly (integers always through the
table, which keeps them apart from references), and the writer alone decides
what is shared: ``Encoder`` puts every string, integer, ``null``, boolean,
array and object into the table once and refers to it after that.

A cell is ``[shape, slot, slot, ...]``: ``shape`` refers to an array of its
keys, in order. A key is written

- ``"name"``: its value is the next slot;
- ``["name", ["k1", "k2", ...]]``: an object whose values (for ``k1``,
  ``k2``, ...) are the next slots (the coordinates, without their names);
- ``{"derive": "name", "join": "/", "prefix": ""}``: no slot; the value is
  ``prefix`` followed by the cell-id parts of the record's ``coords``
  (``dcp4``, ``page64``, ``tp8``, ``kv-fp8_e4m3``, the others as they are)
  joined by ``join``. The writer derives ``id`` and ``nodeid`` so when they
  are what that gives, and writes them as strings when not.

So a cell of a run is a handful of references: read back by one C-level
lookup per slot, not a Python test per value.

Table entries are defined before the first cell that uses them, in lines
``{"values": [...]}`` between the cells, so the file can be written and read
as the run goes. ``Decoder`` turns the lines back into records; equal values
decode to one shared object, which keeps a million-cell document small in
memory and lets renderers remember what they computed for a value by its
identity. Records from a ``Decoder`` are read-only: copy before changing.
"""

from __future__ import annotations

import json
import operator
import os
from typing import Any, Iterable, Mapping, Sequence

from ..core.cells import format_part
from ..core.limits import MAX_NESTING, nesting_message

__all__ = ["Encoder", "Decoder", "CodecError", "DERIVED_KEYS", "FLAT_KEYS"]

#: Cell keys whose values are derived from the coordinates when they can be: key → (join, prefix
#: of the value itself): ``id`` = ``model/backend/dcp4/...``, ``nodeid`` = ``path::model-backend-dcp4-...``.
DERIVED_KEYS = {"id": "/", "nodeid": "-"}
#: Cell keys whose object values are written flat in the cell line, their keys in the shape.
FLAT_KEYS = frozenset({"coords"})

_c_encoder = getattr(json.encoder, "c_make_encoder", None)


def _reject(value: Any) -> Any:
    raise TypeError(f"not a plain JSON value: {type(value).__name__}")


if _c_encoder is not None:  # CPython's C encoder, built once (JSONEncoder.encode builds one per call)
    _chunks = _c_encoder(None, _reject, json.encoder.c_encode_basestring, None, ":", ",", False, False, False)

    def _dumps(value: Any) -> str:
        """Compact JSON text of a plain value (TypeError for anything else, ValueError for NaN)."""
        return "".join(_chunks(value, 0))
else:  # pragma: no cover - other Pythons
    _dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                              check_circular=False, default=_reject).encode


class CodecError(ValueError):
    """A line that does not follow the encoding (a reference to an undefined value, a bad shape)."""


class Encoder:
    """Turns cell records into lines, growing the table as new values appear.

    ``cell(record)`` returns the cell's line (JSON text) and the record made
    of the table's shared values (``canonical``); ``take_values()`` returns the
    JSON text of the entries defined since its last call, which must be
    written before that cell's line.
    """

    def __init__(self, *, by_identity: bool = False) -> None:
        self.size = 0
        #: ``by_identity``: a container met again as the very same object is found by its ``id``
        #: (records read from files share their values: a merge writes each once, not a walk per
        #: cell). Only for cells nobody changes while the encoder lives (a whole file written at
        #: once), never for a stream that outlives the records it was handed.
        self._by_id: dict[int, tuple[Any, int]] | None = {} if by_identity else None
        self._strings: dict[str, int] = {}
        self._ints: dict[int, int] = {}
        self._containers: dict[str, int] = {}  # an entry's JSON text → its index
        self._keyed: dict[Any, int] = {}  # a container's ``_value_key`` → its index
        self._constants: dict[Any, int] = {}  # None, True, False → its index (no 1 or 0 among the keys)
        self._parts: dict[str, dict[Any, str]] = {}  # axis → value → its cell-id part
        self._part_tables: dict[tuple[str, ...], tuple[dict[Any, str], ...]] = {}  # coords' axes → their tables
        self._shapes: dict[tuple[Any, ...], int] = {}  # (keys, flat keys) → the shape's index
        self._objects: list[Any] = []  # index → the shared value
        self._fresh: list[str] = []

    # -- values --------------------------------------------------------------------
    def _define(self, text: str, value: Any) -> int:
        index = self.size
        self.size += 1
        self._fresh.append(text)
        self._objects.append(value)
        return index

    def slot(self, value: Any) -> Any:
        """The slot of ``value``: a reference for strings, integers and containers, else the value."""
        kind = type(value)
        if kind is str:
            index = self._strings.get(value)
            if index is None:
                value.encode("utf-8")  # a lone surrogate: UnicodeEncodeError (a ValueError) before it is defined
                index = self._strings[value] = self._define(_dumps(value), value)
            return index
        if kind is dict or kind is list:
            by_id = self._by_id
            if by_id is not None:
                seen = by_id.get(id(value))
                if seen is not None and seen[0] is value:
                    return seen[1]
            try:  # a container seen before is found by a key made of its values, without walking it again
                key = _value_key(value)
            except TypeError:
                key = None  # a set, a path, an enum inside: walked, and made plain there
            index = self._keyed.get(key) if key is not None else None
            if index is None:
                if kind is dict:
                    index = self._container({_key(k): self.slot(v) for k, v in value.items()}, dict)
                else:
                    index = self._container([self.slot(v) for v in value], list)
                if key is not None:
                    self._keyed[key] = index
            if by_id is not None and key is not None:
                by_id[id(value)] = (value, index)  # the value is kept: its id stays its own
            return index
        if kind is int:
            index = self._ints.get(value)
            if index is None:
                index = self._ints[value] = self._define(str(value), value)
            return index
        if value is None or kind is bool:  # in the table too: a cell of references reads back at C speed
            index = self._constants.get(value)
            if index is None:
                index = self._constants[value] = self._define(_dumps(value), value)
            return index
        if kind is float:
            if value != value or value in (_INF, -_INF):
                raise ValueError(f"not a JSON number: {value!r}")
            return value
        if kind is tuple:
            return self.slot(list(value))
        return self.slot(_plain(value))

    def _container(self, entry: Any, kind: type) -> int:
        text = _dumps(entry)
        index = self._containers.get(text)
        if index is None:
            value = ({k: self.value(s) for k, s in entry.items()} if kind is dict
                     else [self.value(s) for s in entry])
            index = self._containers[text] = self._define(text, value)
        return index

    def value(self, slot: Any) -> Any:
        """The shared value a slot stands for (literals are themselves)."""
        if type(slot) is int:
            return self._objects[slot]
        return slot

    def take_values(self) -> str | None:
        """``{"values":[...]}`` for the entries defined since the last call (None: none)."""
        if not self._fresh:
            return None
        text = '{"values":[' + ",".join(self._fresh) + "]}"
        self._fresh = []
        return text

    # -- cells ---------------------------------------------------------------------
    def cell(self, record: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(line, canonical)``: the cell's line and the record rebuilt from shared values."""
        slot, objects = self.slot, self._objects
        slots: list[Any] = [None]
        canonical: dict[str, Any] = {}
        layout: list[tuple[Any, ...]] = []  # per key: ("slot",), ("flat", keys) or ("derive", join, prefix)
        parts = self._cell_parts(record.get("coords"))
        for key, value in record.items():
            join = DERIVED_KEYS.get(key)
            if join is not None and parts is not None and type(value) is str:
                derived = join.join(parts)
                if value.endswith(derived):  # what the coordinates give, after a prefix (a path::)
                    layout.append(("derive", join, value[:len(value) - len(derived)]))
                    canonical[key] = value
                    continue
            if key in FLAT_KEYS and type(value) is dict and value and _STR.issuperset(map(type, value)):
                sub = {}
                for k, v in value.items():
                    s = slot(v)
                    slots.append(s)
                    sub[k] = objects[s] if type(s) is int else s
                layout.append(("flat", tuple(value)))
                canonical[key] = sub
            else:
                s = slot(value)
                slots.append(s)
                canonical[key] = objects[s] if type(s) is int else s
                layout.append(("slot",))
        shape_key = (tuple(record), tuple(layout))
        shape = self._shapes.get(shape_key)
        if shape is None:
            shape = self._shapes[shape_key] = self._container([_shape_key(k, how) for k, how in zip(record, layout)],
                                                              list)
        slots[0] = shape
        return _dumps(slots), canonical

    def _cell_parts(self, coords: Any) -> list[str] | None:
        """The cell-id parts of a record's coordinates (None: no coordinates to derive from)."""
        if type(coords) is not dict or not coords:
            return None
        axes = tuple(coords)
        tables = self._part_tables.get(axes)
        if tables is None:
            if not _STR.issuperset(map(type, axes)):
                return None
            tables = self._part_tables[axes] = tuple(self._parts.setdefault(axis, {}) for axis in axes)
        try:
            return list(map(dict.__getitem__, tables, coords.values()))
        except KeyError:
            for axis, value, table in zip(axes, coords.values(), tables):
                if value not in table:
                    table[value] = format_part(axis, value)
            return list(map(dict.__getitem__, tables, coords.values()))
        except TypeError:  # an unhashable coordinate
            return None


def _shape_key(key: Any, how: tuple[Any, ...]) -> Any:
    if how[0] == "flat":
        return [key, list(how[1])]
    if how[0] == "derive":
        return {"derive": key, "join": how[1], "prefix": how[2]}
    return _key(key)


class Decoder:
    """Reads table lines and cell lines (parsed JSON) back into values and records."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        #: levels of arrays and objects in each value (0: a scalar): references nest values without
        #: nesting the text, so the reader counts them here, one C-level pass per entry
        self.depths: list[int] = []
        self._plans: dict[int, _Plan] = {}
        self._parts: dict[str, dict[Any, str]] = {}  # axis → value → its cell-id part

    def add_values(self, entries: Iterable[Any]) -> None:
        values, depths, value = self.values, self.depths, self.value
        for entry in entries:
            kind = type(entry)
            if kind is dict:
                values.append({k: value(s) for k, s in entry.items()})
                slots = entry.values()
            elif kind is list:
                values.append([value(s) for s in entry])
                slots = entry
            elif kind in _ENTRY_SCALARS:
                values.append(entry)
                depths.append(0)
                continue
            else:
                raise CodecError(f"values[{len(values)}]: not a JSON value: {entry!r}")
            if _INT.issuperset(map(type, slots)):  # references only (checked by self.value): one C-level pass
                depth = 1 + max(map(depths.__getitem__, slots), default=0)
            elif _LITERALS.issuperset(map(type, slots)):  # no references (floats): one level
                depth = 1
            else:  # literals and references, or an inline container
                depth = 1 + max(map(self._slot_depth, slots))
            if depth > MAX_NESTING:
                raise CodecError(f"values[{len(depths)}]: {nesting_message()}")
            depths.append(depth)

    def _slot_depth(self, slot: Any) -> int:
        kind = type(slot)
        if kind is int:
            return self.depths[slot] if 0 <= slot < len(self.depths) else 0  # a bad one: said by self.value
        if kind is list or kind is dict:
            return 1 + max(map(self._slot_depth, slot.values() if kind is dict else slot), default=0)
        return 0

    def value(self, slot: Any) -> Any:
        """The value a slot stands for."""
        kind = type(slot)
        if kind is int:
            if slot < 0:
                raise CodecError(f"reference to values[{slot}]: references are never negative")
            try:
                return self.values[slot]
            except IndexError:
                raise CodecError(f"reference to values[{slot}], which is not defined yet "
                                 f"({len(self.values)} values so far)") from None
        if kind is list:
            return [self.value(s) for s in slot]
        if kind is dict:
            return {k: self.value(s) for k, s in slot.items()}
        return slot

    def _plan(self, ref: Any) -> "_Plan":
        plan = self._plans.get(ref) if type(ref) is int else None
        if plan is not None:
            return plan
        shape = self.value(ref)
        if not isinstance(shape, list):
            raise CodecError(f"a cell's first element must refer to its keys (an array), got {shape!r}")
        keys: list[str] = []
        flats: list[tuple[int, tuple[str, ...]]] = []
        derived: list[tuple[str, str, str]] = []
        width = 0
        where: list[tuple[str, int]] = []  # each key of the shape: ("slot", its slot) / ("flat" | "derived", which)
        for key in shape:
            if type(key) is str:
                keys.append(key)
                where.append(("slot", width))
                width += 1
            elif (isinstance(key, list) and len(key) == 2 and type(key[0]) is str and isinstance(key[1], list)
                  and all(type(k) is str for k in key[1])):
                keys.append(key[0])
                where.append(("flat", len(flats)))
                flats.append((width, tuple(key[1])))  # where its values start in the cell
                width += len(key[1])
            elif (isinstance(key, dict) and type(key.get("derive")) is str and type(key.get("join")) is str
                  and type(key.get("prefix", "")) is str):
                where.append(("derived", len(derived)))
                derived.append((key["derive"], key["join"], key.get("prefix", "")))
            else:
                raise CodecError(f"bad key in a cell's shape: {key!r}")
        names = keys + [d[0] for d in derived]
        if len(set(names)) != len(names):
            raise CodecError(f"a cell's shape repeats a key: {names!r}")
        order = tuple(k if type(k) is str else (k[0] if isinstance(k, list) else k["derive"]) for k in shape)
        coords = next(((start, sub, tuple(self._parts.setdefault(axis, {}) for axis in sub))
                       for (start, sub), key in zip(flats, [k[0] for k in shape if isinstance(k, list)])
                       if key == "coords"), None)
        if derived and coords is None:
            raise CodecError("a cell's shape derives a key but has no flat coords to derive it from")
        # Where each key's value is in a resolved line: its shape's slot, a value per slot, then the
        # flat objects and the derived keys, appended in that order (``_Plan.record``).
        at = {"slot": 1, "flat": 1 + width, "derived": 1 + width + len(flats)}
        plan = _Plan(order, width, flats, coords, tuple((join, prefix) for _, join, prefix in derived),
                     [at[kind] + i for kind, i in where])
        if type(ref) is int:
            self._plans[ref] = plan
        return plan

    def cell(self, line: Any) -> dict[str, Any]:
        """The record of a parsed cell line."""
        if type(line) is not list or not line:
            raise CodecError(f"a cell must be a non-empty array, got {str(line)[:60]}")
        plan = self._plans.get(line[0]) if type(line[0]) is int else None
        if plan is None:
            plan = self._plan(line[0])
        if len(line) != plan.width + 1:
            raise CodecError(f"a cell with {len(line) - 1} values for {plan.width} keys")
        if _INT.issuperset(map(type, line)) and min(line) >= 0:
            try:  # the cells a run writes: references only, read at C speed (its shape's too)
                return plan.record(list(map(self.values.__getitem__, line)))
            except IndexError:
                pass  # a reference to a value not defined yet: said below
        # literals, inline containers (other writers), or a bad reference
        if max(map(self._slot_depth, line[1:]), default=0) > MAX_NESTING - 1:  # the record is a level
            raise CodecError(f"a cell {nesting_message()}")
        return plan.record([None] + [self.value(s) for s in line[1:]])


class _Plan:
    """How a shape's cells read: ``record`` makes a record of a cell's resolved line (its shape's
    slot, then one value per slot) by appending the flat objects and the derived keys to it and
    picking the record's values from it in the shape's key order."""

    __slots__ = ("width", "flats", "coords", "derived", "pick", "order")

    def __init__(self, order: tuple[str, ...], width: int, flats: Sequence[tuple[int, tuple[str, ...]]],
                 coords: tuple[int, tuple[str, ...], tuple[dict[Any, str], ...]] | None,
                 derived: tuple[tuple[str, str], ...], positions: Sequence[int]) -> None:
        self.order, self.width, self.derived = order, width, derived
        self.flats = tuple((1 + start, 1 + start + len(sub), sub) for start, sub in flats)
        #: where the flat coordinates start and end in a resolved line, their axes, each axis's value → its part
        self.coords = (1 + coords[0], 1 + coords[0] + len(coords[1]), coords[1], coords[2]) if coords else None
        if len(positions) > 1:
            self.pick = operator.itemgetter(*positions)
        else:  # itemgetter of one position gives the value itself, not a tuple
            self.pick = lambda resolved, at=tuple(positions): tuple(resolved[i] for i in at)

    def record(self, resolved: list[Any]) -> dict[str, Any]:
        for start, end, sub in self.flats:
            resolved.append(dict(zip(sub, resolved[start:end])))
        if self.derived:
            start, end, axes, tables = self.coords  # type: ignore[misc]  # a shape that derives has them
            values = resolved[start:end]
            try:
                parts = list(map(dict.__getitem__, tables, values))
            except KeyError:
                for axis, value, table in zip(axes, values, tables):
                    if value not in table:
                        table[value] = format_part(axis, value)
                parts = list(map(dict.__getitem__, tables, values))
            except TypeError:
                raise CodecError(f"coordinates that cannot make a cell id: {values!r}") from None
            for join, prefix in self.derived:
                resolved.append(prefix + join.join(parts))
        return dict(zip(self.order, self.pick(resolved)))


_INF = float("inf")
_PLAIN = frozenset({str, int, type(None)})
_STR = frozenset({str})
_INT = frozenset({int})
#: Slots that are themselves and no container (an int is a reference).
_LITERALS = frozenset({str, float, bool, type(None)})
#: Table entries that are themselves.
_ENTRY_SCALARS = frozenset({str, int, float, bool, type(None)})


def _value_key(value: Any) -> Any:
    """A hashable key equal for two values exactly when their JSON is equal (type and order kept:
    ``1``, ``1.0`` and ``true`` differ, ``0.0`` and ``-0.0`` differ); ``TypeError`` for what JSON has
    no word for. Cheaper than the JSON text itself (no string is scanned: its hash is kept)."""
    kind = type(value)
    if kind is dict:
        if not _STR.issuperset(map(type, value)):
            raise TypeError("a key that is not a string")
        if _PLAIN.issuperset(map(type, value.values())):  # the common record part: one C call
            return ("d", tuple(value.items()))
        return ("d", tuple((k, _scalar_key(v)) for k, v in value.items()))
    if _PLAIN.issuperset(map(type, value)):
        return ("l", tuple(value))
    return ("l", tuple(map(_scalar_key, value)))


def _scalar_key(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or value is None:
        return value
    if kind is bool:
        return ("b", value)
    if kind is float:
        return ("f", float.__repr__(value))
    if kind is dict or kind is list:
        return _value_key(value)
    if kind is tuple:
        return _value_key(list(value))
    raise TypeError(type(value).__name__)


def _key(key: Any) -> str:
    """An object key as JSON writes it (``1`` → ``"1"``, ``True`` → ``"true"``)."""
    if type(key) is str:
        return key
    if isinstance(key, str):
        return str.__str__(key)
    return _dumps(key)


def _plain(value: Any) -> Any:
    """Values the JSON module would not take but a record may hold (the v1 writer took them too)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, str):  # a str subclass (an enum member): its text, as json.dumps writes it
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not a plain JSON value: {type(value).__name__}")
