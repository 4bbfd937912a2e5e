"""Rules: a ``when`` predicate over cell coordinates and model fields, and an outcome.

The first matching rule decides a cell, in file order, like an engine's own
check order. The outcome is ``reject``, ``accept``, or ``skip`` (the
configuration does not apply: the engine is not asked, the verdict is
``skip`` with the rule's reason). A rule may carry ``xfail`` (a known bug)
with or without an outcome; an ``xfail``-only rule marks the cell and lets
the next matching rule decide what it must do; a rule with ``xfail`` may name the
related upstream reports (``links``), which follow the xfail into the cell's
expectation. Rules gated by ``engine_version`` apply only to the
engine versions their specifier admits.

A ``reject`` rule may compose its message from ``reasons``: each reason is a
``when`` and an engine text; ``{reasons}`` in the message renders the texts
whose ``when`` holds for the cell, in order, as the engine prints a Python list
(``['block_size not supported', 'DCP not supported']``). Such a rule matches a
cell only when at least one of its reasons holds: an engine that collects
every failing check (vLLM's ``validate_configuration``) refuses only when the
list is not empty.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from typing import Any, Callable, Iterator, Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .cells import AXES, INT_AXES, PLATFORMS, Cell, arch_number, platform_of
from .models import MODEL_FIELDS, ModelConfig
from .spec import parse_spec

#: Derived fields a rule may test besides the axes and ``model.<field>``.
SPEC_FIELDS = ("topk", "steps", "tree", "enabled", "algorithm", "s_q")
DERIVED_FIELDS = tuple(f"spec.{f}" for f in SPEC_FIELDS) + ("arch.sm", "arch.platform")
#: The values a derived string field can take (a rule naming another is an error of the file).
FIELD_VALUES: Mapping[str, tuple[str, ...]] = {"arch.platform": PLATFORMS}

_COMPARE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?\d+)\s*$")
_OPS: Mapping[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq,
    "!=": operator.ne, ">": operator.gt, "<": operator.lt,
}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def field_kind(key: str) -> str | None:
    """'int', 'bool' or 'str' for a key a rule may test; None if unknown."""
    if key in INT_AXES or key in ("spec.topk", "spec.steps", "spec.s_q", "arch.sm"):
        return "int"
    if key in AXES or key in ("spec.algorithm", "arch.platform"):
        return "str"
    if key in ("spec.tree", "spec.enabled"):
        return "bool"
    if key.startswith("model."):
        field = key[len("model."):]
        if field in MODEL_FIELDS:
            return {"mla": "bool", "quantization": "str"}.get(field, "int")
    return None


def known_fields(axes: Mapping[str, Any]) -> list[str]:
    return [a for a in AXES if a in axes] + [f"model.{f}" for f in MODEL_FIELDS] + list(DERIVED_FIELDS)


def field_value(key: str, cell: Cell, model: ModelConfig) -> Any:
    if key.startswith("model."):
        return model.field(key[len("model."):])
    if key.startswith("spec."):
        return _spec_fields(cell.spec)[key]
    if key == "arch.sm":
        return _arch_number(cell.arch)
    if key == "arch.platform":
        return platform_of(cell.arch)
    return getattr(cell, key)


@functools.lru_cache(maxsize=None)
def _spec_fields(text: str) -> dict[str, Any]:
    s = parse_spec(text)
    return {"spec.topk": s.topk, "spec.steps": s.steps, "spec.tree": s.is_tree,
            "spec.enabled": s.enabled, "spec.algorithm": s.algorithm or "none", "spec.s_q": s.s_q}


_arch_number = functools.lru_cache(maxsize=None)(arch_number)


def field_axis(key: str) -> str:
    """The axis a field is read from (``model.mla`` → ``model``, ``spec.tree`` → ``spec``)."""
    return key.split(".", 1)[0]


@dataclasses.dataclass(frozen=True)
class Predicate:
    key: str
    op: str  # "in", "not-in", or a comparison operator
    values: tuple[Any, ...]

    def test(self, value: Any) -> bool:
        if self.op == "in":
            return value in self.values
        if self.op == "not-in":
            return value not in self.values
        if value is None or isinstance(value, bool):
            return False
        return _OPS[self.op](value, self.values[0])

    @functools.cached_property
    def holds(self) -> Callable[[Cell, ModelConfig], bool]:
        """``test(field_value(key, cell, model))`` as one call (every cell of a matrix asks every rule)."""
        key, test = self.key, self.test
        if self.op == "in" and key in AXES:
            values = self.values
            return lambda cell, model: getattr(cell, key) in values
        return lambda cell, model: test(field_value(key, cell, model))

    def describe(self) -> str:
        if self.op == "in":
            vals = self.values[0] if len(self.values) == 1 else list(self.values)
            return f"{self.key} = {vals!r}"
        if self.op == "not-in":
            return f"{self.key} not in {list(self.values)!r}"
        return f"{self.key} {self.op} {self.values[0]}"


#: The placeholder of a rule's message that renders its holding ``reasons``.
REASONS_PLACEHOLDER = "reasons"


@dataclasses.dataclass(frozen=True)
class Reason:
    """One check of an engine that lists every failing check: when it fails, and its text."""

    when: tuple[Predicate, ...]
    text: str  # the engine's text, with {field} placeholders

    def holds(self, cell: Cell, model: ModelConfig) -> bool:
        return all(p.test(field_value(p.key, cell, model)) for p in self.when)


@dataclasses.dataclass(frozen=True)
class Rule:
    index: int
    line: int | None
    when: tuple[Predicate, ...]
    outcome: str | None  # "accept", "reject", "skip", or None (xfail-only)
    error: str | None = None
    message: str | None = None  # exact text, with {field} placeholders
    match: str | None = None  # regex, re.search
    xfail: str | None = None
    engine_version: SpecifierSet | None = None
    name: str | None = None
    skip: str | None = None  # the reason, for outcome "skip"
    links: tuple[str, ...] = ()  # upstream reports of the known bug (``xfail``), as URLs
    reasons: tuple[Reason, ...] = ()  # reject only: the message's {reasons}, in the engine's order

    @property
    def label(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"rule[{self.index}]{where}"

    def applies_to_version(self, version: Version | None) -> bool:
        if self.engine_version is None or version is None:
            return True
        return self.engine_version.contains(version, prereleases=True)

    def matches(self, cell: Cell, model: ModelConfig) -> bool:
        for p in self.when:
            if not p.holds(cell, model):
                return False
        return not self.reasons or any(r.holds(cell, model) for r in self.reasons)

    def holding_reasons(self, cell: Cell, model: ModelConfig) -> list[str]:
        """The texts of the reasons that hold for the cell, rendered, in order."""
        return [render_message(r.text, cell, model) for r in self.reasons if r.holds(cell, model)]

    def render(self, cell: Cell, model: ModelConfig) -> str | None:
        """The exact message this rule expects of the cell (None for a ``match`` rule)."""
        if self.message is None:
            return None
        extra = {REASONS_PLACEHOLDER: str(self.holding_reasons(cell, model))} if self.reasons else None
        return render_message(self.message, cell, model, extra)

    @functools.cached_property
    def axes(self) -> frozenset[str]:
        """The axes this rule reads: in ``when``, its reasons and its messages' placeholders."""
        keys = [p.key for p in self.when] + (placeholders(self.message) if self.message else [])
        for r in self.reasons:
            keys += [p.key for p in r.when] + placeholders(r.text)
        return frozenset(field_axis(k) for k in keys if k != REASONS_PLACEHOLDER)

    def why(self, cell: Cell, model: ModelConfig) -> list[tuple[str, Any, bool]]:
        """Each predicate with the cell's value and whether it held (for ``explain``)."""
        out = []
        for p in self.when:
            value = field_value(p.key, cell, model)
            out.append((p.describe(), value, p.test(value)))
        return out


