"""Which kernels take a plain one-row step: AdaSpark's or ggml's vec_dot, whichever is faster here.

AdaSpark's patched library multiplies a one-row step's weights with its own kernels (the ones a
verify of many rows uses, see native/build.py) or leaves them to ggml's ``vec_dot``; each kernel
sums exactly as vec_dot does, so the choice changes the step's time and never a bit of its
output. Which is faster depends on the CPU: on an Intel Xeon (AVX-512) AdaSpark's K-quant and Q0
one-row products cost 0.74x and 0.75x vec_dot's, on an AMD EPYC with AVX-512 1.1-1.4x (s29), and
on an AMD EPYC with AVX2 only a Qwen2.5-1.5B one-row step took about 1.7x the stock libraries'
(benchmarks/results/kernels/attention/qwen1.5b-avx2.md, separate processes). Those EPYC figures were
the kernels' 4- and 8-row one-row tiles, short streams the hardware prefetcher missed; reading the
rows in memory order (session 33) brought them to 0.84-1.10x vec_dot's time on four models on an AMD
EPYC (Zen 4) (benchmarks/results/kernels/one-row-zen4.md) and 0.88-1.09x with its AVX2 build
(git show 982f0c2:benchmarks/results/real-targets/s33/one-row-haswell-on-zen4.md): either may be faster by a few percent. So the backend learns it
while it serves, as the scheduler learns its verify costs: after WARMUP_STEPS uncounted steps its
one-row steps alternate the two settings in blocks (ABBA order, so drift hits both alike), and
once every block has run AdaSpark's kernels stay unless vec_dot is faster by more than MARGIN
overall and in every ABBA quad of the trial. The warm-up and the quads are there because
a wrong verdict costs every later step (up to 18% on Qwen2.5-1.5B): the first steps after a load
run slow, and they fell in the trial's first block (AdaSpark's), and one busy spell of the machine
could land in one setting's blocks; either chose vec_dot where AdaSpark's kernels were 5-13% faster
(1 of 6 trials on the 1.5B; benchmark arms whose plain steps should match then differed by ~10%).

The verdict belongs to the model and the machine, not to one engine: every engine of one model file
at one thread count in a process shares one trial (``chooser_for``). A benchmark's arms each hold an
engine of the same model, and with a trial each they came to different verdicts where the two
settings are within a few percent (Qwen-0.5B on Zen 4: ``ar`` and ``adaspark`` on AdaSpark's
kernels, both pinned widths on vec_dot, s33b), so the arms' plain steps differed for no reason of
their own.

A second trial, where AdaSpark's kernels won the first and the library has the switch: the same
kernels with the Q0 family's one-row products in tiles of 8 weight rows (``wide``, bit 8 of the
switch; the same bits again). Which tiles read faster is the CPU's too: on an Intel Xeon (family 6
model 207) Qwen2.5-Coder-0.5B's one-row step took 0.771x [0.766, 0.777] the time with them
(its weights are mostly Q5_0 and Q8_0), where on an AMD EPYC (Zen 4) 8 rows at once had cost 1.5x
vec_dot. The wide tiles stay only if faster by MARGIN overall and in every ABBA quad.

``ADASPARK_ONE_ROW=ours``, ``=vec_dot`` or ``=wide`` fixes the choice (benchmarks, tests); the
default learns.
"""

from __future__ import annotations

import os
import statistics

from ..errors import ConfigError
from ..learn.constants import ONE_ROW_BLOCK_STEPS, ONE_ROW_MARGIN, ONE_ROW_TRIAL_BLOCKS, ONE_ROW_WARMUP_STEPS

ONE_ROW_ENV = "ADASPARK_ONE_ROW"
# The trial's knobs (learn/constants.py): uncounted warm-up steps (the first after a model load run
# slow and would count against the setting tried first), steps per block, blocks (ABBA quads), and
# how much faster vec_dot must be.
WARMUP_STEPS = ONE_ROW_WARMUP_STEPS
BLOCK_STEPS = ONE_ROW_BLOCK_STEPS
TRIAL_BLOCKS = ONE_ROW_TRIAL_BLOCKS
MARGIN = ONE_ROW_MARGIN
OURS, VEC_DOT, WIDE = "ours", "vec_dot", "wide"
SETTINGS = (OURS, VEC_DOT, WIDE)


