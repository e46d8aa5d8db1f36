#!/usr/bin/env python3
# Reference fixtures for qkv's attention modules and seq2seq Transformer (issue 3).
#
#   pip install torch safetensors numpy
#   python3 tools/seq2seq_fixtures.py        # rewrites tests/fixtures/seq2seq/
#
# For each case it builds the PyTorch module of a seed (the project's seed posts 000..004;
# their typos fixed, their semantics kept except in two places) with a fixed seed, and
# writes two files:
#   <case>.safetensors     the module's state_dict, by its PyTorch names (what qkv loads)
#   <case>.io.safetensors  inputs, masks in qkv's convention (1.0 = visible), expected
#                          outputs, all f32; sizes in the header metadata
# Masks are given to PyTorch in each seed's own convention (True = blocked in 001/004,
# 0 = blocked in 002/003) and converted here to qkv's (true = visible). No case has a query
# row whose keys are all blocked: PyTorch returns NaN (-inf fill) or mean(V) (-1e9 fill)
# there, qkv returns zeros (tested on its own in tests/modules.rs).
# The two changes of meaning, both fixes of the seeds' bugs: seed 001's `causal=True`
# replaced the caller's mask (here both apply, as in qkv), and seeds 002/003 applied a
# [B, Tq, Tk] mask to [B, h, Tq, Tk] scores without a heads axis, which broadcasts the
# batch onto the heads (here `mask[:, None]`, one mask per sequence for every head).
# f16 / bf16 variants store the weights in that dtype; their expected outputs are computed
# in f32 from the rounded weights and buffers (the positional table too), which is what
# PyTorch runs after loading such a checkpoint into an f32 module.

import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "seq2seq")
torch.set_grad_enabled(False)


def perturb(module, scale=0.2):
    """Moves every parameter off its default init (LayerNorm weights away from 1, biases off 0)."""
    for p in module.parameters():
        p.add_(scale * torch.randn_like(p))
    return module


def save(case, module, io, meta, dtype=torch.float32):
    sd = {k: v.detach().to(dtype).contiguous() for k, v in module.state_dict().items()}
    save_file(sd, os.path.join(OUT, f"{case}.safetensors"))
    io = {k: v.detach().to(torch.float32).contiguous() for k, v in io.items()}
    save_file(io, os.path.join(OUT, f"{case}.io.safetensors"), metadata={k: str(v) for k, v in meta.items()})


def round_params(module, dtype):
    """Rounds a module's floating tensors through `dtype` in place (for f16/bf16 variants):
    its parameters and its buffers, such as the positional table, as loading the `dtype`
    checkpoint back into the f32 module would."""
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            t.copy_(t.to(dtype).to(torch.float32))
    return module


def keep_from_lengths(lengths, tk):
    return torch.arange(tk)[None, :] < torch.tensor(lengths)[:, None]  # [B, Tk], True = real


# ---- seed 000 -------------------------------------------------------------------------

class SelfAttention000(nn.Module):
    def __init__(self, input_dim, dim_qk, dim_v):
        super().__init__()
        self.q = nn.Linear(input_dim, dim_qk)
        self.k = nn.Linear(input_dim, dim_qk)
        self.v = nn.Linear(input_dim, dim_v)
        self.scale = math.sqrt(dim_qk)

    def forward(self, x):
        s = torch.bmm(self.q(x), self.k(x).transpose(1, 2)) / self.scale
        return torch.bmm(torch.softmax(s, dim=-1), self.v(x))


class MultiHeadAttention000(nn.Module):
    def __init__(self, input_dim, num_heads, dim_qk, dim_v):
        super().__init__()
        self.h = num_heads
        self.dq = dim_qk // num_heads
        self.dv = dim_v // num_heads
        self.q = nn.Linear(input_dim, dim_qk)
        self.k = nn.Linear(input_dim, dim_qk)
        self.v = nn.Linear(input_dim, dim_v)
        self.out = nn.Linear(dim_v, input_dim)

    def forward(self, x, key_keep=None):
        b, t = x.shape[:2]
        q = self.q(x).view(b, t, self.h, self.dq).transpose(1, 2)
        k = self.k(x).view(b, t, self.h, self.dq).transpose(1, 2)
        v = self.v(x).view(b, t, self.h, self.dv).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.dq)
        if key_keep is not None:  # an extension of the seed: key padding, pads anywhere
            s = s.masked_fill(~key_keep[:, None, None, :], float("-inf"))
        o = torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).contiguous().view(b, t, -1)
        return self.out(o)


