"""The logits a forward leaves, as the backend hands them out (``LlamaBackend._logits_array``): the
arrays it keeps over llama.cpp's buffer read what a fresh array over the buffer reads, after every
forward and at every width; a buffer at another address gets arrays of its own."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from adaspark_app.engine.backend import LlamaBackend


def _fresh(b: LlamaBackend, n_out: int) -> np.ndarray:
    """A copy of the last forward's rows, read through an array made for this read alone."""
    return np.ctypeslib.as_array(b.llama.llama_get_logits(b.ctx), shape=(n_out, b.n_vocab)).copy()


@pytest.mark.model
def test_kept_logits_arrays_read_every_forwards_rows_at_every_width_and_follow_the_buffer(model_path):
    b = LlamaBackend(model_path, n_ctx=1024, n_threads=2)
    try:
        text = "The quick brown fox jumps over the lazy dog while the cat sleeps by the fire. " * 12
        toks = b.tokenize(text)
        widths = [1, 3, 1, 8, 2, 1, 64, 1, 5, 1]  # 64: the widest verify
        assert len(toks) >= sum(widths)
        pos, sampled_before = 0, None
        for n in widths:
            greedy = n % 2 == 0  # the argmax way and the sampling way both read through the kept arrays
            out = b.verify(toks[pos:pos + n], list(range(pos, pos + n)), [(0,)] * n, argmax=greedy)
            want = _fresh(b, n)
            if greedy:
                assert out.argmax.tolist() == want.argmax(axis=1).tolist()
            else:
                view = b.logits_view(n)
                assert view.shape == (n, b.n_vocab) and np.array_equal(view, want)
                if sampled_before is not None:  # a kept array is not a stale copy of an earlier forward
                    assert not np.array_equal(view[0], sampled_before)
                sampled_before = view[0].copy()
            pos += n
        # llama.cpp reserves its buffer for the widest forward at the start (it stayed put above);
        # were it to move, the arrays kept for the old address must not be read
        moved = (ctypes.c_float * (2 * b.n_vocab))(*range(2 * b.n_vocab))
        other = b._logits_array(ctypes.cast(moved, ctypes.POINTER(ctypes.c_float)), 2)
        assert other[1, 0] == b.n_vocab and set(b._logits_arrays) == {2}
        assert np.array_equal(b.logits_view(1), _fresh(b, 1))
    finally:
        b.close()
