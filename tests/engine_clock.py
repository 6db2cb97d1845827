"""A deterministic clock for engine tests on the `adaspark` arm.

The scheduler chooses widths from measured times (verify seconds and the fixed cost D of each
round), so on the real clock a test's outcome would depend on the machine's load. Inside
``deterministic_clock()`` every ``time.perf_counter()`` read advances a fake clock by
HOST_TICK_S, and every ``LlamaBackend.verify`` reports (and advances the clock by) a fixed cost
model of its rows and context. The model's outputs are real; what the scheduler sees of time is a
pure function of the rounds it ran, so the widths it chooses, and the test's outcome, are too.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Sequence

import pytest

from adaspark_app.engine.backend import LlamaBackend, VerifyOutput

HOST_TICK_S = 2e-5  # per clock read: the host's own work between two reads
ONE_ROW_S = 0.010  # a one-row step at an empty context (SmolLM2 here: ~10 ms)
ROW_STEPS = 0.35  # each further row, in one-row steps (with the Q4_1 kernels 8 rows cost ~3.4 steps)
CONTEXT_DOUBLING = 4000  # cached tokens at which attention has doubled a step's cost


def verify_seconds(rows: int, context: int) -> float:
    """The cost model the fake clock charges for one verify of `rows` rows at `context` tokens."""
    return ONE_ROW_S * (1.0 + context / CONTEXT_DOUBLING) * (1.0 + ROW_STEPS * (rows - 1))


@contextlib.contextmanager
def deterministic_clock() -> Iterator[None]:
    """Run the enclosed engine work on the fake clock (see the module docstring)."""
    now = [1000.0]

    def perf_counter() -> float:
        now[0] += HOST_TICK_S
        return now[0]

    real_verify = LlamaBackend.verify

    def verify(self: LlamaBackend, tokens: Sequence[int], positions: Sequence[int],
               seq_ids: Sequence[Sequence[int]], argmax: bool = True,
               while_computing: Callable[[], None] | None = None) -> VerifyOutput:
        out = real_verify(self, tokens, positions, seq_ids, argmax=argmax, while_computing=while_computing)
        seconds = verify_seconds(len(tokens), min(positions))
        now[0] += seconds
        return VerifyOutput(out.argmax, seconds)

    with pytest.MonkeyPatch.context() as mp:
        # time.perf_counter itself: the engine reads the clock in several modules, always as
        # time.perf_counter(), and nothing else in these tests reads it while the engine runs.
        mp.setattr(time, "perf_counter", perf_counter)
        mp.setattr(LlamaBackend, "verify", verify)
        yield
