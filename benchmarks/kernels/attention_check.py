"""Flash attention on AdaSpark's KV cache types (K BF16, V F16): accurate, and the same bits for a
row whatever batch it is computed in?

Calls ggml's flash_attn_ext itself (through ctypes, the libggml-base / libggml-cpu that llama_cpp
loads: after ``native.activate()`` AdaSpark's library, whose attention kernel takes this cache)
on random queries, keys and values laid out as llama.cpp's unified cache lays them out (a cell's
heads side by side, so a KV head's rows are strided), with a random tree-shaped mask (each row
sees a prefix and some later cells, the rest -inf), and compares

- accuracy: each output against a float64 reference computed from the same BF16 keys, F16 values
  and BF16-rounded queries (what the kernel multiplies);
- identity: each row computed in a batch of many rows against the same row computed alone, and
  with extra hidden cells at the end of the range (the padding llama.cpp adds), bit for bit.

    python -m benchmarks.kernels.attention_check [--heads 9 --kv-heads 3 --dim 64] [--cells 700] [--rows 7]
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np

from benchmarks.kernels.kernel_identity import GGML_TYPES, _InitParams, _libs

F32, F16, BF16 = GGML_TYPES["F32"], GGML_TYPES["F16"], GGML_TYPES["BF16"]


def libs():
    """(libggml-base, libggml-cpu) with the functions this check calls declared."""
    base, cpu, _ = _libs()
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    base.ggml_new_tensor_3d.restype, base.ggml_new_tensor_3d.argtypes = vp, [vp, ctypes.c_int, i64, i64, i64]
    base.ggml_permute.restype, base.ggml_permute.argtypes = vp, [vp, vp, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                                 ctypes.c_int]
    base.ggml_flash_attn_ext.restype = vp
    base.ggml_flash_attn_ext.argtypes = [vp, vp, vp, vp, vp, ctypes.c_float, ctypes.c_float, ctypes.c_float]
    return base, cpu


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns (uint16), rounded to nearest even as ggml rounds."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def flash_attn(base, cpu, q: np.ndarray, k_bf16: np.ndarray, v_f16: np.ndarray, mask: np.ndarray,
               scale: float, threads: int) -> np.ndarray:
    """ggml_flash_attn_ext: q [rows, heads, D] float32, k_bf16 [cells, kv_heads, D] (BF16 bits),
    v_f16 [cells, kv_heads, D] float16, mask [rows, cells] (0 or -inf); out [rows, heads, D]."""
    rows, heads, d = q.shape
    cells, kv_heads, _ = k_bf16.shape
    ctx = base.ggml_init(_InitParams(256 << 20, None, False))
    try:
        def filled(kind: int, arr: np.ndarray, *ne: int):
            t = base.ggml_new_tensor_3d(ctx, kind, *ne)
            a = np.ascontiguousarray(arr)
            ctypes.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)
            return t
        # q [D, rows, heads]: heads outermost
        tq = filled(F32, np.ascontiguousarray(q.transpose(1, 0, 2)), d, rows, heads)
        # the cache: [D, kv_heads, cells] stored, viewed as [D, cells, kv_heads] (strided rows)
        tk = base.ggml_permute(ctx, filled(BF16, k_bf16, d, kv_heads, cells), 0, 2, 1, 3)
        tv = base.ggml_permute(ctx, filled(F16, v_f16, d, kv_heads, cells), 0, 2, 1, 3)
        tm = filled(F16, mask.astype(np.float16), cells, rows, 1)
        out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, ctypes.c_float(scale), ctypes.c_float(0.0),
                                       ctypes.c_float(0.0))
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, out)
        if cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        res = np.ctypeslib.as_array(ctypes.cast(base.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)),
                                    shape=(rows, heads, d)).copy()  # [D, heads, rows] in ggml's order
    finally:
        base.ggml_free(ctx)
    return res


def reference(q: np.ndarray, k_bf16: np.ndarray, v_f16: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    """float64 attention over what the kernel multiplies: BF16 q and k, F16 v."""
    rows, heads, d = q.shape
    kv_heads = k_bf16.shape[1]
    qb = from_bf16(to_bf16(q)).astype(np.float64)
    kf = from_bf16(k_bf16).astype(np.float64)
    vf = v_f16.astype(np.float64)
    out = np.zeros((rows, heads, d))
    g = heads // kv_heads
    for r in range(rows):
        vis = mask[r] == 0
        for h in range(heads):
            s = kf[vis, h // g] @ qb[r, h] * scale
            p = np.exp(s - s.max())
            out[r, h] = p @ vf[vis, h // g] / p.sum()
    return out


def random_case(rng: np.random.Generator, rows: int, heads: int, kv_heads: int, d: int, cells: int):
    """Random inputs and a tree-like mask: a shared prefix, then for each row a random subset of
    the later cells (its ancestors) and itself."""
    q = rng.standard_normal((rows, heads, d)).astype(np.float32)
    k = to_bf16(rng.standard_normal((cells, kv_heads, d)).astype(np.float32))
    v = rng.standard_normal((cells, kv_heads, d)).astype(np.float16)
    prefix = cells - rows
    mask = np.full((rows, cells), -np.inf, dtype=np.float32)
    mask[:, :prefix] = 0.0
    for r in range(rows):
        mask[r, prefix + r] = 0.0
        for a in range(r):
            if rng.random() < 0.5:
                mask[r, prefix + a] = 0.0
    return q, k, v, mask


def check(heads: int = 9, kv_heads: int = 3, d: int = 64, cells: int = 700, rows: int = 7, seed: int = 0,
          threads: int = 2) -> dict:
    """Accuracy (max |out - reference|) and identity (rows alone, rows with 64 hidden cells added)."""
    base, cpu = libs()
    rng = np.random.default_rng(seed)
    q, k, v, mask = random_case(rng, rows, heads, kv_heads, d, cells)
    scale = 1.0 / np.sqrt(d)
    batch = flash_attn(base, cpu, q, k, v, mask, scale, threads)
    ref = reference(q, k, v, mask, scale)
    alone = [flash_attn(base, cpu, q[r:r + 1], k, v, mask[r:r + 1], scale, 1) for r in range(rows)]
    pad_k = np.concatenate([k, to_bf16(rng.standard_normal((64, kv_heads, d)).astype(np.float32))])
    pad_v = np.concatenate([v, rng.standard_normal((64, kv_heads, d)).astype(np.float16)])
    pad_m = np.concatenate([mask, np.full((rows, 64), -np.inf, dtype=np.float32)], axis=1)
    padded = flash_attn(base, cpu, q, pad_k, pad_v, pad_m, scale, threads)
    return {
        "max_abs_error": float(np.abs(batch - ref).max()),
        "rows_equal_alone": sum(bool(np.array_equal(batch[r], alone[r][0])) for r in range(rows)),
        "rows_equal_padded": sum(bool(np.array_equal(batch[r], padded[r])) for r in range(rows)),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--cells", type=int, default=700)
    ap.add_argument("--rows", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    r = check(args.heads, args.kv_heads, args.dim, args.cells, args.rows, threads=args.threads)
    print(f"max |out - float64 reference| {r['max_abs_error']:.2e}; rows equal alone "
          f"{r['rows_equal_alone']}/{r['rows']}; equal with 64 hidden cells added {r['rows_equal_padded']}/{r['rows']}")
    return 0 if r["rows_equal_alone"] == r["rows"] == r["rows_equal_padded"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
