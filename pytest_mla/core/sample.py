"""The quick tier's covering sample: the cells whose numeric checks a quick run makes.

A quick run (``--mla-tier=quick``) validates every cell (the engine is asked
about each configuration: cheap) and runs numeric checks (kernel, emulated,
model) only on a sample that still reaches every backend in every feature
column of every model family at least once:

- the **family** of a cell's model: ``dense MLA``, ``sparse MLA`` or ``GQA``;
- its **features**, one per column of the report's backends view: its arch,
  its speculative kind (``spec none``, ``spec chain``, ``spec tree``), DCP
  (``dcp>1``), DCP with speculation, its KV dtype, its page size;
- a **key** is (backend, family, feature). The sample covers every key of
  the cells the matrix expects the engine to accept (a refusal has no
  numbers to check).

The sample is a pure function of the selected cells and their expectations,
so that every xdist worker, every shard and every rerun picks the same
cells: within each (backend, family) the cell covering the most keys not
yet covered wins, ties going to a cell without a known-bug mark, then to
the earlier one in matrix order. Greedy set cover is not the smallest cover
there is, but it is within a log factor of it and explains itself.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .models import ModelConfig
from .rules import Expectation
from .spec import parse_spec

__all__ = ["TIERS", "covering_sample", "family_of", "features_of"]

#: ``full``: every numeric check (nightly, the committed reports); ``quick``: the covering sample.
TIERS = ("full", "quick")


def family_of(model: ModelConfig) -> str:
    """The report's model family: ``dense MLA``, ``sparse MLA`` or ``GQA``."""
    if not model.mla:
        return "GQA"
    return "sparse MLA" if model.sparse else "dense MLA"


def features_of(coords: Mapping[str, Any]) -> tuple[str, ...]:
    """The backends-view columns a cell's numbers speak for (see the module docstring)."""
    spec = parse_spec(str(coords["spec"]))
    kind = "none" if not spec.enabled else ("tree" if spec.is_tree else "chain")
    dcp = isinstance(coords.get("dcp"), int) and coords["dcp"] > 1
    out = [f"arch {coords['arch']}", f"spec {kind}"]
    if dcp:
        out.append("dcp")
        if spec.enabled:
            out.append("dcp+spec")
    if coords.get("kv_dtype") is not None:
        out.append(f"kv {coords['kv_dtype']}")
    if coords.get("page_size") is not None:
        out.append(f"page {coords['page_size']}")
    return tuple(out)


def covering_sample(cells: Iterable[tuple[Any, Expectation]],
                    models: Mapping[str, ModelConfig]) -> tuple[str, ...]:
    """The ids of the sampled cells, in matrix order. ``cells``: (cell, expectation) in matrix order;
    ``models``: the matrix's catalogue (name → ``ModelConfig``)."""
    groups: dict[tuple[str, str], list[tuple[int, str, bool, frozenset[str]]]] = {}
    for index, (cell, expect) in enumerate(cells):
        if expect.kind != "accept":
            continue
        group = (str(cell.backend), family_of(models[cell.model]))
        groups.setdefault(group, []).append((index, cell.id, bool(expect.xfail), frozenset(features_of(cell.coords))))
    chosen: list[tuple[int, str]] = []
    for candidates in groups.values():
        uncovered = set().union(*(features for *_, features in candidates))
        while uncovered:
            index, cell_id, _, features = max(
                candidates, key=lambda c: (len(c[3] & uncovered), not c[2], -c[0]))
            chosen.append((index, cell_id))
            uncovered -= features
    return tuple(cell_id for _, cell_id in sorted(chosen))