def render_message(template: str, cell: Cell, model: ModelConfig,
                   extra: Mapping[str, str] | None = None) -> str:
    """Fill ``{backend}``-style placeholders (and ``extra``'s); ``{{``/``}}`` are literal braces."""
    sentinel_open, sentinel_close = "\x00", "\x01"
    text = template.replace("{{", sentinel_open).replace("}}", sentinel_close)

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if extra is not None and name in extra:
            return extra[name]
        return str(field_value(name, cell, model))

    text = _PLACEHOLDER.sub(fill, text)
    return text.replace(sentinel_open, "{").replace(sentinel_close, "}")


def placeholders(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template.replace("{{", "").replace("}}", ""))


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What the matrix says a cell must do."""

    kind: str  # "accept", "reject" or "skip" (not applicable: the engine is not asked)
    error: str | None = None
    message: str | None = None  # rendered exact text
    match: str | None = None  # regex
    xfail: str | None = None
    rule: int | None = None  # index of the deciding rule, None = default accept
    rule_line: int | None = None
    reason: str | None = None  # kind "skip" only: why the cell does not apply
    #: The xfail comes from an xfail-only rule on a cell the matrix accepts: the known bug is
    #: in what runs after acceptance, so only the kernel check can show it.
    xfail_after_accept: bool = False
    #: Upstream reports of the known bug: the ``links`` of the rule whose ``xfail`` this is.
    links: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        # Built by hand, not dataclasses.asdict (a deep copy): every cell's record asks.
        d = {"kind": self.kind, "error": self.error, "message": self.message, "match": self.match,
             "xfail": self.xfail, "rule": self.rule, "rule_line": self.rule_line}
        if self.reason is not None:  # only skip expectations carry a reason
            d["reason"] = self.reason
        if self.xfail_after_accept:
            d["xfail_after_accept"] = True
        if self.links:  # records without links keep their old form
            d["links"] = list(self.links)
        return d

    def describe(self) -> str:
        if self.kind == "accept":
            return "accept"
        if self.kind == "skip":
            return f"skip: {self.reason}"
        if self.message is not None:
            return f"reject with {self.error}: {self.message}"
        return f"reject with {self.error} matching /{self.match}/"


def decide(rules: tuple[Rule, ...], cell: Cell, model: ModelConfig,
           engine_version: Version | None, index: "RuleIndex | None" = None) -> Expectation:
    """The expectation of ``cell``: the first matching rule wins (``index``: the rules' ``RuleIndex``,
    which answers which rules match without asking each)."""
    marker: Rule | None = None  # the first xfail-only rule that matched
    matching = index.rules_matching(cell) if index is not None else (r for r in rules if r.matches(cell, model))
    for rule in matching:
        if not rule.applies_to_version(engine_version):
            continue
        if rule.outcome is None:
            marker = marker or rule
            continue
        known = rule if rule.xfail else marker  # the rule whose xfail (and links) the cell gets
        reason, links = (known.xfail, known.links) if known is not None else (None, ())
        if rule.outcome == "skip":
            return Expectation("skip", rule=rule.index, rule_line=rule.line, reason=rule.skip)
        if rule.outcome == "accept":
            return Expectation("accept", xfail=reason, rule=rule.index, rule_line=rule.line,
                               xfail_after_accept=rule.xfail is None and marker is not None, links=links)
        message = rule.render(cell, model)
        return Expectation("reject", rule.error, message, rule.match, reason, rule.index, rule.line, links=links)
    if marker is None:
        return Expectation("accept")
    return Expectation("accept", xfail=marker.xfail, xfail_after_accept=True, links=marker.links)


class RuleIndex:
    """Which rules match a cell, answered from per-value bitmasks instead of rule by rule.

    Every predicate reads one axis (``model.mla`` the model, ``spec.tree`` the
    spec, ``arch.sm`` the arch), so whether a rule's predicates on one axis hold
    depends on that axis's value alone. The index evaluates them once per
    (axis, value) into a bitmask over the rules (bit ``i``: ``rules[i]``); a
    cell's matching rules are the AND of its values' masks, then the rules with
    ``reasons`` keep only those with a holding reason (the same AND over
    reason bits). A 35,000-cell matrix with 200 rules asks 7 million predicate
    calls rule by rule; here, a few integer operations per cell.

    ``rules_matching(cell)`` equals ``[r for r in rules if r.matches(cell, model)]``.
    """

    def __init__(self, rules: tuple[Rule, ...], axes: Mapping[str, tuple[Any, ...]],
                 models: Mapping[str, ModelConfig]) -> None:
        import types

        self.rules = rules
        self.axes = tuple(axes)
        self._values = operator.attrgetter(*self.axes) if len(self.axes) > 1 else (lambda cell: (getattr(cell, self.axes[0]),))
        reasons = [(i, r) for i, rule in enumerate(rules) for r in rule.reasons]
        self._reason_bits = [0] * len(rules)  # rules[i]'s reasons, as bits of the reason masks
        for bit, (i, _) in enumerate(reasons):
            self._reason_bits[i] |= 1 << bit
        self._without_reasons = sum(1 << i for i, rule in enumerate(rules) if not rule.reasons)
        read = {field_axis(p.key) for rule in rules for p in rule.when}
        read |= {field_axis(p.key) for _, r in reasons for p in r.when}
        unknown = read - set(self.axes)
        if unknown:
            raise ValueError(f"rules read axes the matrix lacks: {sorted(unknown)}")

        def admitted(predicate_sets: list[tuple[Predicate, ...]], axis: str, value: Any) -> int:
            probe = types.SimpleNamespace(**{axis: value})
            model = models.get(value) if axis == "model" else None
            bits = 0
            for i, when in enumerate(predicate_sets):
                if all(p.test(field_value(p.key, probe, model)) for p in when if field_axis(p.key) == axis):
                    bits |= 1 << i
            return bits

        whens = [rule.when for rule in rules]
        reason_whens = [r.when for _, r in reasons]
        self._when = [{v: admitted(whens, a, v) for v in axes[a]} for a in self.axes]
        self._reason = [{v: admitted(reason_whens, a, v) for v in axes[a]} for a in self.axes] if reasons else []
        self._all = (1 << len(rules)) - 1
        self._all_reasons = (1 << len(reasons)) - 1

    def mask(self, cell: Cell) -> int:
        """The matching rules of ``cell`` as a bitmask (bit ``i``: ``rules[i]``)."""
        values = self._values(cell)
        bits = self._all
        for masks, value in zip(self._when, values):
            bits &= masks[value]
        pending = bits & ~self._without_reasons  # rules that also need a holding reason
        if pending:
            held = self._all_reasons
            for masks, value in zip(self._reason, values):
                held &= masks[value]
            while pending:
                low = pending & -pending
                if not held & self._reason_bits[low.bit_length() - 1]:
                    bits ^= low
                pending ^= low
        return bits

    def rules_matching(self, cell: Cell) -> Iterator[Rule]:
        """The rules matching ``cell``, in file order."""
        bits = self.mask(cell)
        rules = self.rules
        while bits:
            low = bits & -bits
            yield rules[low.bit_length() - 1]
            bits ^= low
