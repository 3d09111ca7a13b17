#!/usr/bin/env bash
# e2e_format_doc.sh — proves docs/FORMAT.md: tests/tools/read_shard.py, a reader written from the
# document alone (stdlib Python, its own XXH3), must validate pollen-written sets, verify every
# checksum, and agree with `pollen inspect --json` on names, dtypes, shapes, offsets, checksums and
# values (int8 and int4 dequantized as the document says). Needs python3; SKIPs without it.
source tests/e2e.sh
HELPER=${PLN_BUILD:-build}/tests/test_shard
PY=tests/tools/read_shard.py
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIP: python3 not found (the independent reader is a Python script)"
  e2e_done; exit $?
fi

# Compares the first 8 values of tensor $3 of set $1 (rank $2) between the two readers.
same_head() {
  local set=$1 rank=$2 name=$3
  "$POLLEN" inspect "$set" --tensor "$name" --head 8 --json >"$TMP/h.json" &&
  python3 "$PY" "$set" --json >"$TMP/p.json" &&
  python3 - "$TMP/h.json" "$TMP/p.json" "$rank" "$name" <<'EOF'
import json, sys
h = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2])); rank = int(sys.argv[3]); name = sys.argv[4]
a = [t["head"] for t in h["tensors"] if t["rank"] == rank and t["name"] == name][0]
b = [t["head"] for t in p if t["rank"] == rank and t["name"] == name][0]
print(name, "rank", rank, "pollen", a[:4], "doc reader", b[:4])
sys.exit(0 if len(a) == 8 and a == b else 1)
EOF
}

check_set() { # check_set DIR LABEL
  local d=$1 label=$2
  check "$label: the document's reader accepts the set and every checksum" python3 "$PY" "$d"
  "$POLLEN" inspect "$d" --json >"$TMP/inspect.json"
  check "$label: both readers agree on every tensor" python3 "$PY" "$d" --against "$TMP/inspect.json"
}

S8=$TMP/int8; S16=$TMP/fp16; SG=$TMP/g16
check "helper: int8 tp2" "$HELPER" --write-sample "$S8" --tp 2 --int8
check "helper: fp16 tp1" "$HELPER" --write-sample "$S16" --tp 1
check "helper: int8 tp2 group 16 + int8 embedding" "$HELPER" --write-sample "$SG" --tp 2 --int8 --group 16 --quantize-embedding
check_set "$S8" "int8 tp2"
check_set "$S16" "fp16 tp1"
check_set "$SG" "int8 g16 tp2"
check "values: fp16 embedding" same_head "$S16" 0 word_embeddings.weight
check "values: int8 per-channel dequantized" same_head "$S8" 1 h.1.mlp.dense_h_to_4h.weight
check "values: int8 group-16 dequantized" same_head "$SG" 0 h.0.self_attention.dense.weight
check "values: int8 embedding dequantized" same_head "$SG" 1 word_embeddings.weight
check "values: LayerNorm" same_head "$SG" 1 ln_f.weight

# A single rank file, with NaN/Inf and group scales.
"$HELPER" --write-special "$TMP/special.pln"
check "single rank file" python3 "$PY" "$TMP/special.pln"
"$POLLEN" inspect "$TMP/special.pln" --json >"$TMP/sp.json"
check "single rank file agrees with inspect" python3 "$PY" "$TMP/special.pln" --against "$TMP/sp.json"

# The document's reader must also reject what pollen rejects.
cp -r "$S8" "$TMP/flip"
python3 - "$TMP/flip/rank-1-of-2.pln" <<'EOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
b[-4096] ^= 1  # first byte of the last tensor, ln_f.bias
open(p, "wb").write(b)
EOF
check_fails "doc reader: flipped data byte" "checksum mismatch" python3 "$PY" "$TMP/flip"
cp "$S8/rank-0-of-2.pln" "$TMP/t.pln"; truncate -s 6000 "$TMP/t.pln"
check_fails "doc reader: truncated file" "file_size" python3 "$PY" "$TMP/t.pln"
check_fails "pollen: truncated file" "header says" "$POLLEN" inspect "$TMP/t.pln"

# Sets written by `pollen reshard` (when this build has it) must read the same way.
if "$POLLEN" reshard --help >/dev/null 2>&1 && [ -d tests/fixtures/models/bloom-4h ]; then
  R1=$TMP/r-int8; R2=$TMP/r-fp16
  check "reshard bloom-4h tp2 int8" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp32-st -o "$R1" --tp 2 --dtype int8
  [ -d "$R1" ] && check_set "$R1" "reshard int8 tp2"
  check "reshard bloom-6h tp3 fp16" "$POLLEN" reshard tests/fixtures/models/bloom-6h/fp32-st -o "$R2" --tp 3 --dtype fp16
  [ -d "$R2" ] && check_set "$R2" "reshard fp16 tp3"
  R3=$TMP/r-int4
  check "reshard bloom-6h tp3 int4 g32 + int8 embedding" "$POLLEN" reshard tests/fixtures/models/bloom-6h/fp32-st -o "$R3" \
    --tp 3 --dtype int4 --group-size 32 --quantize-embedding
  [ -d "$R3" ] && check_set "$R3" "reshard int4 tp3"
  check "values: int4 dequantized (packed nibbles)" same_head "$R3" 2 h.1.mlp.dense_4h_to_h.weight
  check "values: int4 qkv dequantized" same_head "$R3" 0 h.0.self_attention.query_key_value.weight
  check "values: int8 embedding of an int4 set" same_head "$R3" 1 word_embeddings.weight
  check "doc reader: one int4 rank file alone" python3 "$PY" "$R3/rank-1-of-3.pln"
else
  echo "SKIP: pollen reshard not in this build"
fi
e2e_done
