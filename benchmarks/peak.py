"""Run a Python module as ``python -m`` does and write its own peak resident memory (kB) to a file.

    python benchmarks/peak.py OUT_FILE MODULE [ARGS...]

``ru_maxrss`` of a child (``os.wait4``, ``RUSAGE_CHILDREN``) is not the child's own peak: Linux
starts it from the parent's high-water mark at fork, so every command a large benchmark process
starts reads at least that process's size. ``VmHWM`` of ``/proc/self/status`` is the peak of the
process's own memory since it exec'd; it is read at exit (elsewhere: ``ru_maxrss`` of self).
"""

from __future__ import annotations

import atexit
import runpy
import sys


def peak_kb() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux; not the case we meet


def main() -> None:
    out, module, *args = sys.argv[1:]
    atexit.register(lambda: open(out, "w", encoding="ascii").write(str(peak_kb())))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
