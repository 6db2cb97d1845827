"""The debug self-check of a verified round (``--self-check``, and every engine test).

Lossless means each emitted token is the target's own choice for exactly the emitted prefix. The
check reads it off the verify: for each committed row, the row's ancestry in the tree must be the
committed path up to it, and the target's token of that row (its argmax, or its draw when
sampling) must be the token emitted next.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .tree import Candidates, TreeLayout


class SelfCheckError(AssertionError):
    """The debug self-check found an emitted token that is not the target's argmax for its prefix."""


def check_rows(lay: TreeLayout, cands: Candidates, targets: np.ndarray, rows: Sequence[int],
               path_tokens: list[int], bonus: int, anchor_pos: int) -> int:
    """Check every committed row (see the module docstring); returns how many rows were checked.
    Raises SelfCheckError at the first row that breaks the rule."""
    emitted = path_tokens + [bonus]
    for i, r in enumerate(rows):
        anc = []
        j = lay.nodes[r]
        while j >= 0:
            anc.append(cands.token[j])
            j = cands.parent[j]
        anc.reverse()
        if anc != path_tokens[:i] or lay.depth[r] != i:
            raise SelfCheckError(f"row {r} holds prefix {anc} at depth {lay.depth[r]}, expected {path_tokens[:i]}")
        if int(targets[r]) != emitted[i]:
            raise SelfCheckError(f"emitted token {emitted[i]} at position {anchor_pos + i + 1} is not "
                                 f"the target's token {int(targets[r])} of its row (argmax, or draw)")
    return len(rows)
