"""The ``--mla-*`` options: their declaration, and ``parse_*`` functions that turn text into values.

Every ``parse_*`` raises ``pytest.UsageError`` naming the option. ``read_settings``
reads them all once into a frozen ``Settings``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

import pytest

from .core.cells import ARCH_HINT, AXES, INT_AXES, is_arch
from .core.deadline import MAX_TIMEOUT, positive_seconds
from .core.kernelspec import DCP_MODES
from .core.sample import TIERS
from .core.text import describe_char, first_invisible, invisible

KERNEL_MODES = ("auto", "off")
MATRIX_OPTION = "--mla-matrix"
DEFAULT_MATRIX_GLOB = "matrix/*.toml"


#: A cell that takes longer has hung: a real engine's start-up steps take well under a
#: second here, the largest kernel check under the Triton interpreter about 10 s.
DEFAULT_CELL_TIMEOUT = 600.0
#: Above this a matrix is almost surely a mistake (an axis pasted twice): 200,000 cells
#: collect in about 20 s and 500 MB.
DEFAULT_MAX_CELLS = 200_000


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the ``--mla-*`` options decide, parsed once."""

    matrix_paths: tuple[str, ...]  # explicit paths from --mla-matrix=... (each use), empty: use mla_matrix_files
    #: ``--mla-matrix WORD`` written without '=': the words the option took as its value.
    swallowed: tuple[str, ...] = ()
    select: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    report_dir: str | None = "reports"
    formats: tuple[str, ...] = ("json", "md", "html")
    kernel: str = "auto"
    dcp_mode: str = "in-process"
    seed: int | None = None
    shard: tuple[int, int] | None = None  # (index from 1, count)
    arch: str = "auto"
    baseline: str | None = None
    dcp_timeout: float = 120.0
    report_name: str = "{matrix}"
    #: ``--mla-assume-version``: (engine name or None for every engine, version) pairs.
    assume_versions: tuple[tuple[str | None, str], ...] = ()
    strict_coverage: bool = False
    cell_timeout: float | None = DEFAULT_CELL_TIMEOUT  # None: unbounded
    max_cells: int = DEFAULT_MAX_CELLS
    tier: str = "full"  # quick: numeric checks on a covering sample only (core/sample.py)

    def assumed_version(self, engine: str) -> str | None:
        """The version whose rules apply to ``engine``'s matrices instead of the installed one's."""
        named = [v for name, v in self.assume_versions if name == engine]
        anyone = [v for name, v in self.assume_versions if name is None]
        return (named or anyone or [None])[-1]


