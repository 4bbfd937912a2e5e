"""What every emulation shares: the out-of-contract error, index checks, the paged gather, float64 attention.

Conventions of this module (each emulation states its library's own in its
module docstring):

* Everything is computed in float64 from the values *as the kernel reads
  them*: an fp8 tensor is ``x.to(float64) * descale`` with the descale the
  caller passed, nothing else.
* ``attend`` returns the **natural-log** LSE of the scaled scores; a query row
  that sees no key gets ``out = 0`` and ``lse = -inf`` here, and each
  emulation maps that to its library's own convention (FlashMLA writes
  ``+inf``, FA3 ``-inf``, ...). ``to_base2`` converts where a kernel reports
  base 2.
* An index the kernel would follow (a page id in a block table or a CSR page
  list) must lie in ``[0, num_pages)``; otherwise :func:`check_index_range`
  raises :class:`OutOfRangeRead` — a GPU would read another request's
  rows or unmapped memory, which no emulation can reproduce: the caller's bug.
* Errors: an argument the emulated library rejects in its own Python wrapper
  (an ``assert``, a ``ValueError``) is raised with the library's exception type
  where the emulation re-implements that wrapper; everything a kernel would
  refuse or that the emulation does not model — a layout, dtype, flag or index
  outside the contract — raises :class:`OutOfContractError` naming the flag.
  The two never mix: a driver turns ``OutOfContractError`` into a ``not-run``
  cell, while any other exception (``OutOfRangeRead`` included) is the
  engine's (its call broke the library's contract) and so a finding.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = [
    "LN2",
    "OutOfContractError",
    "OutOfRangeRead",
    "as_float64",
    "attend",
    "bottom_right_visible",
    "check_dtype",
    "check_index_range",
    "gather_pages",
    "to_base2",
    "write_out",
]

LN2 = math.log(2.0)


class _FlagError(Exception):
    """An emulation's error about one argument (``flag``); prints as ``flag: message`` on one line."""

    def __init__(self, flag: str, message: str) -> None:
        self.flag = flag
        self.message = " ".join(str(message).split())
        super().__init__(f"{flag}: {self.message}")


class OutOfContractError(_FlagError):
    """An emulation was asked for a case outside the contract it models: the emulation's limit,
    not the caller's bug (a driver reports the cell ``not-run``)."""


class OutOfRangeRead(_FlagError):
    """The caller handed the kernel an index it would follow outside the cache: on a GPU it reads
    another request's rows or unmapped memory. The opposite of ``OutOfContractError``: the
    caller's bug, not a case the emulation does not model (a driver reports it as the engine's
    finding). Not a subclass of it, so that ``except OutOfContractError`` never takes a finding."""


