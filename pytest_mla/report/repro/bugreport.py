"""The bug report of a finding, in Markdown, for an engine's tracker (``pytest-mla repro --report``).

A pure function of the finding cell, its run, the template that reproduces it
(if any) and the runs of the reproducer in other environments (``runs.py``).
"""

from __future__ import annotations

from typing import Any, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..findings import short_function
from ..serving import CHECKPOINTS, display_name, serve_command
from .runs import EngineRun
from .templates import Context, Template

__all__ = ["render_bug_report", "title_of"]


def _model_names(ctx: Context) -> list[str]:
    names: list[str] = []
    for r in ctx.finding.records:
        model = str((r.get("coords") or {}).get("model"))
        label = CHECKPOINTS.get(model, model).rpartition("/")[2]
        if label not in names:
            names.append(label)
    return names


def title_of(ctx: Context) -> str:
    """``[Bug] --attention-backend triton with --dcp-size 4 on MLA models (...): decode raises X in Y``."""
    coords = ctx.coords
    facts = ctx.finding.facts
    prefill, plus, decode = str(coords.get("backend")).partition("+")
    backend = (f"--prefill-attention-backend {prefill} --decode-attention-backend {decode}" if plus
               else f"--attention-backend {coords.get('backend')}")
    parts = [backend]
    dcp = int(coords.get("dcp", 1))
    if dcp > 1:
        parts.append(f"--dcp-size {dcp}")
    if facts.step == "verify":
        parts.append("speculative decoding (EAGLE)")
    kind = "MLA" if ctx.model.mla else "GQA"
    models = ", ".join(_model_names(ctx))
    what = (f"{facts.step} raises {facts.error} in {short_function(facts.function)}" if facts.kind == "raised"
            else f"a NaN in a free KV slot reaches the {facts.step} output of {short_function(facts.function)}"
            if facts.hardening else f"{facts.step} output out of tolerance in {short_function(facts.function)}")
    return f"[Bug] {' + '.join(parts)} on {kind} models ({models}): {what}"


def _fence(text: str, lang: str = "") -> list[str]:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return [f"{ticks}{lang}", text, ticks]


def _range_of(ctx: Context) -> SpecifierSet | None:
    text = (ctx.run.get("engine") or {}).get("described_versions")
    try:
        return SpecifierSet(text) if text and text != "*" else None
    except InvalidSpecifier:
        return None


def _in_range(spec: SpecifierSet | None, version: str | None) -> bool | None:
    if spec is None or not version:
        return None
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return None