def add_options(parser: pytest.Parser) -> None:
    """Every ``--mla-*`` option in one group, with its ``mla_*`` ini twin."""
    group = parser.getgroup("mla", "pytest-mla: MLA attention-backend compatibility matrix")
    group.addoption(
        MATRIX_OPTION, nargs="?", const="", default=None, action="append", metavar="PATHS",
        help="run compatibility matrices: the TOML files or folders given (--mla-matrix=PATH, repeatable, "
             f"or comma-separated), or those of the mla_matrix_files ini setting (default {DEFAULT_MATRIX_GLOB}). "
             "Write the paths with '=': a bare --mla-matrix takes the next word as its value. Off by default.",
    )
    group.addoption("--mla-select", action="append", default=[], metavar="AXIS=V1,V2",
                    help="run only cells whose AXIS is one of the values (repeatable; combine with -k). Cells "
                         "outside the selection are not collected (no 'deselected' count for them).")
    group.addoption("--mla-shard", default=None, metavar="I/N",
                    help="run the I-th of N deterministic shards of the cells (for parallel CI jobs).")
    group.addoption("--mla-arch", default=None, metavar="ARCH",
                    help="'auto' (default): validate every arch, run kernels for the host's arch; "
                         "or one arch such as sm90 to run (and collect) only its cells.")
    group.addoption("--mla-kernel", default=None, choices=KERNEL_MODES,
                    help="'auto' (default): check the decode kernel of accepted cells; 'off': validation only.")
    group.addoption("--mla-tier", default=None, choices=TIERS,
                    help="'full' (default): every accepted cell's numeric check, as nightly runs make the "
                         "committed reports; 'quick': validate every cell, check numbers on a covering sample "
                         "(each backend x feature column x model family at least once), named in the report "
                         "(ini: mla_tier).")
    group.addoption("--mla-dcp-mode", default=None, choices=DCP_MODES,
                    help="how DCP ranks run in kernel checks: 'in-process' (default) or 'distributed' "
                         "(one torch.distributed process per rank).")
    group.addoption("--mla-dcp-timeout", default=None, metavar="SECONDS",
                    help="bound on a distributed DCP kernel check before its ranks are killed (default 120).")
    group.addoption("--mla-seed", default=None, metavar="N",
                    help="seed of the kernel checks' random inputs (default: the matrix's [kernel] seed, 0).")
    group.addoption("--mla-report-dir", default=None, metavar="DIR",
                    help="where result files go (default 'reports' under the rootdir); 'none' writes nothing.")
    group.addoption("--mla-report-name", default=None, metavar="TEMPLATE",
                    help="file stem of the result files, with {matrix}, {engine}, {version} "
                         "(default '{matrix}': reports/<matrix>.json).")
    group.addoption("--mla-report-format", default=None, metavar="FORMATS",
                    help="comma-separated formats besides JSON: md, html (default json,md,html).")
    group.addoption("--mla-assume-version", action="append", default=[], metavar="[ENGINE=]VERSION",
                    help="evaluate the matrices' rules as if VERSION of the engine were installed (the installed "
                         "engine still answers; failing cells are what changed since VERSION). Repeatable; "
                         "ENGINE= limits it to one engine. Without it, a matrix whose [engine] version excludes "
                         "the installed version stops the session at collection.")
    group.addoption("--mla-strict-coverage", action="store_true", default=None,
                    help="fail the session when the engine registers MLA-capable backends that a matrix "
                         "does not list (ini: mla_strict_coverage).")
    group.addoption("--mla-cell-timeout", default=None, metavar="SECONDS",
                    help=f"end a cell that runs longer (engine configure or kernel check) as verdict error; "
                         f"0: no limit (default {DEFAULT_CELL_TIMEOUT:g}; ini: mla_cell_timeout).")
    group.addoption("--mla-max-cells", default=None, metavar="N",
                    help=f"stop at collection when a matrix expands to more than N cells "
                         f"(default {DEFAULT_MAX_CELLS}; ini: mla_max_cells).")
    group.addoption("--mla-baseline", default=None, metavar="OLD.json",
                    help="compare with an earlier result file and fail the session on regressions.")
    parser.addini("mla_matrix_files", type="linelist", default=[DEFAULT_MATRIX_GLOB],
                  help="glob patterns (relative to the rootdir) of matrix files run by --mla-matrix")
    parser.addini("mla_report_dir", default="reports", help="default of --mla-report-dir")
    parser.addini("mla_report_name", default="{matrix}", help="default of --mla-report-name")
    parser.addini("mla_report_format", default="json,md,html", help="default of --mla-report-format")
    parser.addini("mla_kernel", default="auto", help="default of --mla-kernel")
    parser.addini("mla_tier", default="full", help="default of --mla-tier")
    parser.addini("mla_dcp_mode", default="in-process", help="default of --mla-dcp-mode")
    parser.addini("mla_arch", default="auto", help="default of --mla-arch")
    parser.addini("mla_cell_timeout", default=str(DEFAULT_CELL_TIMEOUT), help="default of --mla-cell-timeout")
    parser.addini("mla_max_cells", default=str(DEFAULT_MAX_CELLS), help="default of --mla-max-cells")
    parser.addini("mla_strict_coverage", type="bool", default=False, help="default of --mla-strict-coverage")


def _opt(config: pytest.Config, name: str, ini: str | None = None) -> Any:
    return _sourced(config, name, ini)[0]


def _sourced(config: pytest.Config, name: str, ini: str | None = None) -> tuple[Any, str]:
    """(value, where it came from): the option, else its ini twin (named ``mla_x (ini)`` in errors)."""
    value = config.getoption(name)
    if value is None and ini is not None:
        return config.getini(ini), f"{ini} (ini)"
    return value, name


def _given(text: str | None, option: str, expected: str) -> str | None:
    """An option's text, None when it was not given; an empty value (``--opt=``, most often an unset
    CI variable) is an error, never a silent default."""
    if text is None:
        return None
    if not str(text).strip():
        raise pytest.UsageError(f"{option}: empty value (an unset variable?): expected {expected}")
    return text


