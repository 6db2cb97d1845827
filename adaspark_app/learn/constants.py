"""Every scheduler constant of Appendix B (Table 14), under its paper name, with why; and every
other knob of the width decision, the learned state's bands and the plain step's kernel trial.

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
NEAR_FACTOR: float = 1.5  # ADDED (the panel only): a price counts as measured up to this multiple of the highest context its width ran at
LEVEL_WINDOW: int = 8  # level = min over the class's last 8 verifies of measured / law
LEVEL_CLAMP: tuple[float, float] = (0.5, 2.0)  # the level never moves the price beyond these factors
MEASUREMENTS_BEFORE_PRICED: int = 3  # the plain step (width 1) is timed 3 times before it is priced; wider widths: CONDITIONAL_MEASUREMENTS
SAMPLES_BEFORE_LAW: int = 3  # before a law has 3 samples the price is the lowest measured time
MAX_WIDTH: int = 64  # widest verify: the ladder's top, pinned:N's bound, one KV sequence per leaf (engine/limits.N_SEQ_MAX)
LADDER: tuple[int, ...] = (1, 2, 4, 8, 16, 32, MAX_WIDTH)  # starting width table; width 1 ADDED to the paper's ladder
HOLD_ROUNDS_BEFORE_SPLIT: int = 8  # chooser must hold a width this long before a class is split
STEEP_RISE: float = 0.25  # class top >25% dearer than its bottom: split next to the held width, else midpoint
MAX_WIDTHS: int = 24  # at most 24 widths learned
# Not in Table 14 (chosen by hand):
REFIT_ITERATIONS: int = 60  # iterations of the refit's solver (iteratively reweighted least squares on Eq. 4)
REFIT_EPS: float = 1e-5  # residual floor of the reweighting, in units of the class scale
REACH_PATIENCE: int = 8  # rounds before a pending width wider than every tree seen teaches the table its reach
SPLIT_PATIENCE: int = 512  # rounds a split width may wait for a round where it could win before it is dropped
COLD_ALWAYS_BELOW: int = 16  # DEVIATION: ladder widths from this up whose bound passes COLD_RISK_STEPS are offered unmeasured at an upper bound (T(a) n / a) until a round verifies one; the others are measured where they could win at a lower bound
COLD_RISK_STEPS: float = 5.0  # DEVIATION: a wide cold width whose upper-bound price exceeds this many plain steps waits at that bound (about a cold 8-row verify on the dearest CPU curve measured, SmolLM2 on the Xeon: 5.2)
DOUBT_SLACK: float = 1.25  # DEVIATION: a priced width whose lowest time passes T(a) n / a of a narrower priced width a by this factor (SmolLM2's attention-bound 32 -> 64 rows passed it by 3%), or the lowest time of a wider width by this factor (3 and 5 rows cost up to 16% more than 4 and 8 on this CPU's kernels), is measured again where it could win until its level window is full (cost.in_doubt)
CONDITIONAL_MEASUREMENTS: int = 1  # DEVIATION: every width above 1 is verified only where it could (cold, split) or did (wide ladder, at its bound) win, and is priced after 1
ROOFLINE_SLOPE_SHARE: float = 0.5  # DEVIATION: a narrow cold width's lower-bound price rises by half the per-row slope of the two widest priced widths below it
PENDING_STALL: int = 64  # rounds a width may wait for a tree wide enough before it stops forcing drafting
FIXED_EMA_WEIGHT: float = 0.2  # weight of the newest round in the running D that prices a drafted round before it is timed

# --- width choice (§3.4) -----------------------------------------------------------------
RATE_HALF_LIFE: float = 64.0  # long-run rate rho_m: tokens and time decayed with this half-life (rounds)
BAND_MIN_ROUNDS: int = 8  # until a band holds 8 rounds the chooser uses the per-round ratio
GAIN_CLAMP: tuple[float, float] = (0.25, 4.0)  # gains g_d, g_n clamped here (also makes Prop. 2 hold)
GAIN_RIDGE: float = 0.02  # ridge toward 1: weight 0.02 times each regressor's sum of squares
N0: int = 8  # reference width n0 of Eq. (7): the marginal is measured from 8 rows
RATIO_MARGIN: float = 0.04  # before rho_m is known an alternative's ratio must be 4% higher
HYSTERESIS: float = 0.04  # once rho_m is known: alternative's V must beat incumbent's by 0.04 x its expected tokens
PRESSURE_ALLOWANCE: float = 0.25  # ADDED: CUSUM allowance per round, as a share of the margin (chooser.py)
GAIN_EVIDENCE_Z: float = 3.0  # a gain leaves 1 by min(1, (|Z| / 3)^2) of its fitted correction (gains.py)
GAIN_HALF_LIFE: float = 128.0  # rounds: evidence of a gain fades, so a gain that locked the chooser away drifts back to 1

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
# Not in Table 14 (chosen by hand):
ACC_CONTEXT_UNIT: float = 1024.0  # psi's context feature log2(1 + c/1024) - 1: -1 at c = 0, 0 at 1k, 1 at 3k, 2 at 7k tokens
ACC_DEPTH_MAX: int = 16  # drafter depth weights for depths 2..16; deeper shares the last (blocks are 7-9 here)
EVIDENCE_EDGES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # n-gram evidence bins: 1, 2-3, 4-7, 8-15, 16-31, 32+
ABOVE_EDGES: tuple[int, ...] = (0, 1, 2, 4, 8, 16)  # n-gram nodes above a node: 0, 1, 2-3, 4-7, 8-15, 16+

# --- n-gram fill (§3.3) ------------------------------------------------------------------
NGRAM_FOLLOWER_CONTEXT: int = 3  # follower context when no earlier passage continues: last 3 tokens
NGRAM_MAX_DEPTH: int = 32  # n-gram chains stop 32 tokens below the anchor
EXPLORATION_PERIOD: int = 16  # every 16th tree round with n-gram candidates explores the least-labelled bucket
# Not in Table 14 (chosen by hand):
COPY_CONTEXT_LADDER: tuple[int, ...] = (4, 5, 6, 8, 12, 16, 24, 32)  # context lengths with a position map (ngram.py)
COPY_EVIDENCE_CAP: int = NGRAM_MAX_DEPTH  # a copy's matched length is capped here: beyond 32 tokens it is as certain as the buckets say
CLASS_PRIOR_WEIGHT: float = 16.0  # pseudo-trials shrinking a sparse proposal class's precision toward its bin (precision.py)
PRECISION_HALF_LIFE: float = 1024.0  # counted tokens: p_src follows the last few replies' text, not the store's lifetime

# --- long copies (ADDED: llama.cpp's ngram-mod rule, engine/ngram.py; learn/width.py) ----------
LONG_COPY_MATCH: int = 24  # ngram-mod's n_match: a copy matched on 24+ tokens may be drafted whole
LONG_COPY_MIN: int = 48  # ngram-mod's n_min: ... when its passage runs on 48+ more tokens
LONG_COPY_DEPTH: int = MAX_WIDTH - 1  # ... up to 63 tokens, so the verify (anchor + chain) fits the widest batch
LONG_COPY_CONFIRM: int = 32  # the floor needs the rounds before to have accepted 32+ draft tokens whole in a row (24 cost up to 5 points of the oracle's share on Qwen-0.5B pastes, 32 lost nothing)

# --- gates (ADDED: not in the paper; learn/gates.py) ---------------------------------------------
GATE_HALF_LIFE: float = 16.0  # drafted rounds: memory of the draft gate's advantage and D sums
GATE_MIN_ROUNDS: int = 4  # drafted rounds seen before the draft gate may skip drafting
GATE_MAX_BACKOFF: int = 7  # longest skip: 2^7 = 128 plain rounds between probes
DRAFTER_MIN_ROUNDS: int = 4  # rounds of each kind (with / without the drafter) before the drafter gate compares them
DRAFTER_HALF_LIFE: float = 32.0  # rounds of each kind: memory of the drafter gate's means
DRAFTER_RECHECK: int = 16  # while the drafter wins, every 16th round runs without it
DRAFTER_MAX_BACKOFF: int = 8  # longest stretch without the drafter between its probes: 2^8 rounds
DRAFTER_SE_MARGIN: float = 1.0  # standard errors the drafter's mean must clear to be kept
PROBE_COPY_EDGES: tuple[int, ...] = (4, 8, 16, 32)  # probe classes of a copy by matched length: 4-7, 8-15, 16-31, 32+

# --- drafter (§2.2) ----------------------------------------------------------------------
TOP_K: int = 8  # candidates kept per drafter position (pick + K-1 siblings); engine/dspark.py drafts these
# Not in Table 14: each drafted row costs about an eighth of a target step on this CPU, and the shipped
# drafter's rows past the fourth are accepted in under 0.5% of blocks (tools/train_drafter, held out).
TREE_DRAFT_ROWS: int = 4  # drafted positions a tree round asks the drafter for

# --- learned state by temperature (ADDED; learn/learned_state.py) --------------------------
TEMPERATURE_BAND_EDGES: tuple[float, ...] = (0.0, 0.5, 0.9)  # band b: edges[b-1] < T <= edges[b], the last open; acceptance at T = 0.3 is close to greedy's, at 1.0 much lower

# --- the plain step's kernels (ADDED; engine/one_row.py) ------------------------------------
ONE_ROW_WARMUP_STEPS: int = 8  # one-row steps run and not timed before the trial: the first after a load run slow
ONE_ROW_BLOCK_STEPS: int = 4  # one-row steps per block of one setting
ONE_ROW_TRIAL_BLOCKS: int = 12  # blocks in the trial, ABBA quads (half per setting)
ONE_ROW_MARGIN: float = 0.03  # vec_dot must be 3% faster (ratio of medians), overall and in every quad, to replace AdaSpark's kernels
