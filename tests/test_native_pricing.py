"""The round's pricing in C (adaspark_app/native/pricing.c) against its numpy reference: the same
columns, design, estimates, Q, order and S(n) on random trees and on the real engine's rounds; the
same replies and widths end to end; a sampled row's top k; and a build that cannot happen leaves the
numpy code running."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from adaspark_app.engine.candidates import candidate_set
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.tree import KIND_NGRAM, KIND_PICK, KIND_SIBLING, Candidates, tree_values
from adaspark_app.learn import acceptance
from adaspark_app.learn.acceptance import FLOAT_COLUMNS, INT_COLUMNS, AcceptanceModel, CandidateSet
from adaspark_app.learn.kinds import NgramKind
from adaspark_app.learn.precision import SourcePrecision
from adaspark_app.native import pricing
from failing_compiler import failing_compiler
from benchmarks.common import read_jsonl
from benchmarks.cost.round_host_time import _capture_pricing

LONGPASTE = Path(__file__).parent.parent / "benchmarks" / "corpora" / "longpaste.jsonl.gz"
C_MODULE = acceptance.PRICING


@pytest.fixture
def numpy_pricing(monkeypatch):
    """Run the numpy reference for the test's duration (every caller reads acceptance.PRICING)."""
    def use(on: bool) -> None:
        monkeypatch.setattr(acceptance, "PRICING", None if on else C_MODULE)
    return use


def test_the_install_built_the_c_pricing_and_the_engine_uses_it():
    """On the machine that installed the package (CI's), the build happened and loads; a failed
    build would leave every round on the numpy code without failing anything else."""
    assert C_MODULE is not None, pricing.status()
    assert pricing.status() == "C"


def _random_candidates(rng: random.Random, n_picks: int) -> Candidates:
    """A tree shaped as tree_candidates builds it: a drafter spine with siblings, n-gram chains
    from the anchor and from picks, some nodes agreed and some contradicted; random features."""
    c = Candidates()
    par, picks = -1, []
    for _ in range(n_picks):
        h = rng.random() if rng.random() < 0.8 else float("nan")
        sigma = rng.random()
        pick = c.add(par, rng.randrange(5000), KIND_PICK, h=h, sigma=sigma)
        for _ in range(rng.randrange(4)):
            tok = rng.randrange(5000)
            if c.child(par, tok) is None:
                c.add(par, tok, KIND_SIBLING, h=h, sigma=sigma, r=rng.random())
        picks.append(pick)
        par = pick
    for head in [-1] + picks:
        p = head
        for _ in range(rng.randrange(0, 40 if head < 0 else 6)):
            kind = rng.choice((int(NgramKind.COPY), int(NgramKind.FOLLOWER)))
            tok = rng.randrange(5000)
            if c.child(p, tok) is not None:
                break
            p = c.add(p, tok, KIND_NGRAM, ng_kind=kind, ng_evidence=rng.randrange(0, 70))
    for j in range(len(c)):  # some drafter nodes agreed or contradicted, as tree_candidates marks them
        if c.kind[j] != KIND_NGRAM:
            u = rng.random()
            if u < 0.2:
                c.agreed[j] = True
                c.ng_kind[j], c.ng_evidence[j] = int(NgramKind.COPY), rng.randrange(0, 40)
            elif u < 0.4:
                c.contra_kind[j], c.contra_evidence[j] = int(NgramKind.FOLLOWER), rng.randrange(0, 40)
    return c


def _learned(rng: np.random.Generator) -> tuple[AcceptanceModel, SourcePrecision]:
    """An acceptance model with every coefficient off its prior, offsets set, and precision counts."""
    acc = AcceptanceModel()
    acc._open[:] = True
    acc._z[:] = rng.normal(size=acc._z.shape)
    acc._n[:] = rng.random(acc._n.shape) * 10
    acc._w = None
    acc._b_req, acc._offset = 0.3, -0.2
    prec = SourcePrecision()
    prec.class_hits[:] = rng.random(prec.class_hits.shape) * 5
    prec.class_trials[:] = prec.class_hits + rng.random(prec.class_hits.shape) * 5
    prec.hits, prec.trials = 30.0, 50.0
    return acc, prec


def _priced(cands: Candidates, acc: AcceptanceModel, prec: SourcePrecision, context: int, p_src: float) -> dict:
    cset = candidate_set(cands, prec)
    d, fit, head = acc._estimates(cset, context, p_src)
    Q, Qc, order, is_ng, sd, sn = tree_values(fit, cset)
    out = {name: getattr(cset, name) for name in (*INT_COLUMNS, *FLOAT_COLUMNS, "agreed")}
    out.update(idx=d.idx, val=d.val, fixed=d.fixed, group=d.group, head_base=d.head_base, bucket=d.bucket,
               fit=fit, head=head, Q=Q, Qc=Qc, order=order, is_ng=is_ng, sd=sd, sn=sn)
    return out