def read_settings(config: pytest.Config) -> Settings:
    values = config.getoption(MATRIX_OPTION) or []
    timeout = _given(config.getoption("--mla-dcp-timeout"), "--mla-dcp-timeout", "seconds such as 120")
    return Settings(
        matrix_paths=tuple(p.strip() for text in values for p in text.split(",") if p.strip()),
        swallowed=swallowed_words(config.invocation_params.args),
        select=parse_select(config.getoption("--mla-select")),
        report_dir=parse_report_dir(*_sourced(config, "--mla-report-dir", "mla_report_dir")),
        formats=parse_formats(*_sourced(config, "--mla-report-format", "mla_report_format")),
        kernel=parse_choice(*_sourced(config, "--mla-kernel", "mla_kernel"), choices=KERNEL_MODES),
        dcp_mode=parse_choice(*_sourced(config, "--mla-dcp-mode", "mla_dcp_mode"), choices=DCP_MODES),
        seed=parse_seed(_given(config.getoption("--mla-seed"), "--mla-seed", "a non-negative integer")),
        shard=parse_shard(_given(config.getoption("--mla-shard"), "--mla-shard", "I/N such as 2/3")),
        arch=parse_arch(*_sourced(config, "--mla-arch", "mla_arch")),
        baseline=_given(config.getoption("--mla-baseline"), "--mla-baseline", "an earlier result file OLD.json"),
        assume_versions=tuple(parse_assume_version(v) for v in config.getoption("--mla-assume-version")),
        strict_coverage=bool(_opt(config, "--mla-strict-coverage", "mla_strict_coverage")),
        dcp_timeout=parse_timeout(timeout, "--mla-dcp-timeout") if timeout is not None else 120.0,
        report_name=parse_report_name(*_sourced(config, "--mla-report-name", "mla_report_name")),
        cell_timeout=parse_cell_timeout(*_sourced(config, "--mla-cell-timeout", "mla_cell_timeout")),
        max_cells=parse_max_cells(*_sourced(config, "--mla-max-cells", "mla_max_cells")),
        tier=parse_choice(*_sourced(config, "--mla-tier", "mla_tier"), choices=TIERS),
    )


def parse_report_dir(text: str, option: str = "--mla-report-dir") -> str | None:
    """A folder, or None for ``none``. Empty is an error: an unset CI variable must not silently
    turn the report off (a nightly would go green with no table)."""
    if text.strip() == "none":
        return None
    _given(text, option, "a folder, or 'none' to write no report")
    found = first_invisible(text)
    if found is not None:
        raise pytest.UsageError(f"{option}: {text!r} has an invisible character, {describe_char(found[1])}, "
                                f"at character {found[0]}: a folder name must show what it is")
    return text


def selection(settings: Settings) -> list[tuple[str, tuple[Any, ...]]]:
    """``--mla-select``'s ``(axis, values)`` pairs, and ``("arch", (ARCH,))`` for ``--mla-arch ARCH``."""
    wanted = list(settings.select)
    if settings.arch != "auto":
        wanted.append(("arch", (settings.arch,)))
    return wanted


def selected_axes(axes: Mapping[str, Sequence[Any]], settings: Settings) -> dict[str, Sequence[Any]]:
    """The matrix's axes cut to the values ``--mla-select`` and ``--mla-arch`` keep: their product is
    the selected cells, in matrix order. Cells outside are never built (a slice of a 40,000-cell
    matrix collects in a fraction of a second, not seconds in every xdist worker); ``select_items``
    still applies the whole selection, axes the matrix lacks (a field's default) included."""
    cut = dict(axes)
    for axis, values in selection(settings):
        if axis in cut:
            cut[axis] = [v for v in cut[axis] if v in values]
    return cut


