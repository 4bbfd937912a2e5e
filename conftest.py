"""Repo-level pytest setup: the project's own tests live in tests/."""

collect_ignore = ["examples", "benchmarks", "build"]
