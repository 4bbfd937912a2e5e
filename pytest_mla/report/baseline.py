"""The drift gate of a nightly run: compare with a baseline, write the GitHub step summary.

``check_baseline(old_doc, new_doc)`` → ``(regressions, markdown)``: the
regressions (``Change`` records, see ``diff.py``) and a Markdown report of
the whole diff. ``append_step_summary(markdown)`` appends Markdown to
``$GITHUB_STEP_SUMMARY`` within GitHub's 1 MiB limit per step summary.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .diff import Change, diff_documents
from .output import open_append

#: GitHub refuses a step summary over 1 MiB (and shows none of it).
STEP_SUMMARY_LIMIT = 1024 * 1024
TRUNCATED_NOTE = ("\n\n> ✂️ pytest-mla: this summary was cut to stay under GitHub's 1 MiB step-summary limit "
                  "({dropped} bytes left out); the full report is in the JSON/HTML artifacts.\n")


def check_baseline(old_doc: Mapping[str, Any], new_doc: Mapping[str, Any], *, old_name: str = "baseline",
                   new_name: str = "this run") -> tuple[list[Change], str]:
    """Regressions of ``new_doc`` against ``old_doc`` (empty: the gate passes) and a Markdown report."""
    diff = diff_documents(old_doc, new_doc, old_name=old_name, new_name=new_name)
    return list(diff.regressions), diff.markdown()


def append_step_summary(markdown: str, path: str | os.PathLike[str] | None = None,
                        limit: int = STEP_SUMMARY_LIMIT) -> bool:
    """Append ``markdown`` to the step summary file; False (nothing written) when there is none.

    ``path`` defaults to ``$GITHUB_STEP_SUMMARY``. The file as a whole stays
    within ``limit`` bytes: text that does not fit is cut at a line boundary
    and a note says how much was left out.
    """
    if path is None:
        path = os.environ.get("GITHUB_STEP_SUMMARY")
        if not path:
            return False
    try:
        used = os.path.getsize(path)
    except OSError:
        used = 0
    data = markdown.encode("utf-8")
    if not markdown.endswith("\n"):
        data += b"\n"
    room = limit - used
    if len(data) > room:
        reserve = len(TRUNCATED_NOTE.format(dropped=len(data)).encode("utf-8")) + 8
        keep = max(0, room - reserve)
        cut = data[:keep]
        newline = cut.rfind(b"\n")
        if newline > 0:
            cut = cut[: newline + 1]
        cut = cut.decode("utf-8", errors="ignore").encode("utf-8")
        note = TRUNCATED_NOTE.format(dropped=len(data) - len(cut)).encode("utf-8")
        data = cut + note if len(cut) + len(note) <= room else b""
        if not data:
            return False
    with open_append(path) as f:  # a FIFO or device there is an OSError, never a wait
        f.write(data)
    return True


__all__ = ["check_baseline", "append_step_summary", "STEP_SUMMARY_LIMIT"]
