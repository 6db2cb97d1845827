"""Per ggml weight type: is a batched mul_mat column bit-identical to the same column alone?

Calls ggml itself (through ctypes, the libggml-base / libggml-cpu that llama_cpp loads, so after
``native.activate()`` the patched Q4_1 kernels too): random weights W (K x M) quantized to each
type with ggml_quantize_chunk, activations X (K x N); Y = mul_mat(W, X) over all N columns at
once and over each column alone, compared bit for bit. A one-column product takes ggml's vec_dot
kernel; N >= 2 may take llamafile's tinyBLAS (F32, F16, BF16, Q8_0, Q4_0, Q5_0, IQ4_NL and
AdaSpark's Q4_1, Q4_K and Q6_K), so a type whose two kernels sum differently shows here.

    python -m benchmarks.kernels.kernel_identity [--types Q4_K,Q6_K,Q5_0,Q8_0,Q4_1,Q5_1] [--k 896] [--m 128] [--n 8]
        [--against-stock]

Where AdaSpark's kernel takes the one-column product too (Q4_0, Q5_0, Q8_0 on the AVX-512 VNNI
variants), batched == alone compares the kernel with itself; ``--against-stock`` also computes
both in a process on the stock libraries (``ADASPARK_STOCK_KERNELS=1``) and compares with those.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, module_argv

GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
              "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _libs():
    from adaspark_app import native

    # as the backend does: ggml's tiled K-quant matmul (8+ columns) sums in another order; set
    # GGML_CPU_TILED_MM=1 to see it
    os.environ.setdefault("GGML_CPU_TILED_MM", "0")

    native.activate()
    import llama_cpp  # noqa: F401  (loads the libraries from LLAMA_CPP_LIB_PATH, if set)

    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    base.ggml_init.restype, base.ggml_init.argtypes = vp, [_InitParams]
    base.ggml_free.argtypes = [vp]
    base.ggml_new_tensor_2d.restype, base.ggml_new_tensor_2d.argtypes = vp, [vp, ctypes.c_int, i64, i64]
    base.ggml_get_data.restype, base.ggml_get_data.argtypes = vp, [vp]
    base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = vp, [vp, vp, vp]
    base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = vp, [vp]
    base.ggml_build_forward_expand.argtypes = [vp, vp]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, vp, vp, i64, i64, i64, vp]
    base.ggml_row_size.restype, base.ggml_row_size.argtypes = ctypes.c_size_t, [ctypes.c_int, i64]
    cpu.ggml_cpu_init.argtypes = []
    cpu.ggml_cpu_init()
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    return base, cpu, native.status()


def mul_mat(base, cpu, qtype: int, w: np.ndarray, x: np.ndarray, threads: int) -> np.ndarray:
    """ggml mul_mat of W (M rows of K, quantized to qtype) by X (N rows of K): Y as N x M float32."""
    m, k = w.shape
    n = x.shape[0]
    ctx = base.ggml_init(_InitParams(64 << 20, None, False))
    try:
        tw = base.ggml_new_tensor_2d(ctx, qtype, k, m)
        w32 = np.ascontiguousarray(w, dtype=np.float32)
        base.ggml_quantize_chunk(qtype, w32.ctypes.data, base.ggml_get_data(tw), 0, m, k, None)
        tx = base.ggml_new_tensor_2d(ctx, 0, k, n)
        ctypes.memmove(base.ggml_get_data(tx), np.ascontiguousarray(x, dtype=np.float32).ctypes.data, x.nbytes)
        ty = base.ggml_mul_mat(ctx, tw, tx)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, ty)
        if cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        out = np.ctypeslib.as_array(ctypes.cast(base.ggml_get_data(ty), ctypes.POINTER(ctypes.c_float)),
                                    shape=(n, m)).copy()
    finally:
        base.ggml_free(ctx)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 when every type is bit-identical, else 1."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_K,Q6_K,Q5_0,Q8_0,Q4_0,Q4_1,Q5_1,F16,F32")
    ap.add_argument("--k", type=int, default=896 * 2 + 256 * 0 + 256)  # a multiple of 256 (K-quants)
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--against-stock", action="store_true",
                    help="also compare with the same products on the stock libraries")
    ap.add_argument("--save", type=Path, default=None, help=argparse.SUPPRESS)  # the stock child's output
    args = ap.parse_args(argv)
    stock = None
    if args.against_stock:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "stock.npz"
            cmd = module_argv("benchmarks.kernels.kernel_identity", "--types", args.types, "--k", str(args.k),
                              "--m", str(args.m), "--n", str(args.n), "--threads", str(args.threads),
                              "--seed", str(args.seed), "--save", str(out))
            child = subprocess.run(cmd, env={**os.environ, "ADASPARK_STOCK_KERNELS": "1"}, capture_output=True, text=True,
                                   cwd=ROOT)
            if not out.is_file():
                print(child.stdout + child.stderr, file=sys.stderr)
                return 2
            stock = dict(np.load(out))
    base, cpu, status = _libs()
    rng = np.random.default_rng(args.seed)
    w = rng.standard_normal((args.m, args.k)).astype(np.float32) * 0.05
    x = rng.standard_normal((args.n, args.k)).astype(np.float32)
    print(f"kernels: {status}; W {args.m}x{args.k}, {args.n} columns, {args.threads} threads")
    ok = True
    saved = {}
    for name in args.types.split(","):
        qt = GGML_TYPES[name]
        batched = mul_mat(base, cpu, qt, w, x, args.threads)
        alone = np.stack([mul_mat(base, cpu, qt, w, x[j:j + 1], args.threads)[0] for j in range(args.n)])
        saved[f"{name}_batched"], saved[f"{name}_alone"] = batched, alone
        same = np.array_equal(batched, alone)
        ok &= same
        diff = np.abs(batched - alone)
        line = (f"{name:5s} batched == alone: {same}; elements differing {int((diff > 0).sum())}/{diff.size}, "
                f"max |diff| {diff.max():.3g}")
        if stock is not None:
            same_b = np.array_equal(batched, stock[f"{name}_batched"])
            same_a = np.array_equal(alone, stock[f"{name}_alone"])
            ok &= same_b and same_a
            line += f"; == stock batched: {same_b}, == stock alone: {same_a}"
        print(line)
    if args.save is not None:
        np.savez(args.save, **saved)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
