"""Matrix files: TOML data (never code) declaring axes, models, probes and rules.

``load_matrix`` parses, validates and reports every problem at once, each
with file, line and key path (see ``MatrixError``). A file saved with a
UTF-8 byte-order mark reads like one without.

``[probes]`` marks axis values that exist to exercise the engine's input
validation (``dcp = [0]``, ``backend = ["no_such_backend"]``): their cells
run and are judged like any other; the reports keep them out of the
feature tables and list them under "Input validation".

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .cells import ARCH_HINT, AXES, INT_AXES, OPTIONAL_AXES, REQUIRED_AXES, Cell, expand_cells, expand_ids, is_arch
from .errors import MatrixError, Problem
from .limits import MAX_NESTING, InputLimitError, deep_offset, line_column, nesting_message, read_bounded, too_deep
from .models import BUILTIN_MODELS, ModelConfig, ModelConfigError
from .rules import (
    FIELD_VALUES, REASONS_PLACEHOLDER, Expectation, Predicate, Reason, Rule, RuleIndex, decide, field_kind, known_fields,
    placeholders, _COMPARE,
)
from .spec import SpecError, parse_spec
from .text import describe_char, first_invisible, regex_problem
from .toml_lines import LineIndex

TOP_KEYS = ("title", "engine", "axes", "models", "probes", "rule", "kernel")
ENGINE_KEYS = ("name", "version")
RULE_KEYS = ("when", "reject", "reasons", "accept", "skip", "xfail", "links", "engine_version", "name")
REASON_KEYS = ("when", "text")
REJECT_KEYS = ("error", "message", "match")
KERNEL_KEYS = ("dtype", "seed")
KERNEL_DTYPES = ("bf16", "fp16", "fp32")
_ERROR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: A link of ``links``: an absolute http(s) URL with a host, no spaces.
_LINK = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d+)?(/\S*)?$")


@dataclasses.dataclass(frozen=True)
class Matrix:
    path: str
    name: str
    title: str | None
    engine_name: str
    engine_versions: SpecifierSet | None  # None: any version
    axes: Mapping[str, tuple[Any, ...]]
    models: Mapping[str, ModelConfig]
    rules: tuple[Rule, ...]
    kernel_dtype: str = "bf16"
    seed: int = 0
    probes: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)  # axis → probe values
    #: (axis, value) → the line that lists the value (for problems found after loading, e.g. an
    #: arch the engine's release cannot fake).
    value_lines: Mapping[tuple[str, Any], int] = dataclasses.field(default_factory=dict)

    def is_probe(self, cell: Cell) -> bool:
        """Whether a coordinate of ``cell`` is a probe value."""
        return any(getattr(cell, axis) in values for axis, values in self.probes.items())

    def cells(self) -> Iterator[Cell]:
        return expand_cells(self.axes)

    def cell_ids(self) -> Iterator[str]:
        """The ids of ``cells()``, in the same order (cheaper than building the cells)."""
        return iter(expand_ids(self.axes))

    @property
    def size(self) -> int:
        n = 1
        for values in self.axes.values():
            n *= len(values)
        return n

    def model(self, cell: Cell) -> ModelConfig:
        return self.models[cell.model]

    def expectation(self, cell: Cell, engine_version: str | Version | None = None) -> Expectation:
        # Cells that differ only in axes no rule reads have the same expectation: decided once
        # (a tp axis no rule mentions multiplies the cells, not the work).
        key = (self._rule_key(cell), engine_version)
        try:
            return self._expectations[key]
        except KeyError:
            expect = decide(self.rules, cell, self.models[cell.model], _as_version(engine_version), self._index)
            # Equal expectations are one object: thousands of cells share a handful (less to keep,
            # less for the garbage collector to walk through on every full collection).
            expect = self._expectations[key] = self._expectations.setdefault(expect, expect)
            return expect
        except TypeError:  # an unhashable version object
            return decide(self.rules, cell, self.models[cell.model], _as_version(engine_version))

    @functools.cached_property
    def _rule_key(self) -> Callable[[Cell], Any]:
        """A cell's values on the axes some rule reads."""
        read = frozenset().union(*(rule.axes for rule in self.rules))
        axes = [a for a in self.axes if a in read]
        return operator.attrgetter(*axes) if axes else (lambda cell: ())

    @functools.cached_property
    def _index(self) -> RuleIndex:
        return RuleIndex(self.rules, self.axes, self.models)

    @functools.cached_property
    def _expectations(self) -> dict[Any, Expectation]:
        """(rule axes' values, version) → expectation, and each distinct expectation → itself."""
        return {}

    def describes(self, engine_version: str | None) -> bool:
        """Whether the matrix's ``[engine] version`` admits this engine version."""
        v = _as_version(engine_version)
        return self.engine_versions is None or v is None or self.engine_versions.contains(v, prereleases=True)