class CrossAttention000(nn.Module):
    def __init__(self, input_dim, dim_qk, dim_v):
        super().__init__()
        self.q = nn.Linear(input_dim, dim_qk)
        self.k = nn.Linear(input_dim, dim_qk)
        self.v = nn.Linear(input_dim, dim_v)
        self.scale = math.sqrt(dim_qk)

    def forward(self, encoder_input, decoder_input, key_keep=None):
        s = torch.bmm(self.q(decoder_input), self.k(encoder_input).transpose(1, 2)) / self.scale
        if key_keep is not None:
            s = s.masked_fill(~key_keep[:, None, :], float("-inf"))
        return torch.bmm(torch.softmax(s, dim=-1), self.v(encoder_input))


# ---- seed 001 -------------------------------------------------------------------------

class Attention001(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.h = num_heads
        self.hd = dim // num_heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, query, key, value, mask=None, causal=False):
        b, tq, tk = query.size(0), query.size(1), key.size(1)
        q = self.query(query).view(b, tq, self.h, self.hd).transpose(1, 2)
        k = self.key(key).view(b, tk, self.h, self.hd).transpose(1, 2)
        v = self.value(value).view(b, tk, self.h, self.hd).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) / (self.hd ** 0.5)
        if causal:
            c = torch.triu(torch.ones(tq, tk), diagonal=1).bool()
            s = s.masked_fill(c[None, None], float("-inf"))
        if mask is not None:  # True = blocked, [Tq, Tk]
            s = s.masked_fill(mask[None, None], float("-inf"))
        o = torch.matmul(F.softmax(s, dim=-1), v).transpose(1, 2).contiguous().view(b, tq, -1)
        return self.out(o)


# ---- seed 002 -------------------------------------------------------------------------

class MultiHeadAttention002(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h = h
        self.d_k = d_model // h
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):  # mask [B, L, L] or [B, 1, L, L], 0 = blocked
        b, l, _ = x.size()
        q = self.w_q(x).view(b, l, self.h, self.d_k).transpose(1, 2)
        k = self.w_k(x).view(b, l, self.h, self.d_k).transpose(1, 2)
        v = self.w_v(x).view(b, l, self.h, self.d_k).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            if mask.dim() == 3:
                mask = mask[:, None]
            s = s.masked_fill(mask == 0, float("-inf"))
        a = F.softmax(s, dim=-1)
        o = torch.matmul(a, v).transpose(1, 2).contiguous().view(b, l, -1)
        return self.w_o(o), a


# ---- seed 003 -------------------------------------------------------------------------

class CrossAttention003(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h = num_heads
        self.hd = embed_dim // num_heads
        self.e = embed_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, mask=None):  # mask [B, Tq, Tk], 0 = blocked
        b, tq, tk = query.size(0), query.size(1), key.size(1)
        q = self.q_proj(query).view(b, tq, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(key).view(b, tk, self.h, self.hd).transpose(1, 2)
        v = self.v_proj(value).view(b, tk, self.h, self.hd).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) / (self.hd ** 0.5)
        if mask is not None:
            s = s.masked_fill(mask[:, None] == 0, float("-inf"))
        o = torch.matmul(F.softmax(s, dim=-1), v).transpose(1, 2).contiguous().view(b, tq, self.e)
        return self.out_proj(o)


# ---- seed 004 -------------------------------------------------------------------------

class MutiHeadAttention(nn.Module):
    def __init__(self, hidden_size, num_head):
        super().__init__()
        self.hidden = hidden_size
        self.h = num_head
        self.hd = hidden_size // num_head
        self.wq = nn.Linear(hidden_size, hidden_size)
        self.wk = nn.Linear(hidden_size, hidden_size)
        self.wv = nn.Linear(hidden_size, hidden_size)
        self.output_layer = nn.Linear(hidden_size, hidden_size)

    def forward(self, q, k, v, padding_mask=None, causal_mask=None):  # [B, Tq, Tk], True = blocked
        b = q.size(0)
        Q = self.wq(q).view(b, -1, self.h, self.hd).transpose(1, 2)
        K = self.wk(k).view(b, -1, self.h, self.hd).transpose(1, 2)
        V = self.wv(v).view(b, -1, self.h, self.hd).transpose(1, 2)
        x = torch.matmul(Q, K.transpose(2, 3)) / np.sqrt(self.hd)
        if padding_mask is not None:
            x = x.masked_fill(padding_mask[:, None].bool(), -1e9)
        if causal_mask is not None:
            x = x.masked_fill(causal_mask[:, None].bool(), -1e9)
        o = torch.matmul(torch.softmax(x, dim=-1), V)
        return self.output_layer(o.transpose(1, 2).contiguous().reshape(b, -1, self.hidden))


