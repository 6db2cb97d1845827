"""benchmarks/cost/q4_1_tile.py: it reads the kernel at a commit and the harness's lines (the
compile and the timing need g++ and minutes: run by hand)."""

from __future__ import annotations

import pytest

from benchmarks.cost import q4_1_tile


def test_base_source_is_the_committed_kernel():
    src = q4_1_tile.base_source("HEAD")
    assert "class tinyBLAS_Q4_1_AVX" in src and "ADASPARK_Q4_1_ONE_ROW" in src
    assert (q4_1_tile.HERE / "q4_1_tile.cpp").read_text().count('#include "base.inc"') == 1


def test_parse_reads_speeds_and_mismatches_and_refuses_other_output():
    line = "m 576 kb 18 n 8 base 30.25 head 34.40 head/base 0.879 mismatches 3\n"
    assert q4_1_tile.parse(line) == (30.25, 34.40, 0.879, 3)
    with pytest.raises(ValueError):
        q4_1_tile.parse("Segmentation fault")
