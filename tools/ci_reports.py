"""What CI needs to trust a committed real-engine report without recomputing its kernel column.

    python tools/ci_reports.py source-hash            # the hash of everything a report is computed from
    python tools/ci_reports.py outcomes COMMITTED.json FRESH.json

A conformance run with kernel checks (``tools/conformance.sh``) writes ``reports/NAME-VERSION.source``
beside the report: ``source-hash`` of the tree it ran from (pytest-mla, the matrices, the conformance
script, its ini and lock files). While that file equals the hash of the tree under test, the committed
kernel column is what this code computes on that pinned engine, and CI may run that release's matrix
in the quick tier (every cell validated, numeric checks on the covering sample) or validation-only:
``outcomes`` then holds every cell's expectation and outcome to the committed report, and, for each
cell whose check the fresh run made again (the quick tier's sample) or that has no check, its verdict,
reason and kernel result (status, level, message, and per output whether it was within tolerance);
exit 1 naming the cells that differ. When the hash differs, CI recomputes the
whole report as for any other release (``.ci/run``).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What a report's cells are computed from, besides the engine release itself (pinned by its lock file).
SOURCES = ("pytest_mla", "matrix", "tools/conformance.sh", "tools/engine-pytest.ini", "tools/locks", "pyproject.toml")
#: The fields of a cell that the engine's start-up and validation decide (the kernel check decides the rest).
OUTCOME_FIELDS = ("coords", "expectation", "outcome")
#: What a kernel check made again must give again: its result and, per output, whether it was within
#: tolerance. Not its numbers: an interpreted check's float32 sums follow the BLAS threading of the
#: process it runs in, which the checks that ran before it in that process can change (measured: 32 of
#: 234 vLLM checks a quick run made again differed from the full run's in the 4th digit; two full runs,
#: same order, agree to every digit).
KERNEL_FIELDS = ("status", "level", "where", "reason", "message", "finding", "raised")
#: The reasons of a check the fresh run left out on purpose: only the committed report has its result.
LEFT_OUT = ("quick tier:", "kernel checks disabled")
SHOWN = 20


def source_hash(root: Path = ROOT) -> str:
    """sha256 over the path and content of every file under ``SOURCES`` that git tracks or would track (a new
    module not yet added counts: a run made before ``git add`` must hash as the commit that adds it), as the
    working tree has it."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", *SOURCES], check=True, capture_output=True).stdout.split(b"\0")
    digest = hashlib.sha256()
    for name in sorted({n for n in listed if n}):
        path = root / name.decode()
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        digest.update(name + b"\0" + hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return digest.hexdigest()


def outcome_differences(committed: dict, fresh: dict) -> list[str]:
    """One line per cell whose validation differs between two result documents of one matrix."""
    old = {c["id"]: c for c in committed["cells"]}
    new = {c["id"]: c for c in fresh["cells"]}
    lines = [f"{cid}: in the committed report only" for cid in old.keys() - new.keys()]
    lines += [f"{cid}: in the fresh run only" for cid in new.keys() - old.keys()]
    for cid in sorted(old.keys() & new.keys()):
        was, now = old[cid], new[cid]
        fields = list(OUTCOME_FIELDS)
        kernel = now.get("kernel") or {}
        again = bool(kernel) and not str(kernel.get("reason") or "").startswith(LEFT_OUT)
        if not was.get("kernel") or again:  # validation's alone, or a check this run made again
            fields += ["verdict", "reason"]
        for field in fields:
            if was.get(field) != now.get(field):
                lines.append(f"{cid}: {field} was {was.get(field)!r}, now {now.get(field)!r}")
        if again:
            committed_kernel = was.get("kernel") or {}
            for field in KERNEL_FIELDS:
                if committed_kernel.get(field) != kernel.get(field):
                    lines.append(f"{cid}: kernel.{field} was {committed_kernel.get(field)!r:.120}, "
                                 f"now {kernel.get(field)!r:.120}")
            if _within(committed_kernel) != _within(kernel):
                lines.append(f"{cid}: kernel outputs within tolerance were {_within(committed_kernel)}, "
                             f"now {_within(kernel)}")
    return sorted(lines)


def _within(kernel: dict) -> dict:
    """Output name → whether it was within tolerance (``errors.NAME.ok``)."""
    return {name: (error or {}).get("ok") for name, error in sorted((kernel.get("errors") or {}).items())}


def main(argv: list[str]) -> int:
    if argv[:1] == ["source-hash"] and len(argv) == 1:
        print(source_hash())
        return 0
    if argv[:1] == ["outcomes"] and len(argv) == 3:
        sys.path.insert(0, str(ROOT))
        from pytest_mla.report.results import read_results

        committed, fresh = argv[1], argv[2]
        lines = outcome_differences(read_results(committed), read_results(fresh))
        if not lines:
            print(f"ci_reports: {fresh}: every cell's validation is as in {committed}")
            return 0
        print(f"ci_reports: {fresh}: {len(lines)} differences from {committed}:")
        for line in lines[:SHOWN]:
            print(f"  {line}")
        if len(lines) > SHOWN:
            print(f"  ... and {len(lines) - SHOWN} more")
        return 1
    print("usage:\n" + "\n".join(__doc__.strip().splitlines()[2:4]), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