def _assert_same(c_out: dict, np_out: dict) -> None:
    for name, want in np_out.items():
        got = c_out[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if name == "order":  # the same ranking; nodes whose Q differ in the last bits may swap
            np.testing.assert_allclose(np_out["Qc"][got], np_out["Qc"][want], rtol=1e-12, atol=1e-15)
        elif want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:  # libm's exp, log and tanh may differ from numpy's in the last bit
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.skipif(C_MODULE is None, reason=f"C pricing not built: {pricing.status()}")
def test_c_pricing_equals_the_numpy_reference_on_random_trees(numpy_pricing):
    rng, nrng = random.Random(3), np.random.default_rng(3)
    acc, prec = _learned(nrng)
    for i in range(300):
        cands = _random_candidates(rng, rng.randrange(0, 9))
        context, p_src = rng.randrange(0, 9000), (rng.random() if i % 7 else float("nan"))
        numpy_pricing(False)
        c_out = _priced(cands, acc, prec, context, p_src)
        numpy_pricing(True)
        np_out = _priced(cands, acc, prec, context, p_src)
        _assert_same(c_out, np_out)


def _tree_rounds(model_path: str, prompts: list[str], max_tokens: int) -> tuple[list[str], list[tuple], list[int]]:
    """Replies, every tree round's (candidates, context, p_src) and every round's width, from the
    real engine with a fresh store."""
    seen, widths = [], []
    with ChatEngine(model_path, arm="adaspark", n_ctx=2048) as eng:
        _capture_pricing(eng, seen)
        replies = []
        for i, text in enumerate(prompts):
            r = eng.generate(f"p{i}", [{"role": "user", "content": text}], max_tokens=max_tokens,
                             on_round=lambda ev: widths.append(ev.width))
            replies.append(r.text)
            eng.reset_conversation()
    return replies, seen, widths


@pytest.mark.model
@pytest.mark.skipif(C_MODULE is None, reason=f"C pricing not built: {pricing.status()}")
def test_the_engine_decodes_alike_with_either_pricing_and_prices_its_rounds_alike(model_path, numpy_pricing):
    """The bundled model on two pastes, once per pricing: the same replies (the numpy fallback
    runs the whole engine too), and each tree round the C pricing saw priced by both alike. The
    widths chosen may differ between the runs: the chooser prices measured times."""
    prompts = [c["turns"][0] for c in read_jsonl(LONGPASTE)[1:3]]
    numpy_pricing(False)
    c_replies, rounds, c_widths = _tree_rounds(model_path, prompts, 48)
    numpy_pricing(True)
    np_replies, _, np_widths = _tree_rounds(model_path, prompts, 48)
    assert c_replies == np_replies
    assert len(rounds) >= 10 and max(c_widths) > 1 and max(np_widths) > 1, "the pastes built trees"
    acc, prec = _learned(np.random.default_rng(5))
    for cands, context, p_src in rounds:
        numpy_pricing(False)
        c_out = _priced(cands, acc, prec, context, p_src)
        numpy_pricing(True)
        _assert_same(c_out, _priced(cands, acc, prec, context, p_src))


@pytest.mark.skipif(C_MODULE is None, reason=f"C pricing not built: {pricing.status()}")
def test_c_class_counts_equal_the_numpy_reference_bit_for_bit(numpy_pricing):
    """Guards ``observe_classes``: a stream of first steps folded by the C call, a round's tokens
    at a time, leaves the class tables bit for bit as numpy's per-token operations do; a class
    outside the tables is refused, nothing counted."""
    from adaspark_app.engine.ngram import NgramStep
    rng = random.Random(5)
    kinds = (NgramKind.COPY, NgramKind.FOLLOWER, NgramKind.NONE)
    stream = [(None if rng.random() < 0.1 else NgramStep(rng.randrange(5), rng.choice(kinds), rng.randrange(-2, 60)),
               rng.randrange(5)) for _ in range(3000)]
    tables = []
    for numpy_on in (True, False):
        numpy_pricing(numpy_on)
        p, i = SourcePrecision(), 0
        while i < len(stream):
            k = rng.randrange(1, 40)
            p.observe_many(stream[i:i + k])
            i += k
        tables.append((p.class_hits.copy(), p.class_trials.copy(), p.hits, p.trials))
    (h0, t0, a0, b0), (h1, t1, a1, b1) = tables
    assert t0.max() > 1.0 and np.count_nonzero(h0) > 40
    assert np.array_equal(h0, h1) and np.array_equal(t0, t1) and (a0, b0) == (a1, b1)
    before = p.class_trials.copy()
    with pytest.raises(ValueError, match="outside the tables"):
        C_MODULE.observe_classes(p.class_hits, p.class_trials, [1], [p.class_hits.shape[1]], [1], 0.5,
                                 p.class_hits.shape[1])
    assert np.array_equal(before, p.class_trials)


def test_c_top_k_gives_a_sampled_rows_distribution_bit_for_bit_as_numpy(numpy_pricing):
    """Guards ``top_k``: on rows of a real vocabulary's size, of every spread, with ties at the k-th
    logit, -inf and +inf, the processed distribution is the numpy way's bit for bit at k = 1, 40 and
    more; a row with a NaN goes to the numpy way; a k the row cannot hold is refused."""
    from adaspark_app.engine.sampling import SamplingSettings, _top_k_in_c, processed_distribution
    rng = np.random.default_rng(9)
    n = 49_152
    rows = [(rng.standard_normal(n) * scale).astype(np.float32) for scale in (0.5, 3.0, 12.0, 40.0)]
    rows.append(np.round(rng.standard_normal(n) * 2).astype(np.float32))  # thousands tie at each value
    rows.append(np.where(rng.random(n) < 0.999, -np.inf, rng.standard_normal(n)).astype(np.float32))
    rows.append(rows[1].copy())
    rows[-1][[7, 900]] = np.inf
    nan_row = rows[1].copy()
    nan_row[30_000] = np.nan
    assert _top_k_in_c(nan_row, 40) is None
    compared = 0
    for k in (1, 40, 1000, n - 1):
        s = SamplingSettings(temperature=0.7, top_k=k, top_p=0.9, min_p=0.02, repeat_penalty=1.2, repeat_last_n=16)
        for row in rows:
            history = rng.integers(0, n, 16).tolist()
            got = []
            for numpy_on in (True, False):
                numpy_pricing(numpy_on)
                with np.errstate(invalid="ignore"):
                    got.append(processed_distribution(row, s, history))
            (a, b) = got
            assert a.tokens.tolist() == b.tokens.tolist() and a.probs.tobytes() == b.probs.tobytes(), (k, len(a.tokens))
            top = _top_k_in_c(row, k)
            order = np.lexsort((np.arange(n), -row.astype(np.float64)))[:k]
            assert top.tolist() == order.tolist()
            compared += 1
    assert compared == 28
    with pytest.raises(ValueError, match="k is 0 for a row of 5"):
        C_MODULE.top_k(np.ones(5, np.float32), 0, np.empty(1, np.int64))
    with pytest.raises(ValueError, match="bytes, expected at least"):
        C_MODULE.top_k(np.ones(5, np.float32), 3, np.empty(2, np.int64))


def test_malformed_candidates_are_refused_as_the_candidate_set_refuses_them():
    prec = SourcePrecision()
    c = Candidates()
    c.add(-1, 5, KIND_NGRAM)
    c.add(0, 6, KIND_NGRAM)
    c.parent[1] = 1  # its own parent
    with pytest.raises(ValueError, match="every parent must precede its children"):
        candidate_set(c, prec)
    c.parent[1], c.kind[1] = 0, 7
    with pytest.raises(ValueError, match="kind must be 0"):
        candidate_set(c, prec)
    c.kind[1] = KIND_NGRAM
    c.token.append(9)  # a column longer than the others
    with pytest.raises(ValueError, match="column token has 3 rows, expected 2"):
        candidate_set(c, prec)
    c.token.pop()
    cset = candidate_set(c, prec)
    with pytest.raises(ValueError, match="bytes, expected at least"):  # an output too small
        C_MODULE.tree_values(np.ones(2), cset.blocks()[0], cset.agreed, 2, np.empty(3), np.empty(2, np.int64),
                             np.empty(2, bool))


@pytest.mark.skipif(C_MODULE is None, reason=f"C pricing not built: {pricing.status()}")
def test_a_column_assigned_anew_is_what_the_c_pricing_reads():
    """A candidate set's blocks follow its columns: after ``cset.ng_prec = ...`` the C pricing
    prices the new precision, not the block's old row."""
    rng = random.Random(1)
    cands = _random_candidates(rng, 0)
    while not any(k == KIND_NGRAM for k in cands.kind):
        cands = _random_candidates(rng, 0)
    prec, acc = SourcePrecision(), AcceptanceModel()
    cset = candidate_set(cands, prec)
    before = acc._estimates(cset, 1000, 0.5)[2].copy()
    cset.ng_prec = np.full(len(cset), 0.999)
    after = acc._estimates(cset, 1000, 0.5)[2]
    assert isinstance(cset, CandidateSet) and not np.allclose(before, after)


def _fresh_load(monkeypatch, tmp_path) -> str:
    """pricing.load() as a new process would run it, with its build folder under tmp_path."""
    monkeypatch.setattr(pricing, "LIB_DIR", tmp_path / "lib")
    monkeypatch.setattr(pricing, "_status", "not loaded")
    monkeypatch.setattr(pricing, "_loaded", None)
    monkeypatch.delenv(pricing.SWITCH, raising=False)
    pricing.load()
    return pricing.status()


def test_a_build_that_fails_leaves_the_numpy_code_and_is_not_retried_in_every_process(monkeypatch, tmp_path):
    cc, calls = failing_compiler(tmp_path, "pricing.c:1: error: no compiler here")
    monkeypatch.setattr(pricing, "compiler", lambda: str(cc))
    first = _fresh_load(monkeypatch, tmp_path)
    assert first.startswith("numpy (C pricing not built:") and "error: no compiler here" in first
    assert pricing.load() is None
    second = _fresh_load(monkeypatch, tmp_path)  # the next process reads the failure
    assert second == first
    assert calls() == 1


def test_the_switch_keeps_the_numpy_code(monkeypatch, tmp_path):
    monkeypatch.setattr(pricing, "_status", "not loaded")
    monkeypatch.setenv(pricing.SWITCH, "1")
    assert pricing.load() is None
    assert pricing.status() == f"numpy ({pricing.SWITCH}=1)"


@pytest.mark.skipif(pricing.compiler() is None, reason="no C compiler")
def test_a_fresh_build_for_another_source_loads_and_prices(monkeypatch, tmp_path):
    """A checkout whose pricing.c moved on has no build for it: load builds one (here, into an
    empty folder) and uses it; the command line rebuilds it on demand."""
    earlier = tmp_path / "lib" / "pricing" / "0123456789abcdef"
    earlier.mkdir(parents=True)
    (earlier / "_pricing.abi3.so").write_bytes(b"an earlier source's build")
    status = _fresh_load(monkeypatch, tmp_path)
    assert status == "C", status
    assert not earlier.exists()
    built = list((tmp_path / "lib" / "pricing").glob("*/_pricing.abi3.so"))
    assert len(built) == 1 and built[0] == pricing.target()
    assert pricing.load().__file__ == str(built[0])  # its own build, from the new folder
    assert pricing.main(["--force"]) == 0


LATER_PYTHON_CHECK = r"""
import array, importlib.machinery, importlib.util, sys
path = sys.argv[1]
loader = importlib.machinery.ExtensionFileLoader("_pricing", path)
mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_pricing", path, loader=loader))
loader.exec_module(mod)
# a chain of three nodes under the anchor and a sibling of the first: Q, the order and S(n)
q = array.array("d", [0.5, 0.8, 0.9, 0.25])
ints = array.array("q", [-1, 0, 1, -1, 2, 2, 2, 2])  # parent row, then kind row (n-gram)
out, order = array.array("d", [0.0] * 20), array.array("q", [0] * 4)
mod.tree_values(q, ints, bytearray(4), 4, out, order, bytearray(4))
print(sys.version_info[:2], list(out[:4]), list(order))
"""


@pytest.mark.skipif(C_MODULE is None, reason=f"C pricing not built: {pricing.status()}")
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_build_serves_a_later_python(version):
    """The GPU machine's image runs Python 3.12: the build carried there (stable ABI 3.11) loads
    and computes under a later Python too (where one is installed)."""
    import shutil
    import subprocess

    # an installed interpreter (pyenv's own, not its shim, which runs only the selected versions)
    found = sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))
    exe = str(found[-1]) if found else shutil.which(f"python{version}")
    if exe is None or "/shims/" in exe:
        pytest.skip(f"no python{version} here")
    res = subprocess.run([exe, "-I", "-c", LATER_PYTHON_CHECK, C_MODULE.__file__], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    major_minor = tuple(int(x) for x in version.split("."))
    assert res.stdout.split(")")[0] + ")" == str(major_minor)
    # Q: 0.5, 0.4, 0.36 along the chain, 0.25 for the sibling; the order by Q
    assert res.stdout.strip().endswith("[0.5, 0.4, 0.36000000000000004, 0.25] [0, 1, 2, 3]")