class FeedForward(nn.Module):
    def __init__(self, hidden_size, scale):
        super().__init__()
        self.linear1 = nn.Linear(hidden_size, int(scale) * hidden_size)
        self.linear2 = nn.Linear(int(scale) * hidden_size, hidden_size)

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, scale):
        super().__init__()
        self.attn = MutiHeadAttention(d, heads)
        self.FFN = FeedForward(d, scale)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x, pad):
        h = self.norm1(x)
        out = x + self.attn(h, h, h, pad)
        return out + self.FFN(self.norm2(out))


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, scale):
        super().__init__()
        self.self_attn = MutiHeadAttention(d, heads)
        self.cross_attn = MutiHeadAttention(d, heads)
        self.FFN = FeedForward(d, scale)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)

    def forward(self, x, enc, enc_pad, dec_pad, causal):
        h = self.norm1(x)
        out = x + self.self_attn(h, h, h, dec_pad, causal)
        h = self.norm2(out)
        out = out + self.cross_attn(h, enc, enc, enc_pad, None)
        return out + self.FFN(self.norm3(out))


class Coder(nn.Module):
    def __init__(self, layer, max_len, d, heads, n, scale):
        super().__init__()
        self.pos_embedding = PositionalEncoding(d, max_len)
        self.Layers = nn.ModuleList([layer(d, heads, scale) for _ in range(n)])


class Seq2Seq(nn.Module):
    """Seed 004's Transformer, the cross-attention mask taken from the ENCODER lengths (the
    seed's bug fixed), the decoder's own padding masked too, plus embeddings and generator."""

    def __init__(self, cfg):
        super().__init__()
        d, h, s = cfg["d_model"], cfg["heads"], cfg["ffn_scale"]
        self.cfg = cfg
        self.src_embedding = nn.Embedding(cfg["src_vocab"], d)
        self.tgt_embedding = nn.Embedding(cfg["tgt_vocab"], d)
        self.Encoder = Coder(EncoderLayer, cfg["max_src_len"], d, h, cfg["encoder_layers"], s)
        self.Decoder = Coder(DecoderLayer, cfg["max_tgt_len"], d, h, cfg["decoder_layers"], s)
        self.generator = nn.Linear(d, cfg["tgt_vocab"])

    def encode(self, src, src_len):
        b, S = src.shape
        enc_pad = (~keep_from_lengths(src_len, S))[:, None, :].expand(b, S, S)  # True = blocked
        x = self.Encoder.pos_embedding(self.src_embedding(src))
        for layer in self.Encoder.Layers:
            x = layer(x, enc_pad)
        return x

    def forward(self, src, src_len, tgt, tgt_len):
        b, S = src.shape
        T = tgt.shape[1]
        enc = self.encode(src, src_len)
        causal = torch.triu(torch.ones(b, T, T), diagonal=1).bool()
        dec_pad = (~keep_from_lengths(tgt_len, T))[:, None, :].expand(b, T, T)
        cross_pad = (~keep_from_lengths(src_len, S))[:, None, :].expand(b, T, S)
        y = self.Decoder.pos_embedding(self.tgt_embedding(tgt))
        for layer in self.Decoder.Layers:
            y = layer(y, enc, cross_pad, dec_pad, causal)
        return self.generator(y)

    def greedy(self, src, src_len, bos, eos, max_len):
        b = src.shape[0]
        ys = torch.full((b, 1), bos, dtype=torch.long)
        out = [[] for _ in range(b)]
        done = [False] * b
        for _ in range(max_len):
            logits = self.forward(src, src_len, ys, [ys.shape[1]] * b)[:, -1]
            nxt = logits.argmax(-1)
            for i in range(b):
                if not done[i]:
                    if int(nxt[i]) == eos:
                        done[i] = True
                    else:
                        out[i].append(int(nxt[i]))
            if all(done):
                break
            ys = torch.cat([ys, nxt[:, None]], dim=1)
        return out


