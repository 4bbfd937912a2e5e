"""The ``pytest-mla`` command: render, merge, diff, check, explain, suggest, repro, and init.

Exit codes: 0 fine; 1 the answer is "no" (conflicts, a regression, a stale
document); 2 the input is unusable (unreadable, not a result file, another
schema version, a broken matrix, a bad option), with one line on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import html
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from .core.limits import MAX_INPUT_BYTES_ENV, InputLimitError, read_bounded
from .report.output import OutputError, check_distinct, check_output
from .report.results import ResultFileError, parse_results, read_results, results_text, write_results, write_text_atomic
from .report.results import decode_text

PROG = "pytest-mla"
FORMATS = ("md", "html", "json", "terminal")
VIEWS = ("all", "backends", "grid", "docs")
#: Output suffixes ``render -o`` knows (anything else needs --format).
SUFFIXES = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json", ".txt": "terminal"}


class CliError(Exception):
    """An unusable input or option: one line on stderr, exit 2."""


def _axes(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [a.strip() for a in text.split(",") if a.strip()] or None


def _read(path: str) -> dict[str, Any]:
    """A result document from a file, or from standard input for ``-`` (UTF-8 whatever the locale)."""
    try:
        if path == "-":
            data = read_bounded(getattr(sys.stdin, "buffer", sys.stdin), "<stdin>")
            document = parse_results(data if isinstance(data, str) else decode_text(data, "<stdin>"), "<stdin>")
        else:
            document = read_results(path)
    except (ResultFileError, InputLimitError) as exc:
        raise CliError(str(exc)) from None
    for warning in document.get("warnings") or ():  # a file cut short: what was read, what was lost
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    return document


def _write(text: str, out: str | None, inputs: Sequence[str | None] = (), option: str = "-o",
           mode: int = 0o666) -> None:
    if out is None or out == "-":
        sys.stdout.write(text)
        return
    try:
        write_text_atomic(out, text, inputs=[i for i in inputs if i], mode=mode)
    except OSError as exc:
        raise cannot_write(out, exc, option) from None


def check_outputs(outputs: Sequence[tuple[str, str | None]], inputs: Sequence[str | None]) -> None:
    """Before the work: each output (``(option, path)``) must be absent or a regular file, none of the
    command's ``inputs``, and no other output (``report.output``); ``CliError`` in one line."""
    given = [(option, out) for option, out in outputs if out is not None and out != "-"]
    try:
        for _, out in given:
            check_output(out, [i for i in inputs if i])
        check_distinct([out for _, out in given])
    except OutputError as exc:
        raise refused(exc, next(option for option, out in reversed(given) if out == exc.path)) from None


def refused(exc: OutputError, option: str) -> CliError:
    """``-o /dev/full: not a regular file (a character device); ...``, with a hint for standard output."""
    hint = ""
    if exc.path.startswith(("/dev/", "/proc/")):
        hint = " (for standard output, leave the option out or give -)"
    return CliError(f"{option} {exc}{hint}")


def cannot_write(out: str | os.PathLike[str], exc: OSError, option: str = "-o") -> CliError:
    """One line for an output path that cannot be written, naming the part of it in the way."""
    if isinstance(exc, OutputError):
        return refused(exc, option)
    path = Path(out)
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return CliError(f"{out}: cannot write: {blocker} is a file, not a folder")
    if path.is_dir():
        return CliError(f"{out}: cannot write: it is a folder")
    return CliError(f"{out}: cannot write: {exc.strerror or exc}")


def output_format(fmt: str | None, out: str | None) -> str:
    """The format ``render`` writes: ``--format``, else the ``-o`` suffix, else Markdown on stdout."""
    suffix = Path(out).suffix.lower() if out and out != "-" else ""
    known = SUFFIXES.get(suffix)
    if fmt is None:
        if not out or out == "-":
            return "md"
        if known is None:
            what = f"its extension {suffix!r}" if suffix else "a file name without an extension"
            raise CliError(f"-o {out}: cannot tell the format from {what} "
                           f"(known: {', '.join(SUFFIXES)}); pass --format {{{','.join(FORMATS)}}}")
        return known
    if known is not None and known != fmt and not (fmt == "terminal" and suffix == ".txt"):
        raise CliError(f"-o {out}: a {suffix} file, but --format {fmt}; drop one of them or make them agree")
    return fmt


