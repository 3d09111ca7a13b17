#!/usr/bin/env python3
"""read_shard.py — a second, minimal reader of pollen shard sets, written from docs/FORMAT.md alone
(standard library only; XXH3-64 is implemented below from the xxHash specification).

  read_shard.py PATH                    PATH: a shard set directory or one rank file. Validates
                                        everything FORMAT.md says a reader must check, verifies
                                        every checksum, prints one line per tensor.
  read_shard.py PATH --json             the same as JSON: [{rank, name, dtype, shape, offset,
                                        nbytes, xxh3, head}] where head = first 8 values
                                        (int8 and packed int4 weights dequantized with their
                                        _scale).
  read_shard.py SET --against FILE      compares with `pollen inspect SET --json` output in FILE:
                                        names, dtypes, shapes, offsets, sizes, checksums, config.

Exit status 0 if the set is valid (and matches), 1 with a message on stderr otherwise.
"""
import json
import math
import os
import struct
import sys

M64 = (1 << 64) - 1

# ---- XXH3-64, seed 0, default secret (xxHash >= 0.8 specification) -------------------------------
SECRET = bytes([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
])
P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2, P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P64_4, P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
MX1, MX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25


def r64(b, o):
    return int.from_bytes(b[o:o + 8], "little")


def r32(b, o):
    return int.from_bytes(b[o:o + 4], "little")


def fold(a, b):
    p = (a & M64) * (b & M64)
    return (p ^ (p >> 64)) & M64


def avalanche(h):
    h ^= h >> 37
    h = (h * MX1) & M64
    return h ^ (h >> 32)


def xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * P64_2) & M64
    h ^= h >> 29
    h = (h * P64_3) & M64
    return h ^ (h >> 32)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def mix16(b, o, so):
    return fold(r64(b, o) ^ r64(SECRET, so), r64(b, o + 8) ^ r64(SECRET, so + 8))


def xxh3(b):
    n = len(b)
    if n == 0:
        return xxh64_avalanche(r64(SECRET, 56) ^ r64(SECRET, 64))
    if n <= 3:
        c = (b[0] << 16) | (b[n >> 1] << 24) | b[n - 1] | (n << 8)
        return xxh64_avalanche(c ^ (r32(SECRET, 0) ^ r32(SECRET, 4)))
    if n <= 8:
        x = (r32(b, n - 4) + (r32(b, 0) << 32)) ^ (r64(SECRET, 8) ^ r64(SECRET, 16))
        x ^= rotl(x, 49) ^ rotl(x, 24)
        x = (x * MX2) & M64
        x ^= (x >> 35) + n
        x = (x * MX2) & M64
        return x ^ (x >> 28)
    if n <= 16:
        lo = r64(b, 0) ^ (r64(SECRET, 24) ^ r64(SECRET, 32))
        hi = r64(b, n - 8) ^ (r64(SECRET, 40) ^ r64(SECRET, 48))
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return avalanche((n + swapped + hi + fold(lo, hi)) & M64)
    if n <= 128:
        acc = (n * P64_1) & M64
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += mix16(b, 48, 96) + mix16(b, n - 64, 112)
                acc += mix16(b, 32, 64) + mix16(b, n - 48, 80)
            acc += mix16(b, 16, 32) + mix16(b, n - 32, 48)
        acc += mix16(b, 0, 0) + mix16(b, n - 16, 16)
        return avalanche(acc & M64)
    if n <= 240:
        acc = (n * P64_1) & M64
        for i in range(8):
            acc += mix16(b, 16 * i, 16 * i)
        acc = avalanche(acc & M64)
        for i in range(8, n // 16):
            acc += mix16(b, 16 * i, 16 * (i - 8) + 3)
        acc += mix16(b, n - 16, 136 - 17)
        return avalanche(acc & M64)
    # long input: 64-byte stripes, 16 stripes per block, scramble after each block
    acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1]
    skeys = [[r64(SECRET, s * 8 + 8 * i) for i in range(8)] for s in range(16)]
    last_key = [r64(SECRET, 192 - 64 - 7 + 8 * i) for i in range(8)]
    scr = [r64(SECRET, 192 - 64 + 8 * i) for i in range(8)]

    def stripe(off, keys):
        v = struct.unpack_from("<8Q", b, off)
        for i in range(8):
            k = v[i] ^ keys[i]
            acc[i ^ 1] = (acc[i ^ 1] + v[i]) & M64
            acc[i] = (acc[i] + (k & 0xFFFFFFFF) * (k >> 32)) & M64

    nb_blocks = (n - 1) // 1024
    for blk in range(nb_blocks):
        for s in range(16):
            stripe(blk * 1024 + s * 64, skeys[s])
        for i in range(8):
            a = acc[i]
            a ^= a >> 47
            a ^= scr[i]
            acc[i] = (a * P32_1) & M64
    nb_stripes = ((n - 1) - 1024 * nb_blocks) // 64
    for s in range(nb_stripes):
        stripe(nb_blocks * 1024 + s * 64, skeys[s])
    stripe(n - 64, last_key)
    res = (n * P64_1) & M64
    for i in range(4):
        res += fold(acc[2 * i] ^ r64(SECRET, 11 + 16 * i), acc[2 * i + 1] ^ r64(SECRET, 11 + 16 * i + 8))
    return avalanche(res & M64)


