"""How long each finding's standalone reproducer takes, in each engine environment given.

    .venv/bin/python benchmarks/repro.py RESULT.json --engines .venv-sglang .venv-sglang-0.5.22

For each distinct finding of RESULT.json (its first cell), writes the reproducer with
``pytest-mla repro`` and runs it in every environment (``python -I``, as ``--engines`` runs it),
printing the outcome, the exit status, the wall time of the whole process and the time the
script measured itself (imports excluded from neither). Findings no template takes are listed
with the reason. The target is under 30 s per run on a 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pytest_mla.report.findings import group_findings
from pytest_mla.report.repro import context_for, template_for
from pytest_mla.report.repro.runs import run_script
from pytest_mla.report.results import read_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result")
    parser.add_argument("--engines", nargs="+", required=True, metavar="VENV")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    document = read_results(args.result)
    engine = str((document["run"].get("engine") or {}).get("name") or "")
    findings = group_findings(document["cells"], engine)
    print(f"{args.result}: {len(findings)} distinct findings")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mla-repro-bench-") as scratch:
        for finding in findings:
            record = finding.records[0]
            ctx = context_for(document, record, result_file=args.result)
            template, reasons = template_for(ctx)
            if template is None:
                print(f"  {finding.label} {record['id']}: no template ({'; '.join(reasons)})")
                continue
            script = Path(scratch) / f"repro_{finding.number}.py"
            start = time.perf_counter()
            script.write_text(template.render(ctx, script_name=script.name))
            generate_s = time.perf_counter() - start
            for environment in args.engines:
                run = run_script(script, environment, timeout_s=args.timeout)
                rows.append((finding.label, record["id"], environment, run, generate_s))
                print(f"  {finding.label} {record['id']}: {run.summary()} (generated in {generate_s * 1000:.0f} ms)")
    if rows:
        times = [run.seconds for *_, run, _ in rows]
        print(f"runs: {len(times)}, wall s: min {min(times):.1f}, median {sorted(times)[len(times) // 2]:.1f}, "
              f"max {max(times):.1f}; over 30 s: {sum(t > 30 for t in times)}")


if __name__ == "__main__":
    main()
