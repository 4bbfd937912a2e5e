"""The package's import graph: layers import downward only, and nothing imports in a circle.

Every ``import``/``from ... import`` of ``pytest_mla`` modules counts, at
module level and inside functions (a lazy import is still a dependency).
Layers, lowest first: ``core`` → ``kernels`` → ``engines`` → the plugin
modules (``plugin``, ``collect``, ``runner``, ``controller``, ...),
``report`` → ``cli``. ``report`` may use only ``core``; nothing imports
``plugin.py`` (pytest loads it through the entry point).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_mla"

#: What each layer may import besides itself.
ALLOWED = {
    "core": set(),
    "kernels": {"core"},
    "engines": {"core", "kernels"},
    "report": {"core"},
    "plugin": {"core", "kernels", "engines", "report", "plugin"},
    "cli": {"core", "report"},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "plugin"  # pytest_mla/__init__.py
    if parts[1] in ("core", "kernels", "engines", "report"):
        return parts[1]
    return "cli" if parts[1] == "cli" else "plugin"


def imports_of(path: Path) -> set[str]:
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pytest_mla")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("pytest_mla"):
                continue
            submodules = set()
            for alias in node.names:  # `from . import x` may name a submodule
                candidate = f"{target}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                        (PACKAGE.parent / Path(*candidate.split(".")) / "__init__.py").exists():
                    submodules.add(candidate)
            found |= submodules
            # `from pkg import sub` (only submodules named) depends on `sub`; the package's own
            # names are not used (its __init__ runs anyway, as the parent of any submodule).
            if len(submodules) < len(node.names):
                found.add(target)
    found.discard(me)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_layers_import_downward_only():
    upward = []
    for module, targets in graph().items():
        for target in sorted(targets):
            if target == "pytest_mla":
                continue
            mine, theirs = layer(module), layer(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                upward.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not upward, "\n".join(upward)


def test_nothing_imports_the_plugin_module():
    users = [m for m, targets in graph().items() if "pytest_mla.plugin" in targets]
    assert not users, users


def test_no_import_cycles():
    g = {m: {t for t in ts if t in graph_keys} for graph_keys in [set(graph())] for m, ts in graph().items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


def test_the_graph_sees_lazy_imports():
    """The walker must see function-level and relative imports, or the two tests above prove nothing."""
    g = graph()
    assert "pytest_mla.kernels.harness" in g["pytest_mla.runner"]  # imported inside a method
    assert "pytest_mla.core.cells" in g["pytest_mla.core.matrix"]  # `from .cells import ...`


def test_asserts_in_the_package_are_never_rewritten_by_pytest():
    """pytest rewrites a plugin's modules: an ``assert``'s message would then change with ``-v`` and
    ``$CI`` (pytest prints the full diff on CI), and a report holding it would differ between a
    developer's run and CI's. Every module with an ``assert`` opts out (``PYTEST_DONT_REWRITE``)."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
            if "PYTEST_DONT_REWRITE" not in (ast.get_docstring(tree, clean=False) or ""):
                missing.append(module_name(path))
    assert not missing, f"modules with assert statements and no PYTEST_DONT_REWRITE: {missing}"


#: The packages of real engines' adapters (``engines/<name>/``); ``common`` is their shared code.
ENGINE_PACKAGES = sorted(p.name for p in (PACKAGE / "engines").iterdir()
                         if (p / "__init__.py").exists() and p.name != "common")


def test_every_engine_package_has_the_same_modules():
    """One layout for every engine (``protocol.ENGINE_PACKAGE_MODULES``): a third engine has a template."""
    from pytest_mla.engines.protocol import ENGINE_PACKAGE_MODULES

    assert ENGINE_PACKAGES == ["sglang", "vllm"]  # the walk must see both, or the loop below proves nothing
    expected = set(ENGINE_PACKAGE_MODULES)
    differ = {}
    for name in ENGINE_PACKAGES:
        have = {p.stem for p in (PACKAGE / "engines" / name).glob("*.py")}
        if have != expected:
            differ[name] = {"missing": sorted(expected - have), "extra": sorted(have - expected)}
    assert not differ, differ


def test_engine_packages_do_not_import_each_other():
    """An engine package uses ``engines.common``, ``engines.protocol`` and the layers below, never
    another engine's package: what two engines share lives once, in ``common``."""
    crossing = []
    for module, targets in graph().items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "engines" or parts[2] not in ENGINE_PACKAGES:
            continue
        for target in sorted(targets):
            tparts = target.split(".")
            if len(tparts) >= 3 and tparts[1] == "engines" and tparts[2] in ENGINE_PACKAGES and tparts[2] != parts[2]:
                crossing.append(f"{module} imports {target}")
    assert not crossing, "\n".join(crossing)
