#!/usr/bin/env bash
# e2e_output.sh — results on stdout, everything else (progress, timings, tables, warnings) on
# stderr: generate (--quiet still prints the text and the JSON; the timing line on stderr),
# reshard (per-tensor table only with --stats; the missing-tokenizer warning survives --quiet),
# verify (--quiet: the verdict only; --json: one object on stdout).
source "$(dirname "$0")/e2e.sh"
export OMP_NUM_THREADS=1
F=tests/fixtures/models/bloom-4h/fp16-st
# ---- reshard
"$POLLEN" reshard $F -o "$TMP/i8" --tp 2 --dtype int8 >"$TMP/r.out" 2>"$TMP/r.err"
check "reshard int8: exit 0" test $? = 0
check "reshard int8: nothing on stdout by default (no per-tensor table)" test ! -s "$TMP/r.out"
check "reshard int8: the one-line summary on stderr" grep -q "^wrote $TMP/i8: TP 2 int8, 2 files, " "$TMP/r.err"
check "reshard int8: the largest error in one line, pointing at --stats" \
  grep -q "largest quantization error: rel_rms .*--stats prints every tensor" "$TMP/r.err"
check "reshard int8: no table on stderr either" bash -c "! grep -q '^h\.0\.' '$TMP/r.err'"
"$POLLEN" reshard $F -o "$TMP/i8s" --tp 2 --dtype int8 --stats --quiet >"$TMP/s.out" 2>"$TMP/s.err"
check "reshard --stats: the table on stdout (header + 8 quantized weights)" \
  test "$(grep -c -E '^h\.[01]\.(self_attention|mlp)\..*weight ' "$TMP/s.out")" = 8
