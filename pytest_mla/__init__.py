"""pytest-mla: a pytest plugin that turns MLA attention-backend rules into a tested matrix."""

__version__ = "0.1.0"