def check_dtype(flag: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """Raise unless ``tensor.dtype`` is one of ``allowed``."""
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise OutOfContractError(flag, f"dtype {str(tensor.dtype).removeprefix('torch.')} is not modelled (expects {names})")


def check_index_range(flag: str, indices: torch.Tensor, upper: int, *, access: str = "read") -> None:
    """Raise if any index lies outside ``[0, upper)``: the kernel would ``access`` (read, write) memory no emulation can."""
    if indices.numel() == 0:
        return
    idx = indices.to(torch.int64)
    bad = (idx < 0) | (idx >= upper)
    if bool(bad.any()):
        where = int(bad.nonzero()[0].item()) if idx.dim() == 1 else tuple(int(v) for v in bad.nonzero()[0])
        value = int(idx.flatten()[bad.flatten().nonzero()[0]].item())
        raise OutOfRangeRead(flag, f"index {value} at {where} is outside [0, {upper}): the kernel would {access} "
                                       "unmapped or foreign rows")


def as_float64(x: torch.Tensor, descale: float | torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as the kernel reads it, in float64: ``x * descale`` (a scalar or a broadcastable tensor)."""
    y = x.detach().to("cpu", torch.float64)
    if descale is None:
        return y
    if isinstance(descale, torch.Tensor):
        return y * descale.detach().to("cpu", torch.float64)
    return y * float(descale)


def gather_pages(cache: torch.Tensor, pages: torch.Tensor, num_tokens: int, *, flag: str) -> torch.Tensor:
    """The first ``num_tokens`` rows of a request from a paged ``[num_pages, page_size, ...]`` cache.

    ``pages`` lists the request's page ids in order; only the pages holding the
    first ``num_tokens`` tokens are read, and each must be a valid page id
    (``flag`` names the argument in the error).
    """
    page_size = cache.shape[1]
    needed = -(-num_tokens // page_size)
    if pages.numel() < needed:
        raise OutOfContractError(flag, f"{num_tokens} tokens need {needed} pages of {page_size}, "
                                       f"only {pages.numel()} given")
    used = pages[:needed].to("cpu", torch.int64)
    check_index_range(flag, used, cache.shape[0])
    rows = cache[used.to(cache.device)]  # [needed, page_size, ...]
    return rows.reshape(needed * page_size, *cache.shape[2:])[:num_tokens]


def bottom_right_visible(
    q_len: int,
    key_pos: torch.Tensor,  # [n] int64 position of each key in the request's (global) sequence
    seq_len: int,  # tokens of the request; query i sits at position seq_len - q_len + i
    *,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
) -> torch.Tensor:
    """Which keys each query sees, ``[q_len, n]`` bool, with the causal mask aligned bottom-right.

    Query ``i`` sits at ``seq_len - q_len + i``; causal: key position ``p`` is
    visible iff ``p <= seq_len - q_len + i``. ``window = (left, right)``, ``-1``
    for unbounded, as flash-attention defines it: ``p`` in ``[i + seq_len -
    q_len - left, i + seq_len - q_len + right]``.
    """
    q_pos = seq_len - q_len + torch.arange(q_len, dtype=torch.int64)[:, None]  # [q_len, 1]
    p = key_pos.to(torch.int64)[None, :]  # [1, n]
    visible = torch.ones(q_len, key_pos.numel(), dtype=torch.bool)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        visible &= p <= q_pos + right
    if left >= 0:
        visible &= p >= q_pos - left
    return visible


def attend(
    scores: torch.Tensor,  # [h_q, q_len, n] float64, already scaled
    v: torch.Tensor,  # [n, h_q, d_v] float64 (KV heads already repeated to h_q)
    visible: torch.Tensor,  # [q_len, n] or [h_q, q_len, n] bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention in float64: ``(out [q_len, h_q, d_v], lse [h_q, q_len])``, natural log.

    Rows that see no key get ``out = 0`` and ``lse = -inf``; masked keys never
    enter the sum, so a NaN in a masked key's row cannot leak in.
    """
    if visible.dim() == 2:
        visible = visible[None].expand_as(scores)
    masked = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(masked, dim=-1)  # [h_q, q_len]
    empty = torch.isneginf(lse)
    probs = torch.exp(masked - torch.where(empty, 0.0, lse)[..., None])  # exactly 0 where masked
    v_safe = torch.where(visible.any(dim=(0, 1))[:, None, None], v, 0.0)  # keys nobody sees may be NaN
    out = torch.einsum("hqn,nhd->qhd", probs, v_safe)
    return out, lse


def to_base2(lse: torch.Tensor) -> torch.Tensor:
    """A natural-log LSE in base 2 (``log2 Σ 2^(s·log2 e)`` = ``lse / ln 2``); ±inf stay ±inf."""
    return lse / LN2


def write_out(result: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype, device) -> torch.Tensor:
    """``result`` (float64) in ``dtype`` on ``device``; copied into ``out`` (the caller's buffer) when given."""
    value = result.to(dtype).to(device)
    if out is None:
        return value
    if tuple(out.shape) != tuple(result.shape):
        raise OutOfContractError("out", f"shape {tuple(out.shape)} differs from the kernel's {tuple(result.shape)}")
    if out.dtype != dtype:
        raise OutOfContractError("out", f"dtype {out.dtype} differs from the kernel's output dtype {dtype}")
    out.copy_(value)
    return out