def block_setting(k: int, rival: str = VEC_DOT) -> str:
    """The setting of the trial's k-th block: A B B A A B B A ... (A AdaSpark's kernels, B the
    setting tried against them), so a drift hits both alike."""
    return OURS if ((k + 1) // 2) % 2 == 0 else rival


class OneRowChooser:
    """The trial and its verdict, for one model in one process. ``setting()`` is the setting of the
    next one-row step; ``record(seconds)`` gives its time. Pure: the backend applies the setting."""

    def __init__(self, fixed: str | None = None, block_steps: int = BLOCK_STEPS,
                 trial_blocks: int = TRIAL_BLOCKS, margin: float = MARGIN,
                 warmup_steps: int = WARMUP_STEPS, wide: bool = False) -> None:
        if fixed not in (None, *SETTINGS):
            raise ValueError(f"one-row setting must be one of {', '.join(SETTINGS)}, not {fixed!r}")
        if block_steps < 1 or trial_blocks < 4 or trial_blocks % 4 or warmup_steps < 0:
            raise ValueError("the trial needs whole ABBA quads (4, 8, ... blocks) of 1+ steps")
        self.block_steps, self.trial_blocks, self.margin = block_steps, trial_blocks, margin
        self._warmup = warmup_steps  # steps still to run before the trial
        self.chosen: str | None = fixed
        self._blocks: list[tuple[str, float]] = []  # (setting, median seconds) per finished block
        self._current: list[float] = []
        self.ratio: float | None = None  # vec_dot's median over ours once decided by the trial
        self.wide = wide  # whether the wide tiles get their trial once AdaSpark's kernels have won
        self.rival = VEC_DOT  # the setting the running trial tries against AdaSpark's kernels
        self.wide_ratio: float | None = None  # the wide tiles' median over ours, after their trial

    @classmethod
    def from_env(cls) -> "OneRowChooser":
        value = os.environ.get(ONE_ROW_ENV, "").strip().lower() or "learn"
        if value not in ("learn", *SETTINGS):
            raise ConfigError(f"{ONE_ROW_ENV}={value!r}: give {OURS}, {VEC_DOT}, {WIDE} or learn")
        return cls(fixed=None if value == "learn" else value)

    def setting(self) -> str:
        if self.chosen is not None:
            return self.chosen
        if self._warmup:
            return OURS
        return block_setting(len(self._blocks), self.rival)

    def record(self, seconds: float) -> None:
        if self.chosen is not None:
            return
        if self._warmup:
            self._warmup -= 1
            return
        self._current.append(seconds)
        if len(self._current) < self.block_steps:
            return
        self._blocks.append((block_setting(len(self._blocks), self.rival), statistics.median(self._current)))
        self._current = []
        if len(self._blocks) < self.trial_blocks:
            return
        ours = statistics.median(t for s, t in self._blocks if s == OURS)
        rival = statistics.median(t for s, t in self._blocks if s == self.rival)
        ratio = rival / ours if ours > 0 else 1.0
        wins = ratio < 1.0 - self.margin and self._every_quad_prefers_the_rival()
        if self.rival == WIDE:
            self.wide_ratio = ratio
            self.chosen = WIDE if wins else OURS
            return
        self.ratio = ratio
        if wins:
            self.chosen = VEC_DOT
        elif self.wide:  # AdaSpark's kernels stay: now their wide tiles against them
            self.rival, self._blocks = WIDE, []
        else:
            self.chosen = OURS

    def _every_quad_prefers_the_rival(self) -> bool:
        """Whether the rival's two blocks beat AdaSpark's two by the margin in each ABBA quad."""
        for q in range(0, len(self._blocks), 4):
            quad = self._blocks[q:q + 4]
            if sum(t for s, t in quad if s == self.rival) >= (1.0 - self.margin) * sum(t for s, t in quad if s == OURS):
                return False
        return True

    def describe(self) -> str:
        """For reports: the verdict (and the trial's ratio), or that the trial is running."""
        if self.chosen is None:
            trial = "" if self.rival == VEC_DOT else f"{self.rival}, "
            return f"learning ({trial}{len(self._blocks)}/{self.trial_blocks} blocks)"
        if self.ratio is None:
            return f"{self.chosen} (fixed by {ONE_ROW_ENV})"
        wide = f", {WIDE}/ours {self.wide_ratio:.3f}" if self.wide_ratio is not None else ""
        return f"{self.chosen} (vec_dot/ours {self.ratio:.3f}{wide})"


_SHARED: dict[tuple[str, int], OneRowChooser] = {}


def chooser_for(model_path: str, n_threads: int, wide: bool = False) -> OneRowChooser:
    """The process's one trial for this model file at this thread count (a fixed setting from
    ``ADASPARK_ONE_ROW`` is read anew for each engine and never shared). ``wide``: the library
    has the wide tiles' switch, so they get their trial."""
    chooser = OneRowChooser.from_env()
    if chooser.chosen is not None:
        return chooser
    chooser.wide = wide
    return _SHARED.setdefault((os.path.realpath(model_path), int(n_threads)), chooser)