def swallowed_words(args: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The words a bare ``--mla-matrix`` took as its value (``--mla-matrix tests`` takes ``tests``)."""
    args = list(args)
    return tuple(nxt for arg, nxt in zip(args, args[1:]) if arg == MATRIX_OPTION and not nxt.startswith("-"))


def parse_select(values: list[str], option: str = "--mla-select") -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """``AXIS=V1,V2`` (repeatable) → ((axis, (v1, v2)), ...); ints for dcp/page_size/tp."""
    out = []
    for text in values:
        axis, sep, rest = text.partition("=")
        axis = axis.strip()
        if not sep or not rest.strip():
            raise pytest.UsageError(f"{option}: expected AXIS=V1,V2 such as backend=triton,fa3, got {text!r}")
        if axis not in AXES:
            raise pytest.UsageError(f"{option}: unknown axis {axis!r} in {text!r} (known: {', '.join(AXES)})")
        vals: list[Any] = []
        for v in (p.strip() for p in rest.split(",")):
            if axis in INT_AXES:
                try:
                    vals.append(int(v))
                except ValueError:
                    raise pytest.UsageError(f"{option}: axis {axis} takes integers, got {v!r} in {text!r}") from None
            else:
                vals.append(v)
        out.append((axis, tuple(vals)))
    return tuple(out)


def parse_assume_version(text: str, option: str = "--mla-assume-version") -> tuple[str | None, str]:
    """``0.5.23`` or ``sglang=0.5.23`` → (engine or None, version); the version must parse (PEP 440)."""
    from packaging.version import InvalidVersion, Version

    engine, sep, version = text.rpartition("=")
    engine, version = engine.strip(), version.strip()
    try:
        Version(version)
    except InvalidVersion:
        raise pytest.UsageError(f"{option}: expected [ENGINE=]VERSION such as 0.5.23 or sglang=0.5.23, "
                                f"got {text!r}") from None
    return (engine or None) if sep else None, version


def parse_shard(text: str | None, option: str = "--mla-shard") -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise pytest.UsageError(f"{option}: expected I/N with 1 <= I <= N, such as 2/3, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_choice(text: str, option: str, *, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise pytest.UsageError(f"{option}: expected one of {', '.join(choices)}, got {text!r}")
    return text


def parse_arch(text: str, option: str = "--mla-arch") -> str:
    if text != "auto" and not is_arch(text):
        raise pytest.UsageError(f"{option}: unknown arch {text!r}: 'auto', or {ARCH_HINT.removeprefix('expected ')}")
    return text


def parse_seed(text: str | None, option: str = "--mla-seed") -> int | None:
    if text is None:
        return None
    try:
        seed = int(str(text))
    except ValueError:
        raise pytest.UsageError(f"{option}: expected a non-negative integer, got {text!r}") from None
    if seed < 0:
        raise pytest.UsageError(f"{option}: expected a non-negative integer, got {text!r}")
    return seed


def parse_formats(text: str, option: str = "--mla-report-format") -> tuple[str, ...]:
    known = ("json", "md", "html")
    _given(text, option, f"comma-separated formats ({', '.join(known)})")
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    for item in items:
        if item not in known:
            raise pytest.UsageError(f"{option}: unknown format {item!r} (known: {', '.join(known)})")
    if "json" not in items:
        items = ("json",) + items  # the JSON file is the primary artifact
    return items



def parse_timeout(text: str, option: str) -> float:
    try:
        return positive_seconds(text)
    except ValueError as exc:
        raise pytest.UsageError(f"{option}: {exc}") from None


def parse_cell_timeout(text: str, option: str = "--mla-cell-timeout") -> float | None:
    """Seconds, or None for ``0`` (no limit)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{option}: expected seconds (0: no limit), got {text!r}") from None
    if not 0 <= value <= MAX_TIMEOUT:  # NaN and inf fail this too: SIGALRM's timer takes neither
        raise pytest.UsageError(f"{option}: expected seconds (0: no limit), got {text!r}"
                                + (f" (at most {MAX_TIMEOUT:.0f}; 0 means no limit)" if value > MAX_TIMEOUT else ""))
    return value or None


def parse_max_cells(text: str, option: str = "--mla-max-cells") -> int:
    try:
        value = int(str(text).replace("_", "").replace(",", ""))
    except ValueError:
        raise pytest.UsageError(f"{option}: expected a positive number of cells, got {text!r}") from None
    if value <= 0:
        raise pytest.UsageError(f"{option}: expected a positive number of cells, got {text!r}")
    return value


REPORT_NAME_FIELDS = ("matrix", "engine", "version")


def parse_report_name(text: str, option: str = "--mla-report-name") -> str:
    """A file-stem template with {matrix}, {engine} and {version} placeholders."""
    import string

    _given(text, option, "a file name stem such as '{engine}-{version}'")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise pytest.UsageError(f"{option}: bad template {text!r}: {exc}") from None
    for field in fields:
        if field not in REPORT_NAME_FIELDS:
            raise pytest.UsageError(
                f"{option}: unknown placeholder {{{field}}} in {text!r} (known: {', '.join(REPORT_NAME_FIELDS)})"
            )
    try:  # a format spec or conversion ({matrix:d}, {engine!x}) fails here, not after the first cell
        sample = text.format(**{field: field for field in REPORT_NAME_FIELDS})
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
        raise pytest.UsageError(f"{option}: bad template {text!r}: {exc}") from None
    if (not text.strip() or "/" in text or "\\" in text or text.strip(".") == ""
            or not sample.strip() or "/" in sample or "\\" in sample or sample.strip(".") == ""):
        raise pytest.UsageError(f"{option}: expected a file name stem such as '{{engine}}-{{version}}', got {text!r}")
    found = first_invisible(text)
    if found is not None:
        raise pytest.UsageError(f"{option}: {text!r} has an invisible character, {describe_char(found[1])}, "
                                f"at character {found[0]}: a file name must show what it is")
    if len(text.encode("utf-8")) > MAX_STEM_BYTES:
        raise pytest.UsageError(f"{option}: {len(text.encode('utf-8'))} bytes is too long for a file name stem "
                                f"(at most {MAX_STEM_BYTES}), got {text[:40]!r}...")
    return text


#: File systems take 255 bytes per name; the stem leaves room for an extension and a temporary suffix.
MAX_STEM_BYTES = 150


def safe_stem_part(value: object, limit: int = 60) -> str:
    """A value an engine supplies (its name, its version) as part of a file name: no folder
    separators, no characters a reader cannot see, not hidden, not too long."""
    text = "".join("_" if ch in "/\\:*?\"<>|" or invisible(ch, allow="") or ch == " " else ch
                   for ch in str(value)).strip("._-") or "unknown"
    return text[:limit]
