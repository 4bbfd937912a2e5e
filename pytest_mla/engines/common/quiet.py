"""Silence an engine's warnings and logging while its checks run (shared by the adapters)."""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Warnings ignored and logging below ERROR disabled, restored afterwards."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)
