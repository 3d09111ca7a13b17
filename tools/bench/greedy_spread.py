#!/usr/bin/env python3
"""greedy_spread.py — how much of the free-running greedy agreement of an int4 set is the luck of
its rounding (docs/BENCHMARKS.md, "Quality of the quantized sets").

On a small trained model, greedy continuations part from fp16's at the first near-tie and rarely
meet again, so the share of generated tokens equal to fp16's depends on a few near-ties. This
script makes SEEDS int4 quantizations that are equally good by every averaged measure and
different only in which weights round up or down: each linear weight's columns are multiplied
by 1 + 0.03·N(0, 1) (seeded), quantized as `pollen reshard --dtype int4` does (per group of G
columns: the fp16 scale absmax/D, D = 7, then 6.5..9.25 step 0.25, then the best D ± 0.125, of
least squared error with each value's weighted by w² + mean(w²) of the group; round half away
from zero, clamp to [-8, 7]; formats/tp.c rounds half to even while scoring, which moves no
score beyond its last bits), and divided back, written as an fp16 checkpoint (fake quantization:
the same weights an int4 set holds, run through pollen's fp16 kernels). With --q4-0 one more
checkpoint holds llama.cpp's Q4_0 rounding of the unscaled weights (ggml's
quantize_row_q4_0_ref: per 32 columns d = the signed value of largest magnitude / -8, q =
min(15, trunc(w/d + 8.5)) - 8, d stored as fp16), and pollen's own int4 set is also scored with
--int-dot off, so that both sit on the same fp16 kernels. For each, and for pollen's own int4
set, it prints the mean KL against fp16 and the teacher-forced top-1 agreement on the held-out
text (`pollen perplexity --kl-base`), and the free-running greedy agreement over every held-out verse
(its first W words, 32 greedy tokens) for each W in --words.

    tools/bench/greedy_spread.py [--pollen build/pollen] [--model tests/fixtures/models/bloom-kjv]
                                 [--group 32] [--seeds 4] [--words 6,9] [--q4-0] [--dir DIR]

Needs numpy and safetensors (any Python environment with them; make_fixtures.py's venv has them).
"""
import argparse
import json
import os
import re
import shutil
import subprocess

import numpy as np
from safetensors.numpy import load_file, save_file

GRID = [6.5 + 0.25 * c for c in range(12)]
LINEAR = re.compile(r"(self_attention\.(query_key_value|dense)|mlp\.dense_(h_to_4h|4h_to_h))\.weight$")


def f16(x):
    return np.asarray(x, np.float16).astype(np.float32)


def q4(w, s):
    v = w / s
    return np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -8, 7)


