"""What an engine runner is handed and returns (``KernelSpec.protocol == "engine"``; see ``engine_check``)."""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from typing import Any, Callable, Iterator, Mapping

import torch

from .collectives import Collectives
from .inputs import DecodeInputs

__all__ = ["BackendRaised", "EngineCannotRun", "EngineRunner", "RankContext", "RankResult", "engine_frames_of",
           "engine_function_of", "engine_step", "step_of_exception"]


@dataclasses.dataclass(frozen=True)
class RankContext:
    rank: int
    world: int
    interleave: int  # tokens per rank block of the case's DCP layout (1: cyclic)
    collectives: Collectives
    device: torch.device
    case: Any  # the KernelCase


@dataclasses.dataclass
class RankResult:
    out: torch.Tensor  # [b, s_q, h, d_v]: the heads this rank holds after the engine's merge
    lse: torch.Tensor | None  # [b, h, s_q] natural log; None when the engine's path returns none
    heads: tuple[int, int] | None = None  # [start, stop) of the case's query heads; None: all
    functions: tuple[str, ...] = ()  # engine functions that computed / merged, "module:qualname"
    notes: tuple[str, ...] = ()
    #: Kernel-library callables the engine called that ran as float64 emulations ("module:qualname",
    #: ``kernels.emulated.install.CallLog.called``); non-empty exactly when the level is "emulated".
    emulated: tuple[str, ...] = ()
    #: The schedule the engine handed its kernel, by parameter (``{"num_kv_splits": [1, 2]}``: the distinct
    #: split counts it was given; ``engines.common.schedule``; ``core.records.GRAPH_PADDED``: the request
    #: count of the CUDA graph the batch was padded to); empty where the runner records none.
    schedule: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)


EngineRunner = Callable[[DecodeInputs, RankContext, Mapping[str, Any]], RankResult]


#: The attribute ``engine_step`` sets on an exception raised inside it: the check's step it ended.
STEP_ATTRIBUTE = "_pytest_mla_step"


@contextlib.contextmanager
def engine_step(step: str) -> Iterator[None]:
    """Name the step of a check that runs the engine's code before the step under test (``"cache write"``:
    the cached tokens written through the engine's own write path): an exception raised inside carries it,
    so a finding says where it went wrong, not the decode or verify the check was building up to."""
    try:
        yield
    except BaseException as exc:
        if getattr(exc, STEP_ATTRIBUTE, None) is None:
            try:
                setattr(exc, STEP_ATTRIBUTE, step)
            except (AttributeError, TypeError):  # an exception type that takes no attributes keeps no step
                pass
        raise


def step_of_exception(exc: BaseException) -> str | None:
    """The step ``engine_step`` named on ``exc``; None: the step under test (decode or verify)."""
    step = getattr(exc, STEP_ATTRIBUTE, None)
    return step if isinstance(step, str) else None


class BackendRaised(Exception):
    """The engine's own code raised while computing an accepted configuration: a finding."""

    def __init__(self, error: str, text: str, function: str | None, rank: int | None = None,
                 frames: tuple[str, ...] = (), step: str | None = None) -> None:
        self.error = error
        self.text = text
        self.function = function
        self.rank = rank
        self.frames = tuple(frames)  # the engine's frames, outermost first (``engine_frames_of``)
        self.step = step  # the check's step it raised in (``engine_step``); None: the step under test
        where = f" in {function}" if function else ""
        super().__init__(f"{error}: {text}{where}")

    @classmethod
    def from_exception(cls, exc: BaseException, package: str | None, rank: int | None = None) -> "BackendRaised":
        return cls(type(exc).__name__, str(exc), engine_function_of(exc, package), rank,
                   engine_frames_of(exc, package), step_of_exception(exc))


class EngineCannotRun(Exception):
    """The engine's own path for this case runs code this host cannot run (a GPU-only kernel).

    Not a finding and not an error: the check is ``not-run`` with this text as
    the reason. A runner raises it only after the engine's own code decided
    the path (e.g. its metadata builder sent the rows to a CUDA-only kernel).
    """


def engine_function_of(exc: BaseException, package: str | None) -> str | None:
    """``module:qualname`` of the innermost traceback frame inside ``package``; None if none is."""
    if not package:
        return None
    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if module == package or module.startswith(package + "."):
            found = f"{module}:{frame.f_code.co_qualname}"
    return found


def engine_frames_of(exc: BaseException, package: str | None) -> tuple[str, ...]:
    """The traceback's frames inside ``package``, outermost first: ``module:qualname (line N)``."""
    if not package:
        return ()
    frames = []
    for frame, line in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if module == package or module.startswith(package + "."):
            frames.append(f"{module}:{frame.f_code.co_qualname} (line {line})")
    return tuple(frames)