# ---- cases ----------------------------------------------------------------------------

def case_self000():
    torch.manual_seed(0)
    m = perturb(SelfAttention000(12, 8, 6))
    x = torch.randn(3, 5, 12)
    save("self000", m, {"x": x, "out": m(x)}, {"input_dim": 12, "dim_qk": 8, "dim_v": 6})


def case_mha000(dtype=torch.float32, name="mha000"):
    torch.manual_seed(1)
    m = perturb(MultiHeadAttention000(16, 8, 16, 24))
    if dtype != torch.float32:
        round_params(m, dtype)
    x = torch.randn(3, 5, 16)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    io = {"x": x, "out": m(x), "keep": keep, "out_padded": m(x, keep)}
    save(name, m, io, {"input_dim": 16, "heads": 8, "dim_qk": 16, "dim_v": 24}, dtype)


def case_cross000():
    torch.manual_seed(2)
    m = perturb(CrossAttention000(12, 8, 10))
    enc = torch.randn(3, 7, 12)
    dec = torch.randn(3, 4, 12)
    lengths = [7, 3, 5]
    keep = keep_from_lengths(lengths, 7)
    io = {"enc": enc, "dec": dec, "out": m(enc, dec), "src_lengths": torch.tensor(lengths),
          "out_padded": m(enc, dec, keep)}
    save("cross000", m, io, {"input_dim": 12, "dim_qk": 8, "dim_v": 10})


def case_attn001(dtype=torch.float32, name="attn001"):
    torch.manual_seed(3)
    m = perturb(Attention001(16, 2))
    if dtype != torch.float32:
        round_params(m, dtype)
    q = torch.randn(3, 4, 16)
    kv = torch.randn(3, 6, 16)
    blocked = torch.rand(4, 6) < 0.4
    blocked[:, 0] = False  # every row keeps key 0
    io = {
        "q": q,
        "kv": kv,
        "self": m(q, q, q),
        "cross": m(q, kv, kv),
        "causal": m(q, q, q, causal=True),
        "causal_cross": m(q, kv, kv, causal=True),
        "dense_keep": ~blocked,
        "dense": m(q, kv, kv, mask=blocked),
        "dense_causal": m(q, kv, kv, mask=blocked, causal=True),
    }
    save(name, m, io, {"dim": 16, "heads": 2}, dtype)


def case_mha002():
    torch.manual_seed(4)
    m = perturb(MultiHeadAttention002(16, 4))
    x = torch.randn(3, 5, 16)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 1], [1, 0, 0, 1, 0]], dtype=torch.float32)
    mask = keep[:, None, :].expand(3, 5, 5)  # 0 = blocked
    out, a = m(x, mask)
    out_causal, a_causal = m(x, mask * torch.tril(torch.ones(5, 5))[None])
    io = {"x": x, "keep": keep, "out": out, "probs": a, "out_causal": out_causal, "probs_causal": a_causal}
    save("mha002", m, io, {"d_model": 16, "h": 4})


def case_mha002_wide():
    # A mask of its own per sequence (seed 002's interface, [B, L, L]) over more keys than
    # one of qkv's 64-key blocks, every row keeping at least one key.
    torch.manual_seed(8)
    m = perturb(MultiHeadAttention002(16, 4))
    b, l = 2, 100
    x = torch.randn(b, l, 16)
    keep = (torch.rand(b, l, l) < 0.3).float()
    keep[:, torch.arange(l), torch.randint(0, l, (l,))] = 1.0
    out, a = m(x, keep)
    io = {"x": x, "keep": keep, "out": out, "probs": a}
    save("mha002_wide", m, io, {"d_model": 16, "h": 4, "len": l})


def case_attn001_tall():
    # Causal with more queries than keys (rows past the last key see every key).
    torch.manual_seed(9)
    m = perturb(Attention001(16, 2))
    q = torch.randn(2, 9, 16)
    kv = torch.randn(2, 5, 16)
    io = {"q": q, "kv": kv, "causal_tall": m(q, kv, kv, causal=True)}
    save("attn001_tall", m, io, {"dim": 16, "heads": 2})