def fake_int4(W, G):
    """The dequantized int4 weights of W [R, K], groups of G columns (pollen's search)."""
    R, K = W.shape
    Wg = W.reshape(R, K // G, G)
    amax = np.abs(Wg).max(-1, keepdims=True)
    amax[amax == 0] = 1e-8
    wt = Wg * Wg + (Wg * Wg).mean(-1, keepdims=True)

    def score(D):
        s = f16(amax / D)
        q = q4(Wg, s)
        return s, q, (wt * (Wg - q * s) ** 2).sum(-1, keepdims=True)

    best, bq, be = score(7.0)
    bd = np.full_like(amax, 7.0)
    for D in GRID:
        s, q, e = score(np.float32(D))
        m = e < be
        best, bq, be, bd = np.where(m, s, best), np.where(m, q, bq), np.where(m, e, be), np.where(m, D, bd)
    for off in (-0.125, 0.125):
        s, q, e = score((bd + off).astype(np.float32))
        m = e < be
        best, bq, be = np.where(m, s, best), np.where(m, q, bq), np.where(m, e, be)
    return (bq * best).reshape(R, K)


def fake_q4_0(W):
    """llama.cpp's Q4_0 (ggml quantize_row_q4_0_ref) of W [R, K], dequantized: blocks of 32."""
    R, K = W.shape
    x = W.reshape(R, K // 32, 32).astype(np.float32)
    mx = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)   # first of the largest |x|
    d = mx / np.float32(-8)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, np.trunc(x * inv + np.float32(8.5))) - 8
    return (q * f16(d)).reshape(R, K)


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pollen", default="build/pollen")
    ap.add_argument("--model", default="tests/fixtures/models/bloom-kjv")
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--words", default="6,9")
    ap.add_argument("--q4-0", action="store_true", help="also llama.cpp's Q4_0 rounding (groups of 32)")
    ap.add_argument("--dir", default="build/bench-greedy-spread")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    os.environ.update(env)
    text = os.path.join(a.model, "heldout.txt")
    # Scratch: only a directory this script made (it holds MARK) is ever emptied; anything else
    # that exists and is not empty is refused rather than deleted.
    mark = os.path.join(a.dir, ".greedy_spread")
    if os.path.lexists(a.dir):
        if not os.path.isdir(a.dir) or os.path.islink(a.dir):
            raise SystemExit("greedy_spread.py: --dir %s is a symbolic link or not a directory; give a new path" % a.dir)
        if os.listdir(a.dir) and not os.path.isfile(mark):
            raise SystemExit("greedy_spread.py: --dir %s is not empty and was not made by this script; "
                             "give a new or empty path" % a.dir)
        shutil.rmtree(a.dir)
    os.makedirs(a.dir)
    open(mark, "w").close()
    verses = [l.split() for l in open(text, encoding="utf-8").read().splitlines()]
    verses = [v for v in verses if len(v) >= 8 and not re.fullmatch(r"[^ ]+( [^ ]+)? [0-9]+", " ".join(v))]
    words = [int(w) for w in a.words.split(",")]

    def greedy(set_dir, w):
        args = [a.pollen, "generate", set_dir]
        for v in verses:
            args += ["--prompt", " ".join(v[:w])]
        out = run(*args, "--max-new-tokens", "32", "--temperature", "0", "--json", "--quiet")
        return [m.split(",") for m in re.findall(r'"ids":\[([0-9,]*)\]', out)]

    def reshard(src, dst, *opts):
        run(a.pollen, "reshard", src, "-o", dst, "--tp", "1", "--quiet", *opts)

    base = os.path.join(a.dir, "fp16")
    reshard(a.model, base, "--dtype", "fp16")
    ref = {w: greedy(base, w) for w in words}

    def row(name, set_dir, *opts):
        j = json.loads(run(a.pollen, "perplexity", set_dir, "--file", text, "--ctx", "256", "--stride", "128",
                           "--kl-base", base, "--json", *opts))
        cells = []
        for w in words:
            got, eq, tot, ident = greedy(set_dir, w), 0, 0, 0
            for r, g in zip(ref[w], got):
                n = max(len(r), len(g))
                same = [i < len(r) and i < len(g) and r[i] == g[i] for i in range(n)]
                eq, tot, ident = eq + sum(same), tot + n, ident + all(same)
            cells.append("%.1f%% (%d / %d)" % (100 * eq / tot, ident, len(ref[w])))
        b = j["base"]
        print("| %s | %.3g | %.2f%% | %s |" % (name, b["kl_mean"], 100 * b["top1_agreement"], " | ".join(cells)), flush=True)

    print("| int4 g%d set | KL vs fp16 (mean) | top-1 agreement (held-out text) | %s |"
          % (a.group, " | ".join("greedy = fp16, %d-word prompts (identical)" % w for w in words)))
    print("|" + " --- |" * (3 + len(words)))
    own = os.path.join(a.dir, "int4")
    reshard(a.model, own, "--dtype", "int4", "--group-size", str(a.group))
    row("pollen reshard --dtype int4", own)
    src = load_file(os.path.join(a.model, "model.safetensors"))

    def fake_set(name, fn):
        t = dict(src)
        for n in sorted(t):
            if LINEAR.search(n):
                t[n] = fn(t[n].astype(np.float32)).astype(np.float16)
        d = os.path.join(a.dir, name)
        os.makedirs(d)
        for f in ("config.json", "tokenizer.json"):
            shutil.copy(os.path.join(a.model, f), d)
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        reshard(d, d + ".set", "--dtype", "fp16")
        return d + ".set"

    if a.q4_0:
        row("pollen reshard --dtype int4, --int-dot off", own, "--int-dot", "off")
        row("pollen's search, fake-quantized (fp16 kernels)", fake_set("pollen", lambda W: fake_int4(W, a.group)))
        if a.group == 32:
            row("llama.cpp Q4_0 rounding, fake-quantized (fp16 kernels)", fake_set("q4_0", fake_q4_0))
    for seed in range(1, a.seeds + 1):
        rng = np.random.default_rng(seed)
        t = dict(src)
        for n in sorted(t):
            if LINEAR.search(n):
                W = t[n].astype(np.float32)
                s = (1 + 0.03 * rng.standard_normal(W.shape[1])).astype(np.float32)
                t[n] = (fake_int4(W * s[None, :], a.group) / s[None, :]).astype(np.float16)
        d = os.path.join(a.dir, "seed%d" % seed)
        os.makedirs(d)
        for f in ("config.json", "tokenizer.json"):
            shutil.copy(os.path.join(a.model, f), d)
        save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        reshard(d, d + ".set", "--dtype", "fp16")
        row("columns rescaled, seed %d" % seed, d + ".set")


if __name__ == "__main__":
    main()
