"""The DSpark drafter forward in torch, as llama.cpp's `dflash` graph computes it.

Mirrors the NumPy reference in tests/test_dspark.py (which is checked against llama.cpp): target
features -> `fc` -> RMS norm (`enc.output_norm`) give the context; each backbone layer projects
that context with its own K/V weights (RoPE at the context positions, no attention norm) and the
block [anchor, mask x (B-1)] with norm + Q/K/V (RoPE at anchor_pos + i); block rows attend
non-causally to every context position before the anchor and to the whole block. The target's
token embeddings are the input table and, tied, the output head (frozen, dequantized from Q8_0).
The Markov head adds markov_w2 @ markov_w1[prev] to each row's logits (prev: the anchor, then the
token before the row); the confidence head is sigmoid(conf_proj . [h, code] + bias).

Training runs many anchors of one sequence at once: context keys at positions >= the anchor are
masked out, so each block sees exactly what the engine's drafter KV holds at that anchor.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from adaspark_app.gguf_file import read_gguf_header, read_gguf_tensor

GGML_TYPE_Q8_0 = 8


def target_embeddings(target_path: str) -> np.ndarray:
    """The target's Q8_0 token embeddings, dequantized to float32 [n_vocab, n_embd]."""
    th = read_gguf_header(target_path)
    info = th.tensors["token_embd.weight"]
    if info.ggml_type != GGML_TYPE_Q8_0:
        raise ValueError("expected a Q8_0 token_embd (the bundled SmolLM2)")
    n_embd, n_vocab = info.shape
    raw = np.memmap(target_path, dtype=np.uint8, mode="r", offset=th.data_offset + info.offset,
                    shape=(n_vocab, n_embd // 32, 34))
    d = np.ascontiguousarray(raw[:, :, :2]).view(np.float16)[..., 0].astype(np.float32)
    q = np.ascontiguousarray(raw[:, :, 2:]).view(np.int8).astype(np.float32)
    return (q * d[..., None]).reshape(n_vocab, n_embd)


def read_drafter(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, tensors by name) of a drafter GGUF: weights as float32 (F32 or F16 in the
    file), `d2t` (a reduced draft vocabulary's target ids) as int64."""
    h = read_gguf_header(path)
    w = {}
    for name in h.tensors:
        a = read_gguf_tensor(path, h, name)
        w[name] = a if a.dtype == np.int64 else a.astype(np.float32)
    return h.kv, w


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """NeoX RoPE over the last dim; pos broadcasts against x's leading dims (x: [..., heads, hd])."""
    hd = x.shape[-1]
    half = hd // 2
    inv = base ** (-torch.arange(half, dtype=torch.float32) * 2.0 / hd)
    theta = pos.to(torch.float32)[..., None] * inv  # [..., half]
    cos, sin = torch.cos(theta)[..., None, :], torch.sin(theta)[..., None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class Drafter(nn.Module):
    def __init__(self, kv: dict, w: dict[str, np.ndarray], embed: np.ndarray) -> None:
        super().__init__()
        self.n_layer = int(kv["dflash.block_count"])
        self.n_head = int(kv["dflash.attention.head_count"])
        self.n_kv = int(kv["dflash.attention.head_count_kv"])
        self.hd = int(kv["dflash.attention.key_length"])
        self.eps = float(kv["dflash.attention.layer_norm_rms_epsilon"])
        self.base = float(kv["dflash.rope.freq_base"])
        self.mask = int(kv["tokenizer.ggml.mask_token_id"])
        self.block = int(kv["dflash.block_size"])
        w = dict(w)
        d2t = w.pop("d2t", None)
        head = w.pop("output.weight", None)
        self.d2t = None if d2t is None else torch.tensor(d2t)
        if self.d2t is not None:  # target id -> draft row, -100 (no label) off the draft vocabulary
            self.t2d = torch.full((embed.shape[0],), -100, dtype=torch.long)
            self.t2d[self.d2t] = torch.arange(len(self.d2t))
        self.p = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.tensor(v)) for k, v in w.items()})
        self.register_buffer("E", torch.tensor(embed), persistent=False)
        # the output head: the target's tied embeddings, or a reduced vocabulary's own rows (frozen)
        self.register_buffer("H", torch.tensor(embed) if head is None else torch.tensor(head), persistent=False)

    def w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "__")]

    def weights(self) -> dict[str, np.ndarray]:
        out = {k.replace("__", "."): v.detach().numpy().astype(np.float32) for k, v in self.p.items()}
        if self.d2t is not None:
            out["output.weight"] = self.H.numpy().astype(np.float32)
        return out

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                prev: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [m, B, V] (V: the draft vocabulary, rows of `d2t` if any) and confidence logits [m, B] for blocks at ``anchors`` (positions).

        feats: [n, n_feat] target features of positions 0..n-1; tokens: the sequence; prev[m, B]:
        the token before each block row (the anchor, then the followed picks). rows: a shorter
        runtime block (llama.cpp's block of fewer rows than trained)."""
        B, H, Hk, hd, eps = rows or self.block, self.n_head, self.n_kv, self.hd, self.eps
        n = feats.shape[0]
        m = anchors.shape[0]
        g = rms(feats @ self.w("fc.weight").T, self.w("enc.output_norm.weight"), eps)
        pos_c = torch.arange(n)
        pos_b = anchors[:, None] + torch.arange(B)[None, :]  # [m, B]
        blk_tok = torch.full((m, B), self.mask, dtype=torch.long)
        blk_tok[:, 0] = tokens[anchors]
        x = self.E[blk_tok]  # [m, B, d]
        ctx_mask = pos_c[None, :] < anchors[:, None]  # [m, n]
        group = H // Hk
        for il in range(self.n_layer):
            p = f"blk.{il}."
            kc = rms((g @ self.w(p + "attn_k.weight").T).view(n, Hk, hd), self.w(p + "attn_k_norm.weight"), eps)
            kc = rope(kc, pos_c, self.base)
            vc = (g @ self.w(p + "attn_v.weight").T).view(n, Hk, hd)
            nn_ = rms(x, self.w(p + "attn_norm.weight"), eps)
            q = rms((nn_ @ self.w(p + "attn_q.weight").T).view(m, B, H, hd), self.w(p + "attn_q_norm.weight"), eps)
            kb = rms((nn_ @ self.w(p + "attn_k.weight").T).view(m, B, Hk, hd), self.w(p + "attn_k_norm.weight"), eps)
            vb = (nn_ @ self.w(p + "attn_v.weight").T).view(m, B, Hk, hd)
            q, kb = rope(q, pos_b, self.base), rope(kb, pos_b, self.base)
            qg = q.view(m, B, Hk, group, hd)
            sc = torch.einsum("mbkgd,nkd->mbkgn", qg, kc) / math.sqrt(hd)
            sc = sc.masked_fill(~ctx_mask[:, None, None, None, :], float("-inf"))
            sb = torch.einsum("mbkgd,mckd->mbkgc", qg, kb) / math.sqrt(hd)
            pr = torch.softmax(torch.cat([sc, sb], dim=-1), dim=-1)
            att = torch.einsum("mbkgn,nkd->mbkgd", pr[..., :n], vc) + torch.einsum("mbkgc,mckd->mbkgd", pr[..., n:], vb)
            att = att.reshape(m, B, H * hd) @ self.w(p + "attn_output.weight").T
            ffn_inp = att + x
            f = rms(ffn_inp, self.w(p + "ffn_norm.weight"), eps)
            gate = f @ self.w(p + "ffn_gate.weight").T
            up = f @ self.w(p + "ffn_up.weight").T
            x = (torch.nn.functional.silu(gate) * up) @ self.w(p + "ffn_down.weight").T + ffn_inp
        hn = rms(x, self.w("output_norm.weight"), eps)
        code = self.w("markov_w1.weight")[prev]  # [m, B, r]
        logits = hn @ self.H.T + code @ self.w("markov_w2.weight").T
        if "conf_proj__weight" in self.p:
            z = torch.cat([hn, code], dim=-1) @ self.w("conf_proj.weight")[0] + self.w("conf_proj.bias")[0]
        else:
            z = torch.zeros(m, B)
        return logits, z
