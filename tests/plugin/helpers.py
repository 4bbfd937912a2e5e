"""Shared bits of the plugin tests: a scriptable engine and small matrices."""

import json
import textwrap

from pytest_mla.report.results import read_results

LIAR_CONFTEST = '''
import os
from pytest_mla.engines.protocol import Configured


class LiarEngine:
    """Accepts everything except what its backend name asks for."""

    name = "liar"
    version = "1.2.0"
    refusal_errors = (ValueError, AssertionError)

    def configure(self, cell, model):
        if cell.backend == "crash" and cell.arch == "sm100":
            os._exit(3)
        if cell.backend == "interrupt" and cell.arch == "sm100":
            raise KeyboardInterrupt
        if cell.backend == "boom":
            raise RuntimeError("engine blew up")
        if cell.backend == "strict":
            raise ValueError(f"strict refuses {cell.arch}.")
        return Configured({"decode": cell.backend}, kernel_reason="no kernel in this test engine")

    def metadata(self):
        return {"stubs": []}


def pytest_mla_engines(config):
    return {"liar": LiarEngine}
'''


def matrix(backends, rules="", engine="liar", archs=("sm90", "sm100"), extra=""):
    axes = textwrap.dedent(f"""
        [engine]
        name = "{engine}"

        [axes]
        model = ["deepseek-v3"]
        backend = {json.dumps(list(backends))}
        dcp = [1]
        spec = ["none"]
        arch = {json.dumps(list(archs))}
    """)
    return axes + textwrap.dedent(extra) + textwrap.dedent(rules)


def read_report(pytester, name="m"):
    return read_results(pytester.path / "reports" / f"{name}.json")


def run_facts(pytester, name="m"):
    """Cell id → the volatile facts of its record (``reports/<name>.run.json``)."""
    return json.loads((pytester.path / "reports" / f"{name}.run.json").read_text())["cells"]


def verdicts(doc):
    return {c["id"]: c["verdict"] for c in doc["cells"]}


#: LIAR_CONFTEST plus a backend "hang" that marks the file "hanging" and sleeps: a run to kill or to race.
HANGS = LIAR_CONFTEST.replace('''        if cell.backend == "boom":''', '''        if cell.backend == "hang":
            open("hanging", "w").close()
            time.sleep(120)
        if cell.backend == "boom":''').replace("import os\n", "import os\nimport time\n", 1)
