"""benchmarks/cost/q4k_tile.py: its timing-only switches apply to the shipped Q4_K tile, and
only to the 4-column tile (the kernel's other tiles and the one-row path stay as shipped)."""

from __future__ import annotations


import pytest

from benchmarks.cost import q4k_tile


def test_switches_wrap_the_4_column_tiles_scale_decode_float_steps_and_prefetch_only():
    src = q4k_tile.INC.read_text()
    out = q4k_tile.patched(src)
    start = out.index("inline void tile_q4_K_x4(")
    end = out.find("\n    template <", start)
    tile, rest = out[start:end], out[:start] + out[end:]
    for switch in ("#ifdef NO_DECODE", "#ifndef NO_FLOAT", "#ifndef NO_PF"):
        assert tile.count(switch) == 1, switch
        assert switch not in rest, f"{switch} outside the 4-column tile"
    # with every switch off the patched file is the shipped one plus preprocessor lines only
    kept = [ln for ln in out.splitlines() if not ln.startswith("#")]
    removed_variants = [ln for ln in kept if "ms[r] = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(" in ln
                        or "acc[0][r] = _mm512_add_ps(acc[0][r]" in ln]
    assert len(removed_variants) == 2
    assert [ln for ln in kept if ln not in removed_variants] == [ln for ln in src.splitlines() if not ln.startswith("#")]


def test_a_changed_tile_is_refused_not_timed_wrongly():
    src = q4k_tile.INC.read_text()
    at = src.index("inline void tile_q4_K_x4(")  # the decode line of the 4-column tile, not the others'
    src = src[:at] + src[at:].replace("utmp[0] &= kmask1;", "utmp[0] &= 0x3f3f3f3f;", 1)
    with pytest.raises(ValueError, match="tile_q4_K_x4 changed"):
        q4k_tile.patched(src)
