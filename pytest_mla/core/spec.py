"""Speculative-decoding settings as matrix axis values.

``none``           one query token per request.
``eagle-1xK``      chain (topk 1) of K draft tokens: K + 1 query tokens, causal.
``eagle-TxK``      tree (topk T > 1, depth K): 1 + T*K query tokens, tree mask.
``eagle3-…``       same shapes, EAGLE-3 drafting.
``mtp-K``/``nextn-K`` multi-token prediction: the chain form, K draft tokens.
"""

from __future__ import annotations

import dataclasses
import re

_EAGLE = re.compile(r"^(eagle3?)-(\d+)x(\d+)$")
_MTP = re.compile(r"^(mtp|nextn)-(\d+)$")


class SpecError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class SpecSetting:
    name: str
    algorithm: str | None  # None, "eagle", "eagle3", "mtp", "nextn"
    topk: int  # branches per draft step (1 = chain)
    steps: int  # draft depth

    @property
    def enabled(self) -> bool:
        return self.algorithm is not None

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def num_draft_tokens(self) -> int:
        """Tokens verified per request, the accepted token included (= s_q)."""
        return 1 + self.topk * self.steps

    @property
    def s_q(self) -> int:
        return self.num_draft_tokens if self.enabled else 1


def parse_spec(text: str) -> SpecSetting:
    """Parse ``none``, ``eagle-TxK``, ``eagle3-TxK``, ``mtp-K`` or ``nextn-K``."""
    if not isinstance(text, str):
        raise SpecError(f"spec setting must be a string, got {text!r}")
    if text == "none":
        return SpecSetting("none", None, 1, 0)
    if m := _EAGLE.match(text):
        topk, steps = int(m.group(2)), int(m.group(3))
        if topk < 1 or steps < 1:
            raise SpecError(f"spec setting {text!r}: topk and steps must be >= 1")
        return SpecSetting(text, m.group(1), topk, steps)
    if m := _MTP.match(text):
        steps = int(m.group(2))
        if steps < 1:
            raise SpecError(f"spec setting {text!r}: steps must be >= 1")
        return SpecSetting(text, m.group(1), 1, steps)
    raise SpecError(
        f"unknown spec setting {text!r} (expected none, eagle-TxK, eagle3-TxK, mtp-K or nextn-K)"
    )
