"""Every scheduler constant of Appendix B (Table 14), under its paper name, with why.

"hand" in the paper means chosen once from what the quantity means; "dev" means chosen by
comparing a few values on the development corpus. Values are used unchanged on every target.
Width 1 (a plain one-token step) is added to the paper's starting ladder: on a CPU it is often
the best width (shared/DESIGN.md).
"""

from __future__ import annotations

# --- cost model (§3.2) -------------------------------------------------------------------
TAU_QUANTILE: float = 0.15  # quantile of the law (Eq. 4): recovers the free time if >15% of rounds run free (Prop. 3)
CONTEXT_UNIT: int = 8192  # u = c / CONTEXT_UNIT keeps the basis phi(u) of Eq. (4) near [0, 1]
LAMBDA1: float = 0.002  # elastic-net L1 on the normalised time: lets unused basis terms go to zero
LAMBDA2: float = 0.01  # elastic-net L2: keeps weight shared among near-collinear basis terms over a short run
FTRL_ALPHA: float = 0.05  # FTRL-Proximal learning rate of the law
FTRL_BETA: float = 1.0  # FTRL-Proximal stabiliser
SQGRAD_CAP: float = 400.0  # cap on accumulated squared gradients: floors the rate so the law follows a drifting machine
BANK_PER_BAND: int = 16  # newest samples kept per context bit-length band, for the end-of-request refit
HELDOUT_FRACTION: float = 0.25  # refit judged on the newest quarter of each band ...
HELDOUT_SMALL_BAND: int = 4  # ... or on all of a band with fewer than this many samples
LAW_CLAMP: tuple[float, float] = (0.5, 3.0)  # fitted law bounded to this multiple of the class's lowest time
LEVEL_WINDOW: int = 8  # level = min over the class's last 8 verifies of measured / law
LEVEL_CLAMP: tuple[float, float] = (0.5, 2.0)  # the level never moves the price beyond these factors
MEASUREMENTS_BEFORE_PRICED: int = 3  # a width is measured until it has 3 measurements (cold start / new split)
SAMPLES_BEFORE_LAW: int = 3  # before a law has 3 samples the price is the lowest measured time
LADDER: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # starting width table; width 1 ADDED to the paper's ladder
HOLD_ROUNDS_BEFORE_SPLIT: int = 8  # chooser must hold a width this long before a class is split
STEEP_RISE: float = 0.25  # class top >25% dearer than its bottom: split next to the held width, else midpoint
MAX_WIDTHS: int = 24  # at most 24 widths learned

# --- width choice (§3.4) -----------------------------------------------------------------
RATE_HALF_LIFE: float = 64.0  # long-run rate rho_m: tokens and time decayed with this half-life (rounds)
BAND_MIN_ROUNDS: int = 8  # until a band holds 8 rounds the chooser uses the per-round ratio
GAIN_CLAMP: tuple[float, float] = (0.25, 4.0)  # gains g_d, g_n clamped here (also makes Prop. 2 hold)
GAIN_RIDGE: float = 0.02  # ridge toward 1: weight 0.02 times each regressor's sum of squares
N0: int = 8  # reference width n0 of Eq. (7): the marginal is measured from 8 rows
RATIO_MARGIN: float = 0.04  # before rho_m is known an alternative's ratio must be 4% higher
HYSTERESIS: float = 0.04  # once rho_m is known: alternative's V must beat incumbent's by 0.04 x its expected tokens

# --- acceptance model (§3.3) -------------------------------------------------------------
ACC_FTRL_ALPHA: float = 0.05  # drafter and depth/context terms: FTRL rate
ACC_FTRL_BETA: float = 1.0  # ... stabiliser
ACC_L2: float = 0.01  # ... L2
NGRAM_BUCKET_ALPHA: float = 0.5  # n-gram bucket FTRL rate: buckets are few and must move quickly
PRIOR_GATE: float = 3.0  # leave the prior only once the evidence exceeds PRIOR_GATE * sqrt(m) after m updates
ACC_SQGRAD_CAP: float = 400.0  # squared-gradient cap of the acceptance model (rate floor)
REQ_INTERCEPT_RATE: float = 0.15  # per-request intercept: AdaGrad rate
REQ_INTERCEPT_BAND: float = 2.0  # per-request intercept confined to +-2 (logit)
REQ_INTERCEPT_SQGRAD_CAP: float = 16.0  # per-request intercept squared-gradient cap
GUARD_HALF_LIFE: float = 256.0  # guard between fitted model and head estimate: half-life in labelled parents
HEAD_OFFSET_RATE: float = 0.15  # head-based estimate's per-request offset: AdaGrad rate
HEAD_OFFSET_BAND: float = 2.0  # ... confined to +-2

# --- n-gram fill (§3.3) ------------------------------------------------------------------
NGRAM_FOLLOWER_CONTEXT: int = 3  # follower context when no earlier passage continues: last 3 tokens
NGRAM_MAX_DEPTH: int = 32  # n-gram chains stop 32 tokens below the anchor
EXPLORATION_PERIOD: int = 16  # every 16th tree round with n-gram candidates explores the least-labelled bucket

# --- drafter (§2.2) ----------------------------------------------------------------------
TOP_K: int = 8  # candidates kept per drafter position (pick + K-1 siblings)