def _toml_text(value: Any) -> str:
    """How an axis value is written in TOML (to find its line)."""
    return f'"{value}"' if isinstance(value, str) else str(value)


def _as_version(v: str | Version | None) -> Version | None:
    if v is None or isinstance(v, Version):
        return v
    try:
        return Version(v)
    except InvalidVersion:
        return None


def load_matrix(path: str | os.PathLike[str], *, extra_models: Mapping[str, ModelConfig] | None = None,
                display_path: str | None = None, max_cells: int | None = None) -> Matrix:
    """Read and validate a matrix file; raise ``MatrixError`` listing every problem.

    ``max_cells``: a matrix that expands to more cells is an error (checked before
    anything walks its cells)."""
    path = Path(path)
    shown = display_path or os.fspath(path)
    try:
        text = read_bounded(path, shown).decode("utf-8-sig")  # an editor's byte-order mark is not TOML
    except OSError as exc:
        raise MatrixError(shown, [Problem("", f"cannot read matrix file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError as exc:
        raise MatrixError(shown, [Problem("", f"not UTF-8 text: {exc.reason} at byte {exc.start}")]) from None
    except InputLimitError as exc:
        raise MatrixError(shown, [Problem("", str(exc).removeprefix(f"{shown}: "))]) from None
    try:
        data = tomllib.loads(text)
        deep = too_deep(data)
    except RecursionError:  # tomllib recurses once per level of arrays and inline tables
        at = deep_offset(text, toml=True)
        line, col = line_column(text, at) if at is not None else (None, None)
        where = f" (column {col})" if col else ""
        raise MatrixError(shown, [Problem("", f"invalid TOML: {_nesting()}{where}", line)]) from None
    except tomllib.TOMLDecodeError as exc:
        # Python 3.11's TOMLDecodeError has the position only in its text.
        pos = re.search(r"\(at line (\d+), column (\d+)\)$", str(exc))
        line = getattr(exc, "lineno", None) or (int(pos.group(1)) if pos else None)
        col = getattr(exc, "colno", None) or (int(pos.group(2)) if pos else None)
        msg = getattr(exc, "msg", None) or re.sub(r"\s*\(at line \d+, column \d+\)$", "", str(exc))
        where = f" (column {col})" if col else ""
        raise MatrixError(shown, [Problem("", f"invalid TOML: {msg}{where}", line)]) from None
    lines = LineIndex(text)
    if deep is not None:  # dotted keys and [a.b.c] headers nest without brackets
        raise MatrixError(shown, [Problem(_format_path(deep[:6]) + ("…" if len(deep) > 6 else ""),
                                          _nesting(), lines.line(deep))])
    builder = _Builder(shown, lines, extra_models or {}, max_cells)
    return builder.build(data, name=path.stem)


def _nesting() -> str:
    return nesting_message(MAX_NESTING).replace("objects", "tables")


class _Builder:
    def __init__(self, file: str, lines: LineIndex, extra_models: Mapping[str, ModelConfig],
                 max_cells: int | None = None) -> None:
        self.max_cells = max_cells
        self.file = file
        self.lines = lines
        self.extra_models = extra_models
        self.broken_models: set[str] = set()
        self.problems: list[Problem] = []

    def problem(self, path: tuple[Any, ...], message: str) -> None:
        self.problems.append(Problem(_format_path(path), message, self.lines.line(path)))

    # -- the whole file -------------------------------------------------------------
    def build(self, data: dict[str, Any], name: str) -> Matrix:
        self.invisible_characters((), data)
        for key in data:
            if key not in TOP_KEYS:
                self.problem((key,), f"unknown top-level key {key!r} (known: {', '.join(TOP_KEYS)})")
        title = data.get("title")
        if title is not None and not isinstance(title, str):
            self.problem(("title",), f"title must be a string, got {title!r}")
            title = None
        engine_name, engine_versions = self.engine(data.get("engine", {}))
        models = self.models(data.get("models", {}))
        axes = self.axes(data.get("axes"), models)
        if axes is not None and self.max_cells is not None:
            size = math.prod(len(values) for values in axes.values())
            if size > self.max_cells:
                shape = " x ".join(f"{len(v)} {a}" for a, v in axes.items())
                self.problem(("axes",), f"the matrix expands to {size:,} cells ({shape}), above "
                                        f"--mla-max-cells={self.max_cells:,}: narrow the axes, or raise the limit")
                raise MatrixError(self.file, self.problems)
        kernel_dtype, seed = self.kernel(data.get("kernel", {}))
        probes = self.probes(data.get("probes", {}), axes) if axes is not None else {}
        rules = self.rules(data.get("rule", []), axes) if axes is not None else ()
        if axes is not None and not self.problems:
            self.reachability(rules, axes, models)
        if self.problems:
            self.problems.sort(key=lambda p: (p.line or 0))
            raise MatrixError(self.file, self.problems)
        assert axes is not None
        value_lines = {(axis, value): self.lines.value_line(("axes", axis), _toml_text(value))
                       for axis, values in axes.items() for value in values}
        return Matrix(self.file, name, title, engine_name, engine_versions, axes, models, rules, kernel_dtype, seed,
                      probes, {key: line for key, line in value_lines.items() if line is not None})

    def engine(self, table: Any) -> tuple[str, SpecifierSet | None]:
        if not isinstance(table, dict):
            self.problem(("engine",), "[engine] must be a table")
            return "reference", None
        for key in table:
            if key not in ENGINE_KEYS:
                self.problem(("engine", key), f"unknown key {key!r} (known: {', '.join(ENGINE_KEYS)})")
        name = table.get("name", "reference")
        if not isinstance(name, str) or not name:
            self.problem(("engine", "name"), f"engine name must be a non-empty string, got {name!r}")
            name = "reference"
        return name, self.specifier(("engine", "version"), table.get("version", "*"))

    def specifier(self, path: tuple[Any, ...], text: Any) -> SpecifierSet | None:
        if not isinstance(text, str):
            self.problem(path, f"version specifier must be a string, got {text!r}")
            return None
        if text.strip() in ("", "*"):
            return None
        try:
            return SpecifierSet(text)
        except InvalidSpecifier:
            self.problem(path, f"invalid version specifier {text!r} (expected e.g. '>=0.5.23' or '>=0.5,<0.6')")
            return None

    def kernel(self, table: Any) -> tuple[str, int]:
        if not isinstance(table, dict):
            self.problem(("kernel",), "[kernel] must be a table")
            return "bf16", 0
        for key in table:
            if key not in KERNEL_KEYS:
                self.problem(("kernel", key), f"unknown key {key!r} (known: {', '.join(KERNEL_KEYS)})")
        dtype = table.get("dtype", "bf16")
        if dtype not in KERNEL_DTYPES:
            self.problem(("kernel", "dtype"), f"unknown value {dtype!r} (known: {', '.join(KERNEL_DTYPES)})")
        seed = table.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            self.problem(("kernel", "seed"), f"seed must be a non-negative integer, got {seed!r}")
            seed = 0
        return dtype, seed

    def invisible_characters(self, path: tuple[Any, ...], value: Any) -> None:
        """Characters a reader cannot see, in any key or string: a message copied from a web page
        with a no-break space fails against the engine's text although both look the same."""
        if isinstance(value, dict):
            for key, item in value.items():
                self.invisible_text(path + (key,), key, "key")
                self.invisible_characters(path + (key,), item)
        elif isinstance(value, list):
            for i, item in enumerate(value):  # tables of an array by index (rule[3]), values by their list
                self.invisible_characters(path + (i,) if isinstance(item, dict) else path, item)
        elif isinstance(value, str):
            self.invisible_text(path, value, "value")

    def invisible_text(self, path: tuple[Any, ...], text: str, what: str) -> None:
        found = first_invisible(text, allow="\n\t" if what == "value" else "")
        if found is not None:
            index, ch = found
            self.problem(path, f"{what} {text!r} has an invisible character, {describe_char(ch)}, at character "
                               f"{index}: delete it (a copy-paste artefact?), or, if the engine really prints it, "
                               f"match it with a regex escape such as \\u{ord(ch):04x}")

    # -- models -------------------------------------------------------------------
    def models(self, table: Any) -> dict[str, ModelConfig]:
        models = dict(BUILTIN_MODELS)
        for name, model in self.extra_models.items():
            models[name] = model
        if not isinstance(table, dict):
            self.problem(("models",), "[models] must be a table of model tables")
            return models
        for name, entry in table.items():
            if name in models:
                origin = "the built-in catalogue" if name in BUILTIN_MODELS else "a registered model"
                self.problem(("models", name), f"duplicate model name {name!r} (already in {origin})")
                continue
            if not isinstance(entry, dict):
                self.problem(("models", name), f"model {name!r} must be a table")
                continue
            try:
                models[name] = ModelConfig.from_mapping(name, entry)
            except ModelConfigError as exc:
                self.problem(("models", name, *exc.key.split(".")), exc.message)
                self.broken_models.add(name)
        return models

    # -- axes ---------------------------------------------------------------------
    def axes(self, table: Any, models: Mapping[str, ModelConfig]) -> dict[str, tuple[Any, ...]] | None:
        if table is None:
            self.problem((), "missing [axes] table (required axes: " + ", ".join(REQUIRED_AXES) + ")")
            return None
        if not isinstance(table, dict):
            self.problem(("axes",), "[axes] must be a table")
            return None
        axes: dict[str, tuple[Any, ...]] = {}
        for key in table:
            if key not in AXES:
                self.problem(("axes", key), f"unknown axis {key!r} (known: {', '.join(AXES)})")
        for axis in REQUIRED_AXES:
            if axis not in table:
                self.problem(("axes",), f"missing required axis {axis!r}")
        for axis in AXES:
            if axis not in table:
                continue
            values = table[axis]
            if not isinstance(values, list) or not values:
                self.problem(("axes", axis), f"axis {axis!r} must be a non-empty list, got {values!r}")
                continue
            seen: set[Any] = set()
            good = []
            for i, value in enumerate(values):
                bad = self.axis_value_problem(axis, value, models)
                if bad:
                    self.problem(("axes", axis), f"{bad} (item {i})")
                    continue  # a list or a table is no value (and cannot be hashed)
                if value in seen:
                    self.problem(("axes", axis), f"duplicate value {value!r}")
                seen.add(value)
                good.append(value)
            if good:  # the rules are still checked against the values that are fine
                axes[axis] = tuple(good)
        if any(axis not in axes for axis in REQUIRED_AXES):
            return None
        # Order matters: axes are ordered tuples in AXES order, never sets.
        return {a: axes[a] for a in AXES if a in axes}

    def axis_value_problem(self, axis: str, value: Any, models: Mapping[str, ModelConfig]) -> str | None:
        if axis in INT_AXES:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{axis} values must be integers, got {value!r}"
            if value < (0 if axis == "dcp" else 1):
                return f"{axis} value {value} out of range"
            return None
        if not isinstance(value, str) or not value:
            return f"{axis} values must be non-empty strings, got {value!r}"
        if "/" in value or any(c.isspace() for c in value) or value.startswith("-") or value.endswith("-"):
            return f"{axis} value {value!r} cannot be part of a cell id ('/', spaces, leading or trailing '-')"
        if axis == "model" and value in self.broken_models:
            return None  # its [models] entry is already reported
        if axis == "model" and value not in models:
            known = ", ".join(sorted(models))
            return f"unknown model {value!r}: not in the built-in catalogue nor in [models] (known: {known})"
        if axis == "spec":
            try:
                parse_spec(value)
            except SpecError as exc:
                return str(exc)
        if axis == "arch" and not is_arch(value):
            return f"unknown arch {value!r} ({ARCH_HINT})"
        return None

    # -- probes -------------------------------------------------------------------
    def probes(self, table: Any, axes: Mapping[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
        """``[probes]``: axis → values of that axis that probe the engine's input validation."""
        if not isinstance(table, dict):
            self.problem(("probes",), "[probes] must be a table such as { dcp = [0] }")
            return {}
        probes: dict[str, tuple[Any, ...]] = {}
        for axis, values in table.items():
            at = ("probes", axis)
            if axis not in axes:
                known = ", ".join(axes)
                self.problem(at, f"unknown axis {axis!r} (the matrix's axes: {known})")
                continue
            if not isinstance(values, list) or not values:
                self.problem(at, f"probes of {axis!r} must be a non-empty list of its values, got {values!r}")
                continue
            chosen = []
            for value in values:
                if value not in axes[axis] or isinstance(value, bool):
                    known = ", ".join(str(v) for v in axes[axis])
                    self.problem(at, f"{value!r} is not a value of axis {axis!r} (known: {known})")
                elif value in chosen:
                    self.problem(at, f"duplicate probe value {value!r}")
                else:
                    chosen.append(value)
            if chosen and len(chosen) == len(axes[axis]):
                self.problem(at, f"every value of axis {axis!r} is a probe: the reports would have no "
                                 "configuration left to show")
                continue
            if chosen:
                probes[axis] = tuple(v for v in axes[axis] if v in chosen)  # axis order
        return {a: probes[a] for a in AXES if a in probes}

    # -- rules --------------------------------------------------------------------
    def rules(self, items: Any, axes: Mapping[str, tuple[Any, ...]]) -> tuple[Rule, ...]:
        if not isinstance(items, list):
            self.problem(("rule",), "rules must be an array of tables: [[rule]]")
            return ()
        rules = []
        for index, item in enumerate(items):
            rule = self.rule(index, item, axes)
            if rule is not None:
                rules.append(rule)
        return tuple(rules)

    def rule(self, index: int, item: Any, axes: Mapping[str, tuple[Any, ...]]) -> Rule | None:
        at = ("rule", index)
        before = len(self.problems)
        if not isinstance(item, dict):
            self.problem(at, "a rule must be a table")
            return None
        for key in item:
            if key not in RULE_KEYS:
                self.problem(at + (key,), f"unknown key {key!r} in rule (known: {', '.join(RULE_KEYS)})")
        when = self.when(at + ("when",), item.get("when"), axes)
        outcome = None
        error = message = match = skip = None
        given = [k for k in ("reject", "accept", "skip") if k in item]
        if len(given) > 1:
            self.problem(at, f"a rule has one of 'reject', 'accept' or 'skip', not {' and '.join(repr(k) for k in given)}")
        elif "skip" in item:
            outcome = "skip"
            skip = item["skip"]
            if not isinstance(skip, str) or not skip.strip():
                self.problem(at + ("skip",), f"skip must be a reason string (why the cells do not apply), got {skip!r}")
            if "xfail" in item:
                self.problem(at + ("xfail",), "a skipped cell is never run: it cannot be xfail as well")
        elif "reject" in item:
            outcome = "reject"
            error, message, match = self.reject(at + ("reject",), item["reject"], axes,
                                                reasons="reasons" in item)
        elif "accept" in item:
            outcome = "accept"
            if item["accept"] is not True:
                self.problem(at + ("accept",), f"accept must be true, got {item['accept']!r}")
        reasons: tuple[Reason, ...] = ()
        if "reasons" in item:
            reasons = self.reasons(at + ("reasons",), item["reasons"], axes)
            if outcome != "reject" or message is None:
                self.problem(at + ("reasons",), "reasons compose a reject message: the rule needs "
                                                "reject = { error = ..., message = \"...{reasons}...\" }")
        xfail = item.get("xfail")
        if xfail is not None and (not isinstance(xfail, str) or not xfail.strip()):
            self.problem(at + ("xfail",), f"xfail must be a reason string, got {xfail!r}")
        if outcome is None and xfail is None and not given:
            self.problem(at, "a rule needs an outcome: reject = {...}, accept = true, skip = \"reason\", "
                             "or xfail = \"reason\"")
        links = self.links(at + ("links",), item["links"], xfail) if "links" in item else ()
        versions = None
        if "engine_version" in item:
            versions = self.specifier(at + ("engine_version",), item["engine_version"])
        name = item.get("name")
        if name is not None and not isinstance(name, str):
            self.problem(at + ("name",), f"name must be a string, got {name!r}")
        if len(self.problems) > before:
            return None
        return Rule(index, self.lines.line(at), when, outcome, error, message, match, xfail, versions, name, skip,
                    links, reasons)

    def links(self, at: tuple[Any, ...], value: Any, xfail: Any) -> tuple[str, ...]:
        """``links = ["https://...", ...]``: the upstream reports of the rule's known bug (``xfail``)."""
        if xfail is None:
            self.problem(at, "links name the upstream reports of a known bug: give the rule an xfail reason too")
        if not isinstance(value, list) or not value:
            self.problem(at, f"links must be a non-empty list of URLs such as "
                             f"[\"https://github.com/owner/engine/issues/123\"], got {value!r}")
            return ()
        out: list[str] = []
        for i, link in enumerate(value):
            if not isinstance(link, str) or not _LINK.match(link):
                self.problem(at, f"link {i} must be an http(s) URL without spaces, got {link!r}")
            elif link in out:
                self.problem(at, f"duplicate link {link!r}")
            else:
                out.append(link)
        return tuple(out)

    def reasons(self, at: tuple[Any, ...], items: Any, axes: Mapping[str, tuple[Any, ...]]
                ) -> tuple[Reason, ...]:
        if not isinstance(items, list) or not items:
            self.problem(at, "reasons must be a non-empty array of { when = {...}, text = \"...\" }")
            return ()
        out = []
        for i, item in enumerate(items):
            where = at + (i,)
            if not isinstance(item, dict):
                self.problem(where, "a reason must be a table: { when = {...}, text = \"...\" }")
                continue
            for key in item:
                if key not in REASON_KEYS:
                    self.problem(where + (key,), f"unknown key {key!r} in reason (known: {', '.join(REASON_KEYS)})")
            text = item.get("text")
            if not isinstance(text, str) or not text:
                self.problem(where + ("text",), f"text must be the engine's reason, got {text!r}")
                continue
            self.check_placeholders(where + ("text",), text, axes)
            out.append(Reason(self.when(where + ("when",), item.get("when"), axes), text))
        return tuple(out)

    def check_placeholders(self, at: tuple[Any, ...], template: str, axes: Mapping[str, tuple[Any, ...]],
                           allowed: tuple[str, ...] = ()) -> None:
        for name in placeholders(template):
            if name in allowed:
                continue
            if field_kind(name) is None or (name in AXES and name not in axes):
                self.problem(at, f"placeholder {{{name}}} names no axis or field "
                                 f"(known: {', '.join(known_fields(axes))}; write {{{{ for a literal brace)")

    def when(self, at: tuple[Any, ...], table: Any, axes: Mapping[str, tuple[Any, ...]]) -> tuple[Predicate, ...]:
        if table is None:
            self.problem(at[:-1], "a rule needs a 'when' table (use when = {} to match every cell)")
            return ()
        if not isinstance(table, dict):
            self.problem(at, "when must be a table such as { backend = \"triton\", dcp = \">1\" }")
            return ()
        preds = []
        for key, raw in table.items():
            kind = field_kind(key)
            if kind is None or (key in AXES and key not in axes):
                extra = " (that axis is not in [axes])" if key in OPTIONAL_AXES else ""
                self.problem(at + (key,), f"unknown key {key!r}{extra} (known: {', '.join(known_fields(axes))})")
                continue
            pred = self.predicate(at + (key,), key, kind, raw, axes)
            if pred is not None:
                preds.append(pred)
        return tuple(preds)

    def predicate(self, at: tuple[Any, ...], key: str, kind: str, raw: Any,
                  axes: Mapping[str, tuple[Any, ...]]) -> Predicate | None:
        if isinstance(raw, dict):
            if set(raw) != {"not"}:
                self.problem(at, f"a table value must be {{ not = [...] }}, got keys {sorted(raw)}")
                return None
            values = raw["not"] if isinstance(raw["not"], list) else [raw["not"]]
            checked = [self.value(at, key, kind, v, axes) for v in values]
            return None if any(v is _BAD for v in checked) else Predicate(key, "not-in", tuple(checked))
        if isinstance(raw, list):
            if not raw:
                self.problem(at, "an empty list matches nothing")
                return None
            checked = [self.value(at, key, kind, v, axes) for v in raw]
            return None if any(v is _BAD for v in checked) else Predicate(key, "in", tuple(checked))
        if isinstance(raw, str) and (m := _COMPARE.match(raw)):
            if kind != "int":
                self.problem(at, f"comparison {raw!r} needs a numeric field; {key} is {kind}")
                return None
            op, number = m.group(1), int(m.group(2))
            if op in ("==", "!="):
                v = self.value(at, key, kind, number, axes)
                if v is _BAD:
                    return None
                return Predicate(key, "in" if op == "==" else "not-in", (v,))
            return Predicate(key, op, (number,))
        if isinstance(raw, str) and raw.startswith("!"):
            v = self.value(at, key, kind, _coerce(raw[1:], kind), axes)
            return None if v is _BAD else Predicate(key, "not-in", (v,))
        v = self.value(at, key, kind, raw, axes)
        return None if v is _BAD else Predicate(key, "in", (v,))

    def value(self, at: tuple[Any, ...], key: str, kind: str, v: Any,
              axes: Mapping[str, tuple[Any, ...]]) -> Any:
        expected = {"int": int, "bool": bool, "str": str}[kind]
        if isinstance(v, bool) is not (kind == "bool") or not isinstance(v, expected):
            self.problem(at, f"{key} takes {kind} values, got {v!r}")
            return _BAD
        if key in axes and v not in axes[key]:
            known = ", ".join(str(x) for x in axes[key])
            self.problem(at, f"unknown value {v!r} (known: {known})")
            return _BAD
        if key in FIELD_VALUES and v not in FIELD_VALUES[key]:
            self.problem(at, f"unknown value {v!r} (known: {', '.join(FIELD_VALUES[key])})")
            return _BAD
        return v

    def reject(self, at: tuple[Any, ...], table: Any, axes: Mapping[str, tuple[Any, ...]],
               reasons: bool = False) -> tuple[str | None, str | None, str | None]:
        if not isinstance(table, dict):
            self.problem(at, "reject must be a table: { error = \"ValueError\", message = \"...\" }")
            return None, None, None
        for key in table:
            if key not in REJECT_KEYS:
                self.problem(at + (key,), f"unknown key {key!r} (known: {', '.join(REJECT_KEYS)})")
        error = table.get("error")
        if not isinstance(error, str) or not _ERROR_NAME.match(error):
            self.problem(at + ("error",), f"error must name an exception type such as 'ValueError', got {error!r}")
        message, match = table.get("message"), table.get("match")
        if (message is None) == (match is None):
            self.problem(at, "reject needs exactly one of 'message' (exact text) or 'match' (regex)")
        if message is not None:
            if not isinstance(message, str):
                self.problem(at + ("message",), f"message must be a string, got {message!r}")
            else:
                self.check_placeholders(at + ("message",), message, axes,
                                        (REASONS_PLACEHOLDER,) if reasons else ())
                if reasons and REASONS_PLACEHOLDER not in placeholders(message):
                    self.problem(at + ("message",), "a rule with reasons renders them: the message needs {reasons}")
        if match is not None:
            if not isinstance(match, str):
                self.problem(at + ("match",), f"match must be a string, got {match!r}")
            else:
                try:
                    re.compile(match)
                except (re.error, OverflowError, RecursionError) as exc:
                    self.problem(at + ("match",), f"bad regex {match!r}: {exc}")
                else:
                    why = regex_problem(match)
                    if why:
                        self.problem(at + ("match",), why)
        return error, message, match

    # -- rules no cell can reach -------------------------------------------------------
    def reachability(self, rules: tuple[Rule, ...], axes: Mapping[str, tuple[Any, ...]],
                     models: Mapping[str, ModelConfig]) -> None:
        """Report rules that match no cell, or whose every cell an earlier rule decides.

        A rule gated by ``engine_version`` or one that only marks ``xfail`` never
        shadows a later rule: under some engine version, or as a marker, the
        later rule still decides.
        """
        matched: set[int] = set()
        decided: set[int] = set()
        shadow: dict[int, int] = {}
        reasons_wanted = {(r.index, i) for r in rules for i in range(len(r.reasons))}
        reasons_seen: set[tuple[int, int]] = set()
        index = RuleIndex(rules, axes, models)
        for cell in expand_cells(axes):
            model = models[cell.model]
            decider: Rule | None = None
            for rule in index.rules_matching(cell):
                matched.add(rule.index)
                if decider is None:
                    decided.add(rule.index)
                    reasons_seen.update((rule.index, i) for i, r in enumerate(rule.reasons) if r.holds(cell, model))
                    if rule.outcome is not None and rule.engine_version is None:
                        decider = rule
                else:
                    shadow.setdefault(rule.index, decider.index)
            if len(decided) == len(rules) and reasons_seen >= reasons_wanted:
                break
        by_index = {r.index: r for r in rules}
        for rule in rules:
            if rule.index not in matched:
                self.problem(("rule", rule.index, "when"), "rule matches no cell of the matrix")
            elif rule.index not in decided:
                earlier = by_index[shadow[rule.index]]
                self.problem(("rule", rule.index, "when"),
                             f"rule is unreachable: every cell it matches is decided earlier by {earlier.label}")
            else:
                for i, reason in enumerate(rule.reasons):
                    if (rule.index, i) not in reasons_seen:
                        self.problem(("rule", rule.index, "reasons", i, "when"),
                                     f"reason {reason.text!r} holds for no cell this rule decides")


class _Bad:
    pass


_BAD = _Bad()


def _coerce(text: str, kind: str) -> Any:
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            return text
    if kind == "bool":
        return {"true": True, "false": False}.get(text, text)
    return text


def _format_path(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = str(part)
            if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
                key = f'"{key}"'
            out += f".{key}" if out else key
    return out
