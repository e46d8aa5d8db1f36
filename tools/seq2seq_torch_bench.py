#!/usr/bin/env python3
# PyTorch peer of benches/seq2seq.rs: the seed-004 Transformer at d_model 512, 8 heads,
# 6 + 6 layers, FFN 2048, vocabulary 1000, f32, 2 threads.
#
#   pip install torch safetensors numpy
#   python3 tools/seq2seq_torch_bench.py
#
# - encoder forward over an embedded [8, 128, 512] batch (the seed's modules, no padding);
# - one decoder step with a 128-token source, B = 1 and B = 8, written the way a PyTorch user
#   would write cached decoding with these modules: cross-attention K/V projected once per
#   source, self-attention K/V appended to a per-layer cache, one new row per step,
#   averaged over target positions 0-63 (as the Rust bench).
# Prints the median of several repetitions, in ms.

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seq2seq_fixtures import Seq2Seq  # noqa: E402  (the seed-004 modules)

torch.set_num_threads(2)
torch.set_grad_enabled(False)

CFG = dict(d_model=512, heads=8, encoder_layers=6, decoder_layers=6, ffn_scale=4,
           src_vocab=1000, tgt_vocab=1000, max_src_len=256, max_tgt_len=256)


def median_ms(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def split(x, h):
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


def attend(layer_attn, q_in, k, v, key_keep=None):
    """One new query row over cached, already projected k, v [B, h, T, dh]."""
    h = layer_attn.h
    q = split(layer_attn.wq(q_in), h)
    s = torch.matmul(q, k.transpose(2, 3)) / (layer_attn.hd ** 0.5)
    if key_keep is not None:
        s = s.masked_fill(~key_keep[:, None, None, :], float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).reshape(q_in.shape[0], 1, -1)
    return layer_attn.output_layer(o)


def main():
    torch.manual_seed(0)
    m = Seq2Seq(CFG).eval()
    h = CFG["heads"]

    x = torch.randn(8, 128, 512)
    pad = torch.zeros(8, 128, 128, dtype=torch.bool)

    def encoder():
        y = m.Encoder.pos_embedding(x)
        for layer in m.Encoder.Layers:
            y = layer(y, pad)
        return y

    enc_ms = median_ms(encoder, reps=7)
    print(f"encoder_forward_b8_t128: {enc_ms:.1f} ms (median of 7)")

    for b in (1, 8):
        src = torch.randint(0, 1000, (b, 128))
        enc = m.encode(src, [128] * b)
        keep = torch.ones(b, 128, dtype=torch.bool)
        cross = [(split(l.cross_attn.wk(enc), h), split(l.cross_attn.wv(enc), h)) for l in m.Decoder.Layers]
        tokens = torch.arange(5, 5 + b)[:, None]
        pe = m.Decoder.pos_embedding.pe

        def run_steps(n=64):
            cache = [None] * len(m.Decoder.Layers)
            for pos in range(n):
                y = m.tgt_embedding(tokens) + pe[:, pos:pos + 1]
                for i, layer in enumerate(m.Decoder.Layers):
                    hn = layer.norm1(y)
                    k_new = split(layer.self_attn.wk(hn), h)
                    v_new = split(layer.self_attn.wv(hn), h)
                    if cache[i] is None:
                        cache[i] = (k_new, v_new)
                    else:
                        cache[i] = (torch.cat([cache[i][0], k_new], 2), torch.cat([cache[i][1], v_new], 2))
                    y = y + attend(layer.self_attn, hn, *cache[i])
                    y = y + attend(layer.cross_attn, layer.norm2(y), *cross[i], keep)
                    y = y + layer.FFN(layer.norm3(y))
                m.generator(y)

        ms = median_ms(run_steps, reps=5, warmup=1) / 64
        print(f"decoder_step_src128/b{b}: {ms:.3f} ms per step (median of 5 runs of 64 steps)")


if __name__ == "__main__":
    main()