def case_cross003():
    torch.manual_seed(5)
    m = perturb(CrossAttention003(16, 8))
    q = torch.randn(3, 4, 16)
    kv = torch.randn(3, 7, 16)
    lengths = [7, 2, 5]
    mask = keep_from_lengths(lengths, 7)[:, None, :].expand(3, 4, 7).float()  # 0 = blocked
    io = {"q": q, "kv": kv, "src_lengths": torch.tensor(lengths), "out": m(q, kv, kv, mask),
          "out_unmasked": m(q, kv, kv)}
    save("cross003", m, io, {"embed_dim": 16, "heads": 8})


def case_mha004():
    torch.manual_seed(6)
    m = perturb(MutiHeadAttention(16, 4))
    x = torch.randn(3, 5, 16)
    lengths = [5, 2, 4]
    pad = (~keep_from_lengths(lengths, 5))[:, None, :].expand(3, 5, 5)  # True = blocked
    causal = torch.triu(torch.ones(3, 5, 5), diagonal=1).bool()
    io = {"x": x, "lengths": torch.tensor(lengths), "out_padded": m(x, x, x, pad),
          "out_causal": m(x, x, x, pad, causal)}
    save("mha004", m, io, {"hidden": 16, "heads": 4})


SEQ2SEQ_CFG = dict(d_model=16, heads=4, encoder_layers=2, decoder_layers=2, ffn_scale=2,
                   src_vocab=23, tgt_vocab=19, max_src_len=12, max_tgt_len=12)


def case_seq2seq(dtype=torch.float32, name="seq2seq"):
    torch.manual_seed(7)
    m = perturb(Seq2Seq(SEQ2SEQ_CFG), 0.3)
    if dtype != torch.float32:
        round_params(m, dtype)
    src = torch.randint(0, 23, (3, 7))
    src_len = [7, 4, 6]
    tgt = torch.randint(0, 19, (3, 6))
    tgt_len = [6, 3, 5]
    logits = m(src, src_len, tgt, tgt_len)
    full = m(src, src_len, tgt, [6, 6, 6])  # every target position real: the step-by-step case
    bos, max_len = 1, 10
    free = m.greedy(src, src_len, bos, -1, max_len)
    # EOS: a token some free-running sequences emit late and others never do, so that the
    # case covers both stopping at EOS and running to max_len.
    firsts = {}
    for g in free:
        for i, t in enumerate(g):
            firsts.setdefault(t, []).append(i) if t not in g[:i] else None
    partial = [t for t, idx in firsts.items() if 0 < len(idx) < len(free)]
    eos = max(partial, key=lambda t: max(firsts[t])) if partial else free[0][-1]
    greedy = m.greedy(src, src_len, bos, eos, max_len)
    flat = [t for g in greedy for t in g]
    io = {
        "src": src, "src_lengths": torch.tensor(src_len),
        "tgt": tgt, "tgt_lengths": torch.tensor(tgt_len),
        "logits": logits, "logits_full": full,
        "greedy_tokens": torch.tensor(flat if flat else [0]),
        "greedy_lengths": torch.tensor([len(g) for g in greedy]),
    }
    meta = dict(SEQ2SEQ_CFG, bos=bos, eos=eos, max_len=max_len)
    sd = {k: v.to(dtype).contiguous() for k, v in m.state_dict().items()}
    save_file(sd, os.path.join(OUT, f"{name}.safetensors"),
              metadata={k: str(v) for k, v in SEQ2SEQ_CFG.items()})
    save_file({k: v.to(torch.float32).contiguous() for k, v in io.items()},
              os.path.join(OUT, f"{name}.io.safetensors"),
              metadata={k: str(v) for k, v in meta.items()})


def main():
    os.makedirs(OUT, exist_ok=True)
    case_self000()
    case_mha000()
    case_mha000(torch.float16, "mha000_f16")
    case_cross000()
    case_attn001()
    case_attn001(torch.bfloat16, "attn001_bf16")
    case_mha002()
    case_mha002_wide()
    case_attn001_tall()
    case_cross003()
    case_mha004()
    case_seq2seq()
    case_seq2seq(torch.float16, "seq2seq_f16")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