check "reshard --stats: with the header" grep -q "^tensor .*rel_rms" "$TMP/s.out"
check "reshard --stats --quiet: nothing on stderr" test ! -s "$TMP/s.err"
mkdir -p "$TMP/notok"
cp $F/config.json $F/*.safetensors $F/*.index.json "$TMP/notok/"
"$POLLEN" reshard "$TMP/notok" -o "$TMP/nt" --tp 1 --dtype fp16 --quiet >"$TMP/nt.out" 2>"$TMP/nt.err"
check "reshard --quiet without tokenizer.json: exit 0" test $? = 0
check "reshard --quiet without tokenizer.json: still warns that the set cannot serve" \
  grep -q "has no tokenizer.json.*cannot serve" "$TMP/nt.err"
check "reshard --quiet: stdout empty" test ! -s "$TMP/nt.out"
# a source tensor the layout does not use changes the set too: its warning also survives --quiet
mkdir -p "$TMP/extra"
cp $F/config.json $F/tokenizer.json $F/*.safetensors "$TMP/extra/"
hdr='{"extra.weight":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}'
{ printf "\\x$(printf %02x ${#hdr})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"; printf '%s' "$hdr"; printf '\x00\x3c\x00\x3c'; } \
  >"$TMP/extra/model-extra.safetensors"
sed 's|"weight_map": {|"weight_map": {\n    "extra.weight": "model-extra.safetensors",|' $F/model.safetensors.index.json \
  >"$TMP/extra/model.safetensors.index.json"
"$POLLEN" reshard "$TMP/extra" -o "$TMP/ex" --tp 1 --dtype fp16 --quiet >"$TMP/ex.out" 2>"$TMP/ex.err"
check "reshard --quiet with an unused source tensor: exit 0" test $? = 0
check "reshard --quiet: still warns that the unused tensor is ignored" \
  grep -q "source tensor extra.weight is not part of the bloom-tp-v1 layout; ignored" "$TMP/ex.err"
# ---- generate
"$POLLEN" reshard $F -o "$TMP/f1" --tp 1 --dtype fp16 2>"$TMP/f1.err"
check "reshard TP 1: the summary says 1 file" grep -q "^wrote $TMP/f1: TP 1 fp16, 1 file, " "$TMP/f1.err"
"$POLLEN" generate "$TMP/f1" --prompt "Hello" --max-new-tokens 4 --threads 1 >"$TMP/g.out" 2>"$TMP/g.err"
check "generate: the text on stdout" grep -q "^Hello" "$TMP/g.out"
check "generate: stdout holds only the text (one line)" test "$(wc -l <"$TMP/g.out")" = 1
check "generate: the timing line on stderr" grep -q "^load .* s | prefill .* | decode" "$TMP/g.err"
check "generate: the timing line counts in words (1 token, 3 steps, 1 thread)" \
  grep -q "^load .* s | prefill 1 token in .* | decode 3 steps, .* 1 thread/rank)$" "$TMP/g.err"
"$POLLEN" generate "$TMP/f1" --prompt "Hello" --max-new-tokens 4 --quiet >"$TMP/q.out" 2>"$TMP/q.err"
check "generate --quiet: exit 0" test $? = 0
check "generate --quiet: still prints the text" grep -q "^Hello" "$TMP/q.out"
check "generate --quiet: the same stdout as without it (no \"[1] \" for one prompt)" \
  test "$(cat "$TMP/q.out")" = "$(cat "$TMP/g.out")"
check "generate --quiet: nothing on stderr" test ! -s "$TMP/q.err"
"$POLLEN" generate "$TMP/f1" --prompt "Hello" --prompt "Hi" --max-new-tokens 2 --quiet >"$TMP/m.out" 2>"$TMP/m.err"
check "generate --quiet, two prompts: one numbered line each" \
  bash -c "test \$(wc -l <'$TMP/m.out') = 2 && grep -q '^\[1\] Hello' '$TMP/m.out' && grep -q '^\[2\] Hi' '$TMP/m.out'"
"$POLLEN" generate "$TMP/f1" --prompt "Hello" --prompt "Hi" --max-new-tokens 2 --json --quiet >"$TMP/j.out" 2>"$TMP/j.err"
check "generate --json --quiet: one JSON line with both results" \
  bash -c "test \$(wc -l <'$TMP/j.out') = 1 && test \$(grep -o '\"finish_reason\"' '$TMP/j.out' | wc -l) = 2"
check "generate --json --quiet: nothing on stderr" test ! -s "$TMP/j.err"
# a set without a tokenizer: the ids are the result (never an empty "[1] "), the reason on stderr
"$POLLEN" generate "$TMP/nt" --token-ids 5,17,42 --max-new-tokens 3 --quiet >"$TMP/n.out" 2>"$TMP/n.err"
check "generate on a set without a tokenizer: exit 0" test $? = 0
check "... prints the generated ids" grep -Eq '^[0-9]+ [0-9]+ [0-9]+$' "$TMP/n.out"
check "... and says why they are ids, even with --quiet" grep -q "records no tokenizer.*reshard with the model's tokenizer.json" "$TMP/n.err"
check_fails "a text prompt on a set without a tokenizer" "records no tokenizer.*--token-ids" \
  "$POLLEN" generate "$TMP/nt" --prompt hi --max-new-tokens 1
# ---- verify
"$POLLEN" verify "$TMP/i8" --source $F >"$TMP/v.out" 2>"$TMP/v.err"
check "verify --source: the per-tensor table on stdout" grep -q "ok (within recorded error)" "$TMP/v.out"
"$POLLEN" verify "$TMP/i8" --source $F --quiet >"$TMP/vq.out" 2>"$TMP/vq.err"
check "verify --quiet: exit 0" test $? = 0
check "verify --quiet: only the verdict line" bash -c "test \$(wc -l <'$TMP/vq.out') = 1 && grep -q '^verify: OK' '$TMP/vq.out'"
"$POLLEN" verify "$TMP/i8" --source $F --json >"$TMP/vj.out" 2>"$TMP/vj.err"
check "verify --json: exit 0, one line" bash -c "test \$(wc -l <'$TMP/vj.out') = 1"
check "verify --json: ok, TP, dtype and the tensors against the source" \
  grep -q '^{"ok":true,"set":"[^"]*","tp":2,"dtype":"int8",.*"problems":\[\],"tensors":\[{"tensor":"word_embeddings.weight"' "$TMP/vj.out"
check "verify --json: every tensor ok" bash -c "! grep -q '\"ok\":false' '$TMP/vj.out'"
cp -r "$TMP/i8" "$TMP/bad"
printf '\x55' | dd of="$TMP/bad/rank-1-of-2.pln" bs=1 seek=$((8192 + 777)) conv=notrunc status=none
"$POLLEN" verify "$TMP/bad" --quiet >"$TMP/bq.out" 2>"$TMP/bq.err"
check "verify --quiet on a corrupted set: exit 1" test $? = 1
check "verify --quiet: the problem on stderr" grep -q "checksum mismatch" "$TMP/bq.err"
check "verify --quiet: the FAILED verdict on stdout" grep -q "^verify: FAILED" "$TMP/bq.out"
"$POLLEN" verify "$TMP/bad" --json >"$TMP/bj.out" 2>/dev/null
check "verify --json on a corrupted set: exit 1" test $? = 1
check "verify --json: ok false and the problem" grep -q '^{"ok":false,.*"problems":\["[^"]*checksum mismatch' "$TMP/bj.out"
e2e_done