def render(document: dict[str, Any], fmt: str, rows: list[str] | None, cols: list[str] | None,
           view: str | None = None, model: Any = None, evidence: str | None = None) -> str:
    """``document`` rendered as ``fmt`` (``model``: its ``ReportModel``, shared between renderings;
    ``evidence``: the HTML report the docs view links to)."""
    if view == "docs" and fmt != "md":
        raise CliError(f"--view docs is a Markdown page (the docs page engines paste); not --format {fmt}")
    if evidence is not None and view != "docs":
        raise CliError("--evidence names the HTML report the docs page links to; it needs --view docs")
    if fmt == "json":
        if view is not None or rows or cols:
            raise CliError("--view/--rows/--cols shape a rendering; --format json writes the result document as is")
        return results_text(document["run"], document["cells"])  # the current schema version
    if fmt == "html" and (rows or cols):
        raise CliError("--rows/--cols apply to Markdown; the HTML page has its own row and column pickers")
    try:
        if fmt == "md":
            from .report.markdown import render_markdown

            return render_markdown(document, rows, cols, view=view or "all", model=model, evidence=evidence)
        if fmt == "html":
            from .report.html import render_html

            return render_html(document, view=view or "all", model=model)
        from .report.terminal import render_terminal

        if rows or cols:
            raise CliError("--rows/--cols apply to Markdown; the terminal grid is backend × arch")
        return render_terminal(document, view=view or "grid") + "\n"
    except ValueError as exc:  # an unknown axis in --rows/--cols
        raise CliError(str(exc)) from None


# -- subcommands ---------------------------------------------------------------------
def cmd_render(args: argparse.Namespace) -> int:
    outputs = args.output or [None]
    if len(outputs) > 1:  # one read, one model, several files (what a run writes: Markdown and HTML)
        if args.format is not None:
            raise CliError("several -o: each file's format comes from its suffix; drop --format")
        if "-" in outputs:
            raise CliError("several -o: each must be a file (- is standard output, for one rendering)")
        repeated = next((o for i, o in enumerate(outputs) if o in outputs[:i]), None)
        if repeated is not None:
            raise CliError(f"-o {repeated} is given twice")
    formats = [output_format(args.format, out) for out in outputs]
    check_outputs([("-o", out) for out in outputs], [args.result])
    document = _read(args.result)
    from .report.model import ReportModel

    model = ReportModel(document)
    evidence = args.evidence
    if args.view == "docs" and evidence is None and args.result != "-":
        evidence = Path(args.result).with_suffix(".html").name  # the run writes NAME.html beside NAME.docs.md
    if evidence == "none":
        evidence = None
    for fmt, out in zip(formats, outputs):
        text = render(document, fmt, _axes(args.rows), _axes(args.cols), args.view, model=model,
                      evidence=evidence)
        if fmt == "json" and out not in (None, "-"):
            try:
                write_results(out, document["run"], document["cells"], inputs=[args.result])
            except OSError as exc:
                raise cannot_write(out, exc) from None
        else:
            _write(text, out, [args.result])
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from .report.merge import MergeConflictError, MergeError, merge_documents

    repeated = next((p for i, p in enumerate(args.results) if p in args.results[:i]), None)
    if repeated is not None:
        raise CliError(f"{repeated} is given twice: each result file merges once")
    check_outputs([("-o", args.output)], args.results)
    docs = [_read(p) for p in args.results]
    try:
        merged = merge_documents(docs, names=args.results, allow_conflicts=args.allow_conflicts,
                                 allow_mixed=args.allow_mixed)
    except MergeConflictError as exc:
        print(f"{PROG} merge: {exc}", file=sys.stderr)
        for c in exc.conflicts:
            print(f"  CONFLICT {c['id']}:", file=sys.stderr)
            for r in c["records"]:
                print(f"    {r['source']} [{r['host']}]: {r['summary']}", file=sys.stderr)
        print("(nothing written; --allow-conflicts writes the merge with these cells as errors)", file=sys.stderr)
        return 1
    except MergeError as exc:
        raise CliError(str(exc)) from None
    try:
        write_results(args.output, merged["run"], merged["cells"], inputs=args.results)
    except OSError as exc:
        raise cannot_write(args.output, exc) from None
    conflicts = merged["run"].get("conflicts") or []
    note = f", {len(conflicts)} conflict(s) kept as errors" if conflicts else ""
    print(f"{PROG} merge: {len(merged['cells'])} cells from {len(docs)} files → {args.output}{note}")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .report.diff import diff_documents

    check_outputs([("-o", args.output)], [args.old, args.new])
    old, new = _read(args.old), _read(args.new)
    a, b = old["run"].get("matrix"), new["run"].get("matrix")
    if a != b:
        raise CliError(f"{args.old} is a result of matrix {a!r}, {args.new} of matrix {b!r}: "
                       "a diff pairs the cells of one matrix")
    diff = diff_documents(old, new, old_name=args.old, new_name=args.new)
    text = diff.markdown() if args.format == "md" else (
        json.dumps(diff.as_dict(), indent=1, ensure_ascii=False) + "\n" if args.format == "json" else diff.text() + "\n")
    _write(text, args.output, [args.old, args.new])
    for warning in diff.warnings():  # also on stderr: a gate's log must show it whatever the format
        print(f"{PROG} diff: {warning}", file=sys.stderr)
    return 1 if diff.gate_fails else 0