def render_bug_report(ctx: Context, template: Template | None, *, script_name: str | None,
                      runs: Sequence[EngineRun] = (), why_no_script: Sequence[str] = (),
                      command: str | None = None) -> str:
    """The report's Markdown. ``script_name``: the reproducer written beside it (None: none could be);
    ``runs``: the reproducer's runs in other environments (``--engines``)."""
    finding, facts = ctx.finding, ctx.finding.facts
    engine, version = display_name(ctx.engine), ctx.version
    phase = facts.phase
    archs = [v for a, vals in finding.coverage(["arch"]) for v in vals]
    out = [f"# {title_of(ctx)}", ""]
    summary = (f"{engine} {version} accepts this configuration at start-up, then its own code fails when it "
               f"computes a {facts.step} step: " + (f"it hands a kernel an index outside the cache, which the check's "
                                                     f"`{facts.error}` refused in `{facts.function}` (a GPU follows "
                                                     "it without raising)." if facts.out_of_range
                                                     else f"`{facts.error}` in `{facts.function}`." if facts.kind == "raised"
                                                     else "a NaN in a free KV-cache slot reaches the attention "
                                                     "output (with the slots zero-filled it is right)."
                                                     if facts.hardening else "the attention output is out of tolerance."))
    out += [summary, f"A server in this configuration meets it {phase.text}.", ""]

    out += ["## Environment", ""]
    out.append(f"- **engine**: {engine} {version} (the release the matrix ran)")
    if archs:
        out.append(f"- **GPU**: any of those the matrix covered: {', '.join(map(str, archs))} (the arch is no flag;"
                   " the finding is in code the arch does not select)")
    out.append(f"- **found by**: pytest-mla, matrix `{ctx.run.get('matrix_file') or ctx.run.get('matrix')}`, cell "
               f"`{ctx.record.get('id')}` (result file `{ctx.result_file}`)")
    level = ctx.kernel.get("level")
    if level == "emulated":
        out.append(f"- **the kernel itself did not run**: the check ran {engine}'s backend code with its kernel "
                   "library's calls replaced by float64 emulations of their contract ("
                   + (", ".join(f"`{e}`" for e in facts.emulated)
                      or "none was called before the engine raised") + "); the finding is in the engine's code around "
                   "the kernel, or in the emulation's reading of the contract: confirm on the GPU")
    elif level:
        out.append(f"- **what ran**: {engine}'s own code at level `{level}` (its backend object and kernels)"
                   + (", Triton's interpreter on a CPU" if ctx.kernel.get("where") == "interpreter" else ""))
    out.append("")

    out += ["## Configuration", ""]
    out += _fence(serve_command(ctx.engine, ctx.coords, ctx.model), "sh")
    out.append("")
    cells = finding.describe_cells(list((ctx.run.get("axes") or {}) or ctx.coords), None)
    out.append(f"Every configuration of the matrix that fails the same way ({len(finding.records)} cells): {cells}.")
    decode = ((ctx.record.get("outcome") or {}).get("backends") or {}).get("decode")
    if decode:
        out.append(f"{engine} builds `{decode}` as the decode backend here.")
    out += _kv_scale_lines(ctx)
    out.append("")

    out += ["## When a server meets it", "", f"{phase.text[0].upper()}{phase.text[1:]}.", ""]
    if phase.sources:
        out.append(f"From {engine}'s defaults for this configuration, read in its source:")
        out += [f"- {source}" for source in phase.sources]
        out.append("")

    out += ["## Expected", ""]
    out.append(f"{engine} accepts the configuration (none of its start-up checks refuses it), so the {facts.step} "
               "step should compute attention, within the tolerance of its dtype of a float64 reference (the "
               "reproducer checks that). If the configuration is not meant to be served, start-up should refuse "
               "it with an error that says so.")
    out += ["", "## Actual", ""]
    if facts.kind == "raised":
        out += _fence(facts.statement)
    else:
        out.append(f"Out of tolerance of the float64 reference: {facts.statement}")
    out.append("")
    live = next((r for r in runs if r.reproduces and r.same and r.frames), None)
    frames = live.frames if live is not None else facts.frames
    if frames:
        source = (f"the reproducer's run on {engine} {live.version}" if live is not None
                  else f"the matrix run on {engine} {version}")
        out.append(f"Where it raises ({engine}'s frames, outermost first; line numbers of {source}):")
        out.append("")
        out += [f"{i}. `{frame}`" for i, frame in enumerate(frames, start=1)]
    elif facts.function:
        out.append(f"Raised in `{facts.function}`.")
    out.append("")

    out += ["## Releases", ""]
    spec = _range_of(ctx)
    out.append(f"The matrix describes {engine} `{spec}`." if spec is not None else
               f"The matrix names no range of {engine} releases.")
    out += ["", "| release | reproduces | how it was checked |", "|---|---|---|"]
    out.append(f"| {version} | yes | the matrix run that found it ({len(finding.records)} cells) |")
    for run in runs:
        answer = {"reproduced": "yes" if run.same is not False else "fails differently",
                  "fixed": "no: computed within tolerance"}.get(run.status, "unknown: " + (run.message or run.status))
        inside = _in_range(spec, run.version)
        note = " (outside the matrix's range)" if inside is False else ""
        extra = f" ({run.error})" if run.reproduces and run.error else ""
        out.append(f"| {run.version or '?'}{note} | {answer}{extra} | the reproducer in `{run.environment}`, "
                   f"exit {run.exit_code}, {run.seconds:.1f} s |")
    checked = {version} | {r.version for r in runs if r.version}
    out += ["", f"Not checked here: the other releases of the range (`pytest-mla repro ... --engines VENV ...` runs "
            f"the reproducer in each environment given; checked: {', '.join(sorted(checked))})."]
    out.append("")

    out += ["## Reproducer", ""]
    if script_name is not None and template is not None:
        out.append(f"`{script_name}`, standalone (torch and {engine} only; no pytest, no pytest-mla):")
        out.append("")
        out += _fence(f"python {script_name}", "sh")
        out.append("")
        out.append(f"It {template.describes}. It exits 1 while the bug exists (the engine raises, or its output "
                   "is out of tolerance of the float64 reference), 0 once it is fixed, 2 when it cannot build the "
                   "engine's objects; the last line of its output is the outcome as JSON.")
    else:
        out.append("No standalone reproducer yet: " + ("; ".join(why_no_script) or "no template takes it") + ".")
    if command:
        out += ["", f"Generated with `{command}`."]
    out.append("")

    if finding.links:
        out += ["## Related upstream reports", ""]
        out += [f"- <{link}>" for link in finding.links]
        out.append("")
    if finding.xfail:
        out += ["## The matrix's note", "", f"> {finding.xfail}", ""]
    return "\n".join(out).rstrip("\n") + "\n"



def _kv_scale_lines(ctx: Any) -> list[str]:
    """An fp8 finding that depends on the checkpoint's KV scales: which scales the check ran, and how each went."""
    variants = [v for v in ctx.kernel.get("variants") or () if v.get("kv_scale") is not None]
    if len(variants) < 2:
        return []
    told = "; ".join(f"k_scale = v_scale = {float(v['kv_scale']):g}: {v.get('status')}" for v in variants)
    return [f"The check ran the fp8 cache with each KV scale a checkpoint may carry ({told}): the finding needs a "
            "checkpoint whose quantization config carries calibrated KV scales (k_scale != 1); one without them "
            "(k_scale 1.0) " + ("passes." if any(float(v["kv_scale"]) == 1.0 and v.get("status") == "verified"
                                            for v in variants) else "was not verified either.")]
