"""The reproducer templates, in the order they are tried (see ``templates.py``)."""

from __future__ import annotations

from .sglang import SGLangBackendTemplate
from .templates import Context, Template

__all__ = ["TEMPLATES", "template_for"]

#: Tried in order; the first whose ``applies`` returns None takes a finding.
TEMPLATES: tuple[Template, ...] = (SGLangBackendTemplate(),)


def template_for(ctx: Context) -> tuple[Template | None, list[str]]:
    """The template that takes the cell, or None and why each template declined."""
    reasons = []
    for template in TEMPLATES:
        why = template.applies(ctx)
        if why is None:
            return template, []
        reasons.append(f"{template.name}: {why}")
    return None, reasons