_BANNER_COMMAND = re.compile(r"Regenerate with `(pytest-mla render [^`]*)`")


def published_options(text: str) -> dict[str, str]:
    """``--view``/``--rows``/``--cols``/``--format`` as the document's banner records them."""
    head = text[:text.find("<main")] if "<main" in text else "\n".join(text.splitlines()[:12])
    m = _BANNER_COMMAND.search(head)
    if not m:
        return {}
    words = html.unescape(m.group(1)).split()
    return {w[2:]: v for w, v in zip(words, words[1:]) if w in ("--view", "--rows", "--cols", "--format", "--evidence")}


def first_difference(published: str, fresh: str) -> tuple[int, int, str, str]:
    """(line, column, published line, fresh line) of the first difference, 1-based."""
    a, b = published.splitlines(), fresh.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            x, y = x if x is not None else "(end of file)", y if y is not None else "(end of file)"
            col = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            return i + 1, col + 1, x, y
    return len(a), 1, "", ""  # only line endings differ


def _excerpt(line: str, col: int, width: int = 70) -> str:
    start = max(0, col - 1 - width // 2)
    text = line[start:start + width]
    return ("…" if start else "") + text + ("…" if start + width < len(line) else "")


def cmd_check(args: argparse.Namespace) -> int:
    document = _read(args.result)
    try:
        published = read_bounded(args.doc, args.doc).decode("utf-8-sig").replace("\r\n", "\n")
    except OSError as exc:
        raise CliError(f"{args.doc}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"{args.doc}: not UTF-8 text") from None
    except InputLimitError as exc:
        raise CliError(str(exc)) from None
    head = published[:published.find("<main")] if "<main" in published else "\n".join(published.splitlines()[:12])
    if "generated by pytest-mla" not in head:
        raise CliError(f"{args.doc}: not a document pytest-mla rendered (no \"generated by pytest-mla\" banner at "
                       "its top); render it first: pytest-mla render RESULT.json -o " + args.doc)
    recorded = published_options(published)
    suffix = Path(args.doc).suffix.lower()
    fmt = args.format or recorded.get("format") or ("html" if suffix in (".html", ".htm") else "md")
    if fmt not in ("md", "html"):
        raise CliError(f"{args.doc}: check compares Markdown or HTML documents, not {fmt!r}")
    view = args.view or recorded.get("view") or "all"
    rows = _axes(args.rows or recorded.get("rows"))
    cols = _axes(args.cols or recorded.get("cols"))
    if view not in VIEWS:
        raise CliError(f"{args.doc}: unknown view {view!r} in its banner (known: {', '.join(VIEWS)})")
    evidence = args.evidence or recorded.get("evidence")
    fresh = render(document, fmt, rows, cols, view, evidence=evidence if view == "docs" else None)
    options = (f" --format {fmt}" + (f" --view {view}" if view != "all" else "")
               + (f" --evidence {evidence}" if evidence and view == "docs" else "")
               + (f" --rows {','.join(rows)}" if rows else "") + (f" --cols {','.join(cols)}" if cols else ""))
    if published == fresh:
        print(f"{PROG} check: {args.doc} is up to date with {args.result}")
        return 0
    line, col, was, now = first_difference(published, fresh)
    if fmt == "md":
        diff = list(difflib.unified_diff(published.splitlines(keepends=True), fresh.splitlines(keepends=True),
                                         fromfile=f"{args.doc} (published)", tofile=f"{args.doc} (from {args.result})"))
        sys.stdout.writelines(diff[:400])
        if len(diff) > 400:
            print(f"... ({len(diff) - 400} more diff lines)")
    print(f"{PROG} check: {args.doc} is stale: first difference at line {line}, column {col}:\n"
          f"  published: {_excerpt(was, col)}\n"
          f"  rendered:  {_excerpt(now, col)}\n"
          f"regenerate it with:\n  {PROG} render {args.result}{options} -o {args.doc}", file=sys.stderr)
    return 1


def cmd_explain(args: argparse.Namespace) -> int:
    from .core.errors import MatrixError
    from .core.matrix import _as_version, load_matrix
    from .core.rules import render_message

    try:
        matrix = load_matrix(args.matrix)
    except MatrixError as exc:
        more = f" (+{len(exc.problems) - 1} more problems)" if len(exc.problems) > 1 else ""
        raise CliError(str(exc).splitlines()[0] + more) from None
    cell = explained_cell(matrix, args.cell)
    version = _as_version(args.engine_version)
    if args.engine_version and version is None:
        raise CliError(f"--engine-version: not a version: {args.engine_version!r}")
    model = matrix.model(cell)
    out = [f"cell {cell.id}", f"matrix {matrix.path} (engine {matrix.engine_name}, version "
           f"{args.engine_version or 'any'})",
           "model " + model.name + ": " + ", ".join(f"{f}={model.field(f)}" for f in _model_fields())]
    probes = [f"{a} {getattr(cell, a)!r}" for a, values in matrix.probes.items() if getattr(cell, a) in values]
    if probes:
        out.append(f"probe: {', '.join(probes)} (an input-validation probe: the reports list it under "
                   "\"Input validation\", not in the feature tables)")
    decided = None
    for rule in matrix.rules:
        name = f' "{rule.name}"' if rule.name else ""
        head = f"{rule.label}{name}"
        if decided is not None:
            continue
        if not rule.applies_to_version(version):
            out.append(f"  {head}: not for this engine version (engine_version {rule.engine_version})")
            continue
        why = rule.why(cell, model)
        matched = rule.matches(cell, model)  # the when, and one of its reasons if it has any
        if matched and rule.outcome is None:
            verdict = f"matches: xfail ({rule.xfail}); the next matching rule decides"
        elif matched:
            decided = rule
            if rule.outcome == "accept":
                what = "accept"
            elif rule.outcome == "skip":
                what = f"skip (not applicable: {rule.skip}); the engine is not asked"
            elif rule.message is not None:
                what = f"reject with {rule.error}: {rule.render(cell, model)}"
            else:
                what = f"reject with {rule.error} matching /{rule.match}/"
            verdict = f"MATCHES → decides: {what}"
        else:
            verdict = "no match"
        out.append(f"{'→' if rule is decided else ' '} {head}: {verdict}")
        for text, value, ok in why:
            out.append(f"      {'✓' if ok else '✗'} {text}   (cell: {value!r})")
        if all(ok for _, _, ok in why):
            for reason in rule.reasons:
                holds = reason.holds(cell, model)
                out.append(f"      reason {'✓' if holds else '✗'} {render_message(reason.text, cell, model)!r}")
    if decided is None:
        out.append("  no rule decides: the cell must be accepted (default)")
    else:
        rest = len(matrix.rules) - matrix.rules.index(decided) - 1
        if rest:
            out.append(f"  ({rest} later rule(s) not consulted: the first matching rule wins)")
    expect = matrix.expectation(cell, version)
    out.append(f"expectation: {expect.describe()}" + (f" (xfail: {expect.xfail})" if expect.xfail else ""))
    print("\n".join(out))
    return 0


def shipped_matrices() -> dict[str, Any]:
    """Engine name → the matrix file shipped in the package (``pytest_mla/matrices``)."""
    from importlib import resources

    folder = resources.files("pytest_mla").joinpath("matrices")
    found = {}
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name.endswith(".toml"):
                found[entry.name[:-len(".toml")]] = entry
    return dict(sorted(found.items()))


def cmd_init(args: argparse.Namespace) -> int:
    shipped = shipped_matrices()
    if args.engine not in shipped:
        raise CliError(f"no matrix shipped for {args.engine!r} (shipped: {', '.join(shipped) or 'none'})")
    out = Path(args.output or os.path.join("matrix", f"{args.engine}.toml"))
    if out.is_dir():  # a folder (or a link to one): the file goes inside it
        out = out / f"{args.engine}.toml"
    source = shipped[args.engine]
    inputs = [os.fspath(source)] if isinstance(source, os.PathLike) else []
    check_outputs([("-o", os.fspath(out))], inputs)
    if out.exists() and not args.force:
        raise CliError(f"{out} exists; pass --force to replace it with the shipped matrix")
    text = source.read_text(encoding="utf-8")
    try:
        write_text_atomic(out, text, inputs=inputs)
    except OSError as exc:
        raise cannot_write(out, exc) from None
    version = re.search(r'^version\s*=\s*"([^"]*)"', text, re.MULTILINE)
    describes = f" (describes {args.engine} {version.group(1)})" if version else ""
    print(f"{PROG} init: wrote {out}{describes}; run it where {args.engine} is installed with:\n"
          f"  pytest --mla-matrix={out.as_posix()}")
    return 0


#: Above this many cells, explain does not search every cell for the nearest id.
NEAREST_LIMIT = 50_000


def explained_cell(matrix: Any, text: str) -> Any:
    """The cell ``text`` names: a canonical id (``model/backend/dcpN/...``), the name pytest prints
    (``model-backend-dcpN-...``), or a whole node id (``matrix/x.toml::name``). ``CliError`` when
    it names no cell of the matrix, with the nearest id where one is close."""
    from .core.cells import Cell, CellIdError

    name = text.rpartition("::")[2].strip()
    if "/" not in name:  # the form pytest prints
        try:
            return Cell.from_name(name, matrix.axes)
        except CellIdError:
            raise CliError(f"cell {text!r} matches no cell of the matrix{nearest_hint(matrix, name, 'name')}") from None
    try:
        cell = Cell.from_id(name)
    except CellIdError as exc:
        raise CliError(str(exc)) from None
    for axis, value in cell.coords.items():
        if axis not in matrix.axes:
            raise CliError(f"cell {cell.id}: the matrix has no {axis} axis")
        if value not in matrix.axes[axis]:
            known = ", ".join(str(v) for v in matrix.axes[axis])
            raise CliError(f"cell {cell.id}: {axis} {value!r} is not in the matrix (known: {known})"
                           f"{nearest_hint(matrix, cell.id, 'id')}")
    missing = [a for a in matrix.axes if a not in cell.coords]
    if missing:
        raise CliError(f"cell {text}: no value for the matrix's {', '.join(missing)} axis")
    return cell


def nearest_hint(matrix: Any, text: str, form: str) -> str:
    """``; did you mean deepseek-v3/flashmla/dcp2/eagle-2x2/sm90?`` (or nothing when none is close)."""
    if matrix.size > NEAREST_LIMIT:
        return ""
    cells = {getattr(c, form): c for c in matrix.cells()}
    close = difflib.get_close_matches(text, list(cells), n=1, cutoff=0.6)
    return f"; did you mean {cells[close[0]].id}?" if close else ""


def cmd_suggest(args: argparse.Namespace) -> int:
    from .report.suggest import as_patch, as_text, suggest

    check_outputs([("-o", args.output)], [args.result, args.matrix])
    document = _read(args.result)
    suggestions = suggest(document)
    if not suggestions:
        print(f"{PROG} suggest: nothing to suggest: no cell of {args.result} failed because the engine "
              "answered otherwise than its matrix says", file=sys.stderr)
        return 0
    matrix_path = args.matrix or document["run"].get("matrix_file")
    text = None
    if args.format == "patch" and matrix_path:
        try:
            text = read_bounded(matrix_path, os.fspath(matrix_path)).decode("utf-8-sig")
        except (InputLimitError, UnicodeDecodeError) as exc:
            what = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else None
            raise CliError(f"{matrix_path}: {what}" if what else str(exc)) from None
        except OSError as exc:
            if args.matrix:
                raise CliError(f"--matrix {args.matrix}: cannot read: {exc.strerror or exc}") from None
            print(f"{PROG} suggest: {matrix_path} (the result's matrix file) cannot be read here; printing the "
                  "rules with where they go (--matrix PATH gives a patch)", file=sys.stderr)
    inputs = [args.result, os.fspath(matrix_path) if matrix_path else None]
    check_outputs([("-o", args.output)], inputs)  # the matrix the result names is an input too
    cells = sum(len(s.cells) for s in suggestions)
    print(f"{PROG} suggest: {len(suggestions)} rule(s) for {cells} failing cell(s); review before applying "
          "(nothing was changed)", file=sys.stderr)
    _write(as_patch(suggestions, text, os.fspath(matrix_path)) if text is not None else as_text(suggestions),
           args.output, inputs)
    return 0


def cmd_repro(args: argparse.Namespace) -> int:
    from .report.repro import NotAFinding, ReproError, context_for, find_cell, template_for
    from .report.repro.bugreport import render_bug_report
    from .report.repro.runs import python_of, run_all

    outputs = [("-o", args.output), ("--report", args.report)]
    check_outputs(outputs, [args.result])
    document = _read(args.result)
    environments = list(args.engines or [])
    if "auto" in environments:
        from .report.repro.runs import discover

        engine = str(((document.get("run") or {}).get("engine") or {}).get("name") or "")
        found = discover(engine) if engine else []
        if not found:
            raise CliError(f"--engines auto: no .venv-{engine or 'ENGINE'} or .venv-{engine or 'ENGINE'}-VERSION "
                           "folder with bin/python here (make conformance creates them); name the environments")
        environments = [e for e in environments if e != "auto"] + [e for e in found if e not in environments]
    for environment in environments:  # before anything runs or is written
        try:
            python_of(environment)
        except ValueError as exc:
            raise CliError(f"--engines {exc}") from None
    try:
        record = find_cell(document, args.cell)
        ctx = context_for(document, record, result_file=args.result)
    except NotAFinding as exc:
        print(f"{PROG} repro: {exc}", file=sys.stderr)
        return 1
    except ReproError as exc:
        raise CliError(f"{args.result}: {exc}") from None
    template, reasons = template_for(ctx)
    to_stdout = args.output in (None, "-")
    script_name = "repro.py" if to_stdout else args.output
    finding = ctx.finding
    head = f"{record.get('id')} is finding {finding.label} ({finding.facts.title}, {len(finding.records)} cells)"
    command = " ".join([PROG, "repro", args.result, str(record.get("id"))]
                       + ([] if to_stdout else ["-o", args.output])
                       + (["--report", args.report] if args.report else [])
                       + (["--engines", *environments] if environments else []))
    if template is None:
        why = "; ".join(reasons)
        if args.report:
            _write(render_bug_report(ctx, None, script_name=None, why_no_script=reasons, command=command),
                   args.report, [args.result], option="--report")
            print(f"{PROG} repro: {head}: wrote the bug report {args.report}, without a reproducer: {why}",
                  file=sys.stderr)
        if args.output is not None or not args.report:
            raise CliError(f"{record.get('id')}: no reproducer template takes this finding ({why})")
        return 0
    script = template.render(ctx, script_name=script_name if not to_stdout else "repro.py")
    runs = []
    if to_stdout:
        sys.stdout.write(script)
    else:
        _write(script, args.output, [args.result], mode=0o777)  # executable (less the umask)
    if environments:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mla-repro-") as scratch:
            path = args.output if not to_stdout else os.path.join(scratch, "repro.py")
            if to_stdout:
                Path(path).write_text(script, encoding="utf-8")
            runs = run_all(path, environments, timeout_s=args.timeout)
    if args.report:
        _write(render_bug_report(ctx, template, script_name=os.path.basename(script_name), runs=runs,
                                 command=command), args.report, [args.result], option="--report")
    wrote = [f"the reproducer {args.output}"] if not to_stdout else []
    wrote += [f"the bug report {args.report}"] if args.report else []
    if wrote:
        print(f"{PROG} repro: {head}: wrote {' and '.join(wrote)}", file=sys.stderr)
    return 0


def _model_fields() -> Sequence[str]:
    from .core.models import MODEL_FIELDS

    return MODEL_FIELDS


# -- parser ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Render, merge, diff and check pytest-mla result files; "
                                "explain how a matrix decides a cell; suggest the rule edits a failing run calls for; "
                                "write a finding's standalone reproducer and bug report (repro); "
                                "copy a shipped engine matrix into a repo (init).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("render", help="render a result file as Markdown, HTML, JSON or terminal text",
                       description="Render RESULT.json (written by `pytest --mla-matrix`).")
    r.add_argument("result", metavar="RESULT.json", help="a result file, or - for standard input")
    r.add_argument("--format", "-f", choices=FORMATS, default=None,
                   help="output format (default: from the -o suffix .md/.html/.json/.txt; md on stdout)")
    r.add_argument("-o", "--output", metavar="OUT", action="append", default=None,
                   help="output file (default: stdout); repeat it to write several formats from one read of "
                        "the result file (-o page.md -o page.html)")
    r.add_argument("--view", choices=VIEWS, default=None,
                   help="backends: one row per backend, one column per feature; "
                        "grid: backend × arch · spec tables; all: both (default for md and html; "
                        "grid for terminal); docs: the short Markdown page an engine pastes into its docs "
                        "(a run writes it as NAME.docs.md)")
    r.add_argument("--evidence", metavar="URL",
                   help="--view docs: the HTML report each symbol links to, a URL or a path relative to the "
                        "page (default: RESULT.html beside the page; 'none': no links)")
    r.add_argument("--rows", metavar="AXES", help="row axes of the md grid, comma-separated (default: backend)")
    r.add_argument("--cols", metavar="AXES", help="column axes of the md grid, comma-separated (default: arch,spec)")
    r.set_defaults(func=cmd_render)

    m = sub.add_parser("merge", help="merge result files of one matrix from several hosts",
                       description="Union of the cells of several result files (one per GPU type). A cell with "
                                   "contradictory results on two hosts is a conflict: exit 1, nothing written, "
                                   "unless --allow-conflicts. Files of different matrices never merge; runs of "
                                   "different engines, kernel dtypes, seeds or tiers only with --allow-mixed "
                                   "(exit 2 otherwise).")
    m.add_argument("results", nargs="+", metavar="RESULT.json")
    m.add_argument("-o", "--output", required=True, metavar="ALL.json")
    m.add_argument("--allow-conflicts", action="store_true",
                   help="write the merge anyway; conflicting cells become errors listed in run.conflicts")
    m.add_argument("--allow-mixed", action="store_true",
                   help="merge runs of different engines, kernel dtypes, seeds or tiers (refused by default, "
                        "exit 2); the header joins the values (seed \"0 / 1\"), run.mixed_settings names them "
                        "and run.merged_from records each input's")
    m.set_defaults(func=cmd_merge)

    d = sub.add_parser("diff", help="regressions, fixes, new and gone cells between two result files",
                       description="Compare OLD.json with NEW.json. Exit 1 when a cell regressed "
                                   "(pass → fail/error, or kernel verified → failed) or when NEW.json is a run "
                                   "that was interrupted (run.interrupted); cells an incomplete NEW.json lacks "
                                   "are 'not reported', not 'gone'.")
    d.add_argument("old", metavar="OLD.json")
    d.add_argument("new", metavar="NEW.json")
    d.add_argument("--format", "-f", choices=("text", "md", "json"), default="text",
                   help="text (default), md (a PR comment) or json")
    d.add_argument("-o", "--output", metavar="OUT", default=None, help="output file (default: stdout)")
    d.set_defaults(func=cmd_diff)

    c = sub.add_parser("check", help="fail when a published table (Markdown or HTML, any view) is stale",
                       description="Render RESULT.json again as DOC was rendered (format from its suffix, view, "
                                   "rows and cols from its banner, unless given) and compare; exit 1 naming the "
                                   "first difference (and, for Markdown, a unified diff) when they differ.")
    c.add_argument("doc", metavar="DOC")
    c.add_argument("--from", dest="result", required=True, metavar="RESULT.json")
    c.add_argument("--format", "-f", choices=("md", "html"), default=None,
                   help="what DOC is (default: from its banner, else .html/.htm → html, else md)")
    c.add_argument("--view", choices=VIEWS, default=None, help="the view DOC was rendered with (default: its banner)")
    c.add_argument("--evidence", metavar="URL", default=None,
                   help="the HTML report a docs page links to (default: its banner)")
    c.add_argument("--rows", metavar="AXES", help="row axes the document was rendered with (default: its banner)")
    c.add_argument("--cols", metavar="AXES", help="column axes the document was rendered with (default: its banner)")
    c.set_defaults(func=cmd_check)

    s = sub.add_parser("suggest", help="the rule edits that would make a matrix describe what the engine did",
                       description="For the cells of RESULT.json that failed because the engine answered "
                                   "otherwise than the matrix says, print [[rule]] tables (exact messages, the "
                                   "smallest `when` covering each group of cells) as a unified diff of the "
                                   "matrix file, for a person to review. Nothing is written to the matrix.")
    s.add_argument("result", metavar="RESULT.json", help="a result file, or - for standard input")
    s.add_argument("--matrix", metavar="MATRIX.toml", default=None,
                   help="the matrix file to patch (default: the result's run.matrix_file)")
    s.add_argument("--format", "-f", choices=("patch", "rules"), default="patch",
                   help="patch: a unified diff of the matrix (default); rules: the rules and where they go")
    s.add_argument("-o", "--output", metavar="OUT", default=None, help="output file (default: stdout)")
    s.set_defaults(func=cmd_suggest)

    i = sub.add_parser("init", help="copy a matrix pytest-mla ships (sglang, vllm, reference) into this repo",
                       description="Write the engine matrix this pytest-mla ships for ENGINE to matrix/ENGINE.toml "
                                   "(or -o PATH), to run with pytest --mla-matrix and edit as the engine changes.")
    i.add_argument("engine", metavar="ENGINE", help="sglang, vllm or reference")
    i.add_argument("-o", "--output", metavar="PATH", default=None,
                   help="where to write it (a file, or a folder for ENGINE.toml; default matrix/ENGINE.toml)")
    i.add_argument("--force", action="store_true", help="replace an existing file")
    i.set_defaults(func=cmd_init)

    x = sub.add_parser("repro", help="a finding as a standalone reproducer script and a bug report",
                       description="For a finding of RESULT.json (a configuration the engine accepted whose own "
                                   "code then failed in the kernel check), write a standalone Python script that "
                                   "rebuilds the engine's own objects as the cell's check built them and calls the "
                                   "engine's function (no pytest, no pytest-mla: run it in the engine's "
                                   "environment; exit 1 while the bug exists, 0 once fixed, 2 when it cannot "
                                   "build the engine's objects), and with --report a bug report in Markdown: the "
                                   "serve flags, when a server meets it, expected and actual, the engine's frames, "
                                   "the releases where it reproduces (--engines) and the upstream reports the "
                                   "matrix names. A cell that is not a finding exits 1 saying what it is.")
    x.add_argument("result", metavar="RESULT.json", help="a result file, or - for standard input")
    x.add_argument("cell", metavar="CELL_ID",
                   help="the cell: its id (model/backend/dcpN/spec/arch[/kv-X]...), the name pytest prints "
                        "(model-backend-dcpN-...), or a whole node id")
    x.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="the reproducer script (default: stdout)")
    x.add_argument("--report", metavar="FILE.md", default=None, help="also write the bug report there")
    x.add_argument("--engines", nargs="+", metavar="VENV", default=None,
                   help="run the reproducer in each of these environments (a virtual environment folder or a "
                        "Python executable; 'auto': every .venv-ENGINE and .venv-ENGINE-VERSION folder here) and "
                        "put the releases where it reproduces into the report")
    x.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                   help="per run of --engines (default 600)")
    x.set_defaults(func=cmd_repro)

    e = sub.add_parser("explain", help="which rule of a matrix decides a cell, and why",
                       description="Try each rule of MATRIX.toml in order against CELL_ID "
                                   "(model/backend/dcpN/spec/arch[/kv-X][/pageN][/tpN], or the name pytest prints: "
                                   "model-backend-dcpN-spec-arch, or a whole node id), showing each predicate "
                                   "with the cell's value; the deciding rule is marked with →.")
    e.add_argument("matrix", metavar="MATRIX.toml")
    e.add_argument("cell", metavar="CELL_ID")
    e.add_argument("--engine-version", metavar="VERSION", default=None,
                   help="the engine version rules gated on engine_version are checked against (default: any)")
    e.set_defaults(func=cmd_explain)
    return p


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse names the option when this refuses)."""
    from .core.deadline import positive_seconds

    try:
        return positive_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    # A terminal whose encoding is not UTF-8 (LANG=C, PYTHONIOENCODING=ascii) still gets every
    # report: what it cannot show is written as a backslash escape, never an error.
    restore = [(stream, stream.errors) for stream in (sys.stdout, sys.stderr) if _reconfigurable(stream)]
    for stream, _ in restore:
        stream.reconfigure(errors="backslashreplace")
    try:
        return _main(argv)
    finally:
        for stream, errors in restore:
            try:
                stream.reconfigure(errors=errors)
            except (ValueError, OSError):  # closed meanwhile
                pass


def _reconfigurable(stream: Any) -> bool:
    return hasattr(stream, "reconfigure") and isinstance(getattr(stream, "errors", None), str)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # One command over one document: it makes no garbage cycles worth a collection, and with a
    # million cells the cyclic collector would walk them all, again and again, for nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except UnicodeEncodeError as exc:  # an output that cannot take a character: not the input's fault
        hint = "" if exc.encoding.replace("-", "").lower() == "utf8" else " (set PYTHONIOENCODING=utf-8)"
        print(f"{PROG}: error: cannot write {exc.object[exc.start:exc.end]!r} in {exc.encoding}{hint}",
              file=sys.stderr)
        return 2
    except RecursionError:  # a value nested past Python's stack that no reader check caught
        print(f"{PROG}: error: {_input_files(args)}: nested too deeply to process", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{PROG}: error: {_input_files(args)}: out of memory (set {MAX_INPUT_BYTES_ENV} lower to "
              "refuse such inputs before reading them)", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file that could not be read or written, anywhere not caught above
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{PROG}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        # A result file that passed the checks of read_results but has odd records.
        print(f"{PROG}: error: malformed result data in {_input_files(args)} ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    finally:
        if was_enabled:
            gc.enable()


def _input_files(args: argparse.Namespace) -> str:
    """The result files a command read, for a message about them."""
    files = [getattr(args, k) for k in ("result", "old", "new") if isinstance(getattr(args, k, None), str)]
    files += list(getattr(args, "results", None) or [])
    return ", ".join(files) or "the input"


__all__ = ["main", "build_parser"]


if __name__ == "__main__":
    sys.exit(main())
