"""tinyengine: a toy inference engine with MLA attention backends (the pytest-mla worked example)."""

__version__ = "0.4.1"