# ---- the rank file (FORMAT.md "Rank file") -------------------------------------------------------
DTYPES = {0: ("F32", 4), 1: ("F16", 2), 2: ("BF16", 2), 3: ("F64", 8), 4: ("I8", 1), 5: ("U8", 1),
          6: ("I16", 2), 7: ("I32", 4), 8: ("I64", 8), 9: ("BOOL", 1)}
SIZES = {name: size for name, size in DTYPES.values()}
UNPACK = {"F32": "f", "F16": "e", "F64": "d", "I8": "b", "U8": "B", "I16": "h", "I32": "i", "I64": "q", "BOOL": "B"}


class Bad(Exception):
    pass


def text_field(raw, what):
    z = raw.find(b"\0")
    if z <= 0:
        raise Bad(f"{what} is empty or not NUL-terminated")
    if any(c < 0x21 or c > 0x7E for c in raw[:z]) or any(raw[z:]):
        raise Bad(f"{what} has bad bytes")
    return raw[:z].decode("ascii")


def read_rank_file(path, verify=True):
    with open(path, "rb") as f:
        b = f.read()
    size = len(b)
    if size < 128:
        raise Bad(f"{path}: shorter than the 128-byte preamble")
    if b[0:8] != b"PLNSHARD":
        raise Bad(f"{path}: bad magic")
    version, psize, align, rank, n_ranks, flags = struct.unpack_from("<6I", b, 8)
    if version != 1 or psize != 128:
        raise Bad(f"{path}: version {version} / preamble size {psize} not supported")
    if r64(b, 120) != xxh3(b[0:120]):
        raise Bad(f"{path}: preamble checksum mismatch")
    if align < 4096 or align > (1 << 30) or align & (align - 1):
        raise Bad(f"{path}: bad alignment {align}")
    if n_ranks < 1 or rank >= n_ranks or flags != 0:
        raise Bad(f"{path}: bad rank {rank}/{n_ranks} or flags {flags}")
    layout = text_field(b[80:112], f"{path}: layout")
    n, toff, tsize, doff, dsize, fsize = struct.unpack_from("<6Q", b, 32)
    if fsize != size:
        raise Bad(f"{path}: file_size {fsize} but the file has {size} bytes")
    if n > (1 << 20) or toff != 128 or tsize != n * 256 or toff + tsize > size:
        raise Bad(f"{path}: bad table geometry")
    if doff % align or doff < toff + tsize or doff + dsize != size:
        raise Bad(f"{path}: bad data region")
    table = b[toff:toff + tsize]
    if r64(b, 112) != xxh3(table):
        raise Bad(f"{path}: table checksum mismatch")
    tensors, names, prev_end = [], set(), doff
    for i in range(n):
        e = table[256 * i:256 * (i + 1)]
        name = text_field(e[0:128], f"{path}: tensor #{i} name")
        code, ndim = struct.unpack_from("<2I", e, 128)
        if code not in DTYPES or not 1 <= ndim <= 8:
            raise Bad(f"{path}: {name}: bad dtype {code} or ndim {ndim}")
        dims = struct.unpack_from("<8Q", e, 136)
        if any(dims[ndim:]) or any(d >= 1 << 63 for d in dims[:ndim]) or any(e[224:256]):
            raise Bad(f"{path}: {name}: bad shape padding or reserved bytes")
        dname, esize = DTYPES[code]
        offset, nbytes, cks = struct.unpack_from("<3Q", e, 200)
        numel = math.prod(dims[:ndim])
        if numel * esize != nbytes:
            raise Bad(f"{path}: {name}: nbytes {nbytes} != shape x dtype size")
        if offset % align or offset < prev_end or offset + nbytes > size:
            raise Bad(f"{path}: {name}: offset {offset} misaligned, overlapping or out of the file")
        if name in names:
            raise Bad(f"{path}: duplicate tensor name {name}")
        if any(b[prev_end if i else toff + tsize:offset]):
            raise Bad(f"{path}: non-zero padding before tensor {name}")
        names.add(name)
        prev_end = offset + nbytes
        data = b[offset:offset + nbytes]
        if verify and xxh3(data) != cks:
            raise Bad(f"{path}: tensor {name}: checksum mismatch")
        tensors.append({"rank": rank, "name": name, "dtype": dname, "shape": list(dims[:ndim]),
                        "offset": offset, "nbytes": nbytes, "xxh3": f"{cks:016x}", "_data": data})
    if any(b[prev_end if n else toff + tsize:size]):
        raise Bad(f"{path}: non-zero padding after the last tensor")
    # int8 weights: dequantize the first values with the companion NAME_scale [rows, cols / G]
    by_name = {t["name"]: t for t in tensors}
    for t in tensors:
        k = min(8, t["nbytes"] // SIZES[t["dtype"]])
        if t["dtype"] == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + t["_data"][2 * j:2 * j + 2])[0] for j in range(k)]
        else:
            vals = list(struct.unpack_from("<%d%s" % (k, UNPACK[t["dtype"]]), t["_data"], 0))
        sc = by_name.get(t["name"] + "_scale")
        if t["dtype"] == "U8" and sc and len(t["shape"]) == 2:
            # packed int4 (FORMAT.md "int4 weight-only"): row of 2 x shape[1] columns; column k of
            # a row is nibble (k % 32 < 16 ? low : high) of byte 16 (k // 32) + k % 16, minus 8
            rb, scols = t["shape"][1], sc["shape"][1]
            cols = 2 * rb
            g = cols // scols
            vals = []
            for j in range(min(8, t["shape"][0] * cols)):
                row, k = j // cols, j % cols
                byte = t["_data"][row * rb + 16 * (k // 32) + k % 16]
                q = (byte & 0x0F if k % 32 < 16 else byte >> 4) - 8
                vals.append(q * struct.unpack_from("<e", sc["_data"], 2 * (row * scols + k // g))[0])
        elif t["dtype"] == "I8" and sc and len(t["shape"]) == 2:
            cols, scols = t["shape"][1], sc["shape"][1]
            g = cols // scols
            vals = [v * struct.unpack_from("<e", sc["_data"], 2 * ((j // cols) * scols + (j % cols) // g))[0]
                    for j, v in enumerate(vals)]
        t["head"] = [float(v) for v in vals]
    return {"path": path, "rank": rank, "n_ranks": n_ranks, "layout": layout, "alignment": align,
            "size": size, "xxh3": f"{r64(b, 120):016x}", "tensors": tensors}


# ---- the manifest and the bloom-tp-v1 list (FORMAT.md "Manifest", "Layout bloom-tp-v1") ----------
def bloom_tp_v1(m):
    c, tp = m["config"], m["tp"]
    H, L = c["hidden_size"], c["n_layer"]
    Hl, Vr = H // tp, m["vocab_padded"] // tp
    if m["dtype"] not in ("fp16", "int8", "int4"):
        raise Bad(f"unknown dtype {m['dtype']}")
    if m["dtype"] == "int4" and m["group_size"] not in (32, 64, 128):
        raise Bad(f"int4 group_size {m['group_size']} is not 32, 64 or 128")
    int8 = m["dtype"] if m["dtype"] != "fp16" else False   # "int8"/"int4": the four linear weights
    G = m["group_size"]
    out = []

    def lin(name, rows, cols, q):
        if q == "int4":
            out.append((name, "U8", [rows, cols // 2]))
            out.append((name + "_scale", "F16", [rows, cols // G]))
        elif q:
            out.append((name, "I8", [rows, cols]))
            out.append((name + "_scale", "F16", [rows, cols // (G or cols)]))
        else:
            out.append((name, "F16", [rows, cols]))

    lin("word_embeddings.weight", Vr, H, "int8" if int8 and m["quantize_embedding"] else False)
    out += [("word_embeddings_layernorm.weight", "F16", [H]), ("word_embeddings_layernorm.bias", "F16", [H])]
    for i in range(L):
        p = f"h.{i}."
        out += [(p + "input_layernorm.weight", "F16", [H]), (p + "input_layernorm.bias", "F16", [H])]
        lin(p + "self_attention.query_key_value.weight", 3 * Hl, H, int8)
        out.append((p + "self_attention.query_key_value.bias", "F16", [3 * Hl]))
        lin(p + "self_attention.dense.weight", H, Hl, int8)
        out += [(p + "self_attention.dense.bias", "F16", [H]),
                (p + "post_attention_layernorm.weight", "F16", [H]), (p + "post_attention_layernorm.bias", "F16", [H])]
        lin(p + "mlp.dense_h_to_4h.weight", 4 * Hl, H, int8)
        out.append((p + "mlp.dense_h_to_4h.bias", "F16", [4 * Hl]))
        lin(p + "mlp.dense_4h_to_h.weight", H, 4 * Hl, int8)
        out.append((p + "mlp.dense_4h_to_h.bias", "F16", [H]))
    out += [("ln_f.weight", "F16", [H]), ("ln_f.bias", "F16", [H])]
    return out


# ---- the llama-tp-v1 list (FORMAT.md "Layout llama-tp-v1") ----------------------------------------
def llama_tp_v1(m):
    c, tp = m["config"], m["tp"]
    H, L, D, nh, nkv, I = (c["hidden_size"], c["n_layer"], c["head_dim"], c["n_head"], c["num_key_value_heads"],
                           c["intermediate_size"])
    if nh % tp or I % tp or (nkv % tp and tp % nkv):
        raise Bad(f"heads {nh}/{nkv} or intermediate_size {I} do not split over tp {tp}")
    hl, kvl, Fl, Vr = nh // tp, (nkv // tp if nkv % tp == 0 else 1), I // tp, m["vocab_padded"] // tp
    Q = (hl + 2 * kvl) * D
    q = m["dtype"] if m["dtype"] != "fp16" else False
    emb = "int8" if q and m["quantize_embedding"] else False
    G = m["group_size"]
    out = []

    def lin(name, rows, cols, qq):
        if qq == "int4":
            out.append((name, "U8", [rows, cols // 2]))
            out.append((name + "_scale", "F16", [rows, cols // G]))
        elif qq:
            out.append((name, "I8", [rows, cols]))
            out.append((name + "_scale", "F16", [rows, cols // (G or cols)]))
        else:
            out.append((name, "F16", [rows, cols]))

    lin("model.embed_tokens.weight", Vr, H, emb)
    for i in range(L):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", "F16", [H]))
        lin(p + "self_attn.qkv_proj.weight", Q, H, q)
        if c["qkv_bias"]:
            out.append((p + "self_attn.qkv_proj.bias", "F16", [Q]))
        lin(p + "self_attn.o_proj.weight", H, hl * D, q)
        if c["o_bias"]:
            out.append((p + "self_attn.o_proj.bias", "F16", [H]))
        out.append((p + "post_attention_layernorm.weight", "F16", [H]))
        lin(p + "mlp.gate_up_proj.weight", 2 * Fl, H, q)
        lin(p + "mlp.down_proj.weight", H, Fl, q)
    out.append(("model.norm.weight", "F16", [H]))
    if not c["tie_word_embeddings"]:
        lin("lm_head.weight", Vr, H, emb)
    return out


LAYOUTS = {"bloom-tp-v1": bloom_tp_v1, "llama-tp-v1": llama_tp_v1}


def read_set(d):
    with open(os.path.join(d, "manifest.json"), "rb") as f:
        m = json.loads(f.read().decode("utf-8"), object_pairs_hook=no_dups)
    if m.get("format") != "pollen-shards" or m.get("version") not in (1, 2) or m.get("layout") not in LAYOUTS:
        raise Bad(f"{d}: unknown format/version/layout")
    if m["version"] >= 2:
        check_small_files(d, m)
    tp = m["tp"]
    if m["vocab_padded"] != -(-m["config"]["vocab_size"] // tp) * tp or m["config"]["n_head"] % tp:
        raise Bad(f"{d}: vocab_padded or n_head inconsistent with tp {tp}")
    if len(m["files"]) != tp:
        raise Bad(f"{d}: {len(m['files'])} files for tp {tp}")
    want = LAYOUTS[m["layout"]](m)
    ranks = []
    for r, fe in enumerate(m["files"]):
        if fe["rank"] != r or fe["name"] != f"rank-{r}-of-{tp}.pln":
            raise Bad(f"{d}: files[{r}] is {fe}")
        path = os.path.join(d, fe["name"])
        if os.path.getsize(path) != fe["size"]:
            raise Bad(f"{path}: size differs from the manifest")
        rf = read_rank_file(path)
        if rf["rank"] != r or rf["n_ranks"] != tp or rf["layout"] != m["layout"] or rf["xxh3"] != fe["xxh3"]:
            raise Bad(f"{path}: preamble disagrees with the manifest")
        got = [(t["name"], t["dtype"], t["shape"]) for t in rf["tensors"]]
        if got != want:
            raise Bad(f"{path}: tensor list differs from {m['layout']}")
        ranks.append(rf)
    return m, ranks


def canonical_config(c):
    """FORMAT.md "Checksums of the small files": the text whose XXH3 is config_xxh3."""
    eps = struct.unpack("<Q", struct.pack("<d", float(c["layer_norm_epsilon"])))[0]
    return (f"vocab_size={c['vocab_size']}\nhidden_size={c['hidden_size']}\nn_head={c['n_head']}\n"
            f"n_layer={c['n_layer']}\nlayer_norm_epsilon={eps:016x}\nbos_token_id={c['bos_token_id']}\n"
            f"eos_token_id={c['eos_token_id']}\npad_token_id={c['pad_token_id']}\n"
            f"torch_dtype={c.get('torch_dtype', '')}\n" + llama_canonical(c)).encode("utf-8")


def llama_canonical(c):
    """The Llama family's lines after torch_dtype (FORMAT.md "Layout llama-tp-v1"); none for BLOOM."""
    if "model_type" not in c:
        return ""
    bits = lambda x: f"{struct.unpack('<Q', struct.pack('<d', float(x)))[0]:016x}"
    rs = c["rope_scaling"]
    return (f"model_type={c['model_type']}\nnum_key_value_heads={c['num_key_value_heads']}\nhead_dim={c['head_dim']}\n"
            f"intermediate_size={c['intermediate_size']}\nmax_position_embeddings={c['max_position_embeddings']}\n"
            f"sliding_window={c['sliding_window']}\nrope_theta={bits(c['rope_theta'])}\nrope_type={rs['rope_type']}\n"
            f"rope_factor={bits(rs['factor'])}\nrope_low_freq_factor={bits(rs['low_freq_factor'])}\n"
            f"rope_high_freq_factor={bits(rs['high_freq_factor'])}\n"
            f"rope_original_max_position_embeddings={rs['original_max_position_embeddings']}\n"
            f"tie_word_embeddings={int(c['tie_word_embeddings'])}\nqkv_bias={int(c['qkv_bias'])}\no_bias={int(c['o_bias'])}\n"
            f"eos_token_ids={','.join(str(i) for i in c['eos_token_ids'])}\n")


def check_small_files(d, m):
    if m.get("config_xxh3") != f"{xxh3(canonical_config(m['config'])):016x}":
        raise Bad(f"{d}: config block checksum mismatch")
    for key in ("tokenizer", "hf_config"):
        name, want = m.get(key), m.get(key + "_xxh3")
        if name is None:
            if want is not None:
                raise Bad(f"{d}: {key}_xxh3 without {key}")
            continue
        if "/" in name or name in (".", ".."):
            raise Bad(f"{d}: {key} is not a plain file name")
        with open(os.path.join(d, name), "rb") as f:
            if want != f"{xxh3(f.read()):016x}":
                raise Bad(f"{d}: {name}: checksum mismatch")


def no_dups(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise Bad("duplicate JSON key")
    return dict(pairs)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = argv[1]
    try:
        if os.path.isdir(path):
            m, ranks = read_set(path)
        else:
            m, ranks = None, [read_rank_file(path)]
    except (Bad, OSError, ValueError, KeyError, TypeError, struct.error) as e:
        print(f"read_shard.py: {e}", file=sys.stderr)
        return 1
    rows = [{k: v for k, v in t.items() if k != "_data"} for rf in ranks for t in rf["tensors"]]
    if "--against" in argv:
        with open(argv[argv.index("--against") + 1]) as f:
            ins = json.load(f)
        theirs = [{k: t.get(k) for k in ("rank", "name", "dtype", "shape", "offset", "nbytes", "xxh3")} for t in ins["tensors"]]
        ours = [{k: t[k] for k in ("rank", "name", "dtype", "shape", "offset", "nbytes", "xxh3")} for t in rows]
        bad = [(a, b) for a, b in zip(ours, theirs) if a != b]
        if len(ours) != len(theirs) or bad:
            print(f"read_shard.py: {len(ours)} vs {len(theirs)} tensors; first difference: {bad[:1]}", file=sys.stderr)
            return 1
        if m is not None:
            for k in ("vocab_size", "hidden_size", "n_head", "n_layer", "eos_token_id"):
                if ins["config"][k] != m["config"][k]:
                    print(f"read_shard.py: config {k}: {ins['config'][k]} vs {m['config'][k]}", file=sys.stderr)
                    return 1
        print(f"read_shard.py: {len(ours)} tensors in {len(ranks)} rank file(s) match pollen inspect")
        return 0
    if "--json" in argv:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    if m is not None:
        c = m["config"]
        print(f"set: tp {m['tp']} dtype {m['dtype']} layout {m['layout']} vocab {c['vocab_size']} hidden {c['hidden_size']} "
              f"heads {c['n_head']} layers {c['n_layer']}")
    for t in rows:
        print(f"{t['rank']} {t['name']} {t['dtype']} {t['shape']} offset {t['offset']} nbytes {t['nbytes']} "
              f"xxh3 {t['xxh3']} head {' '.join('%.6g' % v for v in t['head'][:4])}")
    print(f"read_shard.py: {len(rows)} tensors in {len(ranks)} rank file(s), all checksums verified")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
