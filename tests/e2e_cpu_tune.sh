#!/usr/bin/env bash
# e2e_cpu_tune.sh — --cpu-tune (kernels/cpu/tune.c CPU_TUNE_NOTE): the decode GEMVs' prefetch
# distance, one per weight kind (fp16, int8, int8_grouped, int4), and the fp16 tiles' of a few
# tokens (fp16_batch), measured once per machine, cached under
# $XDG_CACHE_HOME/pollen/cpu-tune.json (pollen's older caches replaced), reused,
# measured again on redo, left at the default with off; the cache written atomically and only
# over pollen's own file (anything else there is left as it is, with a warning naming it); a
# cache that cannot be written is a warning, never a failure; a bad value is refused by name;
# the distances timed again on the model's own decode step (TP 1, a model that streams from
# memory: PLN_CPU_TUNE_MODEL_MIB lowers the floor here), cached per machine and model, at most 32;
# and no distance changes a generated token or logit.
source "$(dirname "$0")/e2e.sh"
if ! "$POLLEN" reshard --help >/dev/null 2>&1; then echo "SKIP: needs pollen"; e2e_done; exit 0; fi
unset POLLEN_CPU_TUNE
# a small test weight: the sanitized build reads it slowly, and the choice is not what is tested
export PLN_CPU_TUNE_MIB=4
export XDG_CACHE_HOME=$TMP/cache
CACHE=$XDG_CACHE_HOME/pollen/cpu-tune.json
SET=$TMP/set
check "reshard a small set" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$SET" --tp 1 --dtype fp16 --quiet
bench() { "$POLLEN" bench "$SET" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --threads 1 --json "$@"; }
field() { grep -o "\"$1\":[^,}]*" | head -n 1 | cut -d: -f2 | tr -d '"'; }
# the distances of bench --json's cpu_pf_ahead object, "fp16 int8 int8_grouped int4 fp16_batch"
# in that order
KINDS="fp16 int8 int8_grouped int4 fp16_batch"
pfs() { local o; o=$(grep -o '"cpu_pf_ahead":{[^}]*}'); for k in $KINDS; do grep -o "\"$k\":[0-9]*" <<<"$o" | cut -d: -f2; done | tr '\n' ' '; }
# and the levels of its cpu_pf_l2 object (kernels/cpu/cpu.h PF_L2_NOTE), "true" or "false" each
l2s() { local o; o=$(grep -o '"cpu_pf_l2":{[^}]*}'); for k in $KINDS; do grep -o "\"$k\":[a-z]*" <<<"$o" | cut -d: -f2; done | tr '\n' ' '; }
in_candidates() { case $1 in 0|1024|2048|4096|8192|16384) return 0 ;; *) return 1 ;; esac; }
all_candidates() { local n=0 v; for v in $1; do in_candidates "$v" || return 1; n=$((n + 1)); done; test $n = 5; }

out=$(bench 2>"$TMP/err1")
check "auto with no cache: measured" test "$(field cpu_tune <<<"$out")" = measured
pf=$(pfs <<<"$out")
check "five measured distances, each one of the candidates ($pf)" all_candidates "$pf"
check "the cache file appeared" test -f "$CACHE"
check "no temporary file is left beside it" bash -c '! ls "$1"/pollen/*.tmp.* 2>/dev/null | grep -q .' _ "$XDG_CACHE_HOME"
check "the cache holds this machine, its tier and threads" grep -q "$(grep -m1 vendor_id /proc/cpuinfo | cut -d: -f2 | tr -d ' ').*, 1 threads," "$CACHE"
l2=$(l2s <<<"$out")
check "five levels, the fp16 tiles' in L1 ($l2)" bash -c '[[ "$1" =~ ^((true|false)\ ){4}false\ $ ]]' _ "$l2"
# each kind's distance beside its level, one line each
pairs=$(paste -d' ' <(tr ' ' '\n' <<<"$pf" | sed '/^$/d') <(tr ' ' '\n' <<<"$l2" | sed '/^$/d'))
check "an L2 level only at the default distance" bash -c '! awk '"'"'$2 == "true" && $1 != 8192'"'"' <<<"$1" | grep -q .' _ "$pairs"
# the cache keeps each choice as one number: the distance, plus 1 into L2 (kernels/backend.h PLN_TUNE_PF_L2)
enc=$(awk '{ printf "%d ", $1 + ($2 == "true") }' <<<"$pairs")
read -r pf16 pf8 pf8g pf4 pf16b <<<"$enc"
check "the cache records each distance chosen" bash -c 'grep -Eq "\"fp16\": $2,?$" "$1" && grep -Eq "\"int8\": $3,?$" "$1" &&
  grep -Eq "\"int8_grouped\": $4,?$" "$1" && grep -Eq "\"int4\": $5,?$" "$1" && grep -Eq "\"fp16_batch\": $6,?$" "$1"' _ \
  "$CACHE" "$pf16" "$pf8" "$pf8g" "$pf4" "$pf16b"
check "and each kind's GB/s at every candidate" test "$(grep -c '"16384": [0-9.]*' "$CACHE")" = 5
check "the four GEMV kinds' at 8 KiB into L2 too, not the fp16 tiles'" test "$(grep -c '"8193": [0-9.]*' "$CACHE")" = 4
check "no warning on a clean first run" test ! -s "$TMP/err1"

out=$(bench 2>/dev/null)
check "the second run uses the cache" test "$(field cpu_tune <<<"$out")" = cached
check "with the cached distances" test "$(pfs <<<"$out")" = "$pf"
check "the text report names every kind" bash -c '"$@" 2>&1 | grep -Eq "prefetch ahead \(bytes\): fp16 [0-9]+( into L2)?, int8 [0-9]+( into L2)?, int8_grouped [0-9]+( into L2)?, int4 [0-9]+( into L2)?, fp16_batch [0-9]+$"' _ \
  "$POLLEN" bench "$SET" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --threads 1
out=$(bench --threads 2 2>/dev/null)
check "another thread count is another machine entry: measured" test "$(field cpu_tune <<<"$out")" = measured
check "both entries kept" test "$(grep -c '"pf_ahead"' "$CACHE")" = 2

out=$(bench --cpu-tune off 2>/dev/null)
check "--cpu-tune off: the default distance for every kind" test "$(field cpu_tune <<<"$out"):$(pfs <<<"$out")" = "off:8192 8192 8192 8192 8192 "
check "--cpu-tune off: into L1" test "$(l2s <<<"$out")" = "false false false false false "
out=$(POLLEN_CPU_TUNE=off bench 2>/dev/null)
check "POLLEN_CPU_TUNE=off does the same" test "$(field cpu_tune <<<"$out")" = off
out=$(bench --cpu-tune redo 2>/dev/null)
check "--cpu-tune redo measures though a cache exists" test "$(field cpu_tune <<<"$out")" = measured
check_fails "--cpu-tune with a bad value" "pollen: --cpu-tune: 'sometimes' is not one of auto, off, redo" bench --cpu-tune sometimes
check_fails "POLLEN_CPU_TUNE with a bad value" "POLLEN_CPU_TUNE: 'x' is not one of auto, off, redo" env POLLEN_CPU_TUNE=x \
  "$POLLEN" bench "$SET" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --json

# an entry pollen did not write (a distance never measured): a warning naming the file and the
# field, measured again, the entry replaced
sed -i 's/"int4": [0-9][0-9]*/"int4": 12345/' "$CACHE"
out=$(bench --threads 1 2>"$TMP/err2")
check "a bad cached distance: measured again" test "$(field cpu_tune <<<"$out")" = measured
check "the warning names the file, the field and the kind" grep -q "$CACHE: its entry for this machine has \"pf_ahead\" \"int4\": 12345" "$TMP/err2"
check "and that entry was replaced, the other (2 threads) left" test "$(grep -c '"int4": 12345' "$CACHE")" = 1
sed -i 's/"int8_grouped": [0-9][0-9]*/"int8_grouped": "x"/' "$CACHE"
out=$(bench --threads 1 2>"$TMP/err2b")
check "an entry without one kind's distance: measured again" test "$(field cpu_tune <<<"$out")" = measured
check "the warning names the missing kind" grep -q "has no integer \"pf_ahead\" \"int8_grouped\"" "$TMP/err2b"

# pollen's own older caches (version 1: one distance for every kind; version 2: no fp16_batch;
# version 3: picked with the default kept within 2 % of the fastest; version 4: no L2 candidate):
# measured, replaced by version 5
for old in '{"version": 1, "machines": {"AuthenticAMD x": {"pf_ahead": 8192, "gemv_gbs": {}}}}' \
    '{"version": 2, "machines": {"AuthenticAMD x": {"pf_ahead": {"fp16": 8192, "int8": 8192, "int8_grouped": 8192, "int4": 8192}}}}' \
    '{"version": 3, "machines": {"AuthenticAMD x": {"pf_ahead": {"fp16": 16384, "int8": 8192, "int8_grouped": 8192, "int4": 8192, "fp16_batch": 8192}}}}' \
    '{"version": 4, "machines": {"AuthenticAMD x": {"pf_ahead": {"fp16": 8192, "int8": 8192, "int8_grouped": 8192, "int4": 8192, "fp16_batch": 0}}}}'; do
  printf '%s\n' "$old" >"$CACHE"
  v=$(grep -o '"version": [0-9]' <<<"$old")
  out=$(bench 2>"$TMP/err2c")
  check "a $v cache: measured, no warning" bash -c 'test "$1" = measured && test ! -s "$2"' _ "$(field cpu_tune <<<"$out")" "$TMP/err2c"
  check "and replaced by a version-5 cache without the old entry" bash -c 'grep -q "\"version\": 5" "$1" && ! grep -q "AuthenticAMD x" "$1"' _ "$CACHE"
  out=$(bench 2>/dev/null)
  check "which the next run uses ($v before)" test "$(field cpu_tune <<<"$out")" = cached
done

# a file that is not pollen's cache: left exactly as it is, the run goes on measured
for body in 'not json' '{"version": 6, "machines": {}}' '{"version": 0, "machines": {}}' '[1, 2, 3]'; do
  printf '%s' "$body" > "$CACHE"
  out=$(bench 2>"$TMP/err3")
  check "foreign cache ($body): the run goes on, measured" test "$(field cpu_tune <<<"$out")" = measured
  check "foreign cache ($body): the warning names the file" grep -q "pollen: warning: $CACHE .*left as it is" "$TMP/err3"
  check "foreign cache ($body): not overwritten" test "$(cat "$CACHE")" = "$body"
done
rm -f "$CACHE"
mkdir "$CACHE"
out=$(bench 2>"$TMP/err4")
check "a directory at the cache's path: measured, left alone" bash -c 'test "$1" = measured && test -d "$2"' _ "$(field cpu_tune <<<"$out")" "$CACHE"
check "and said so" grep -q "is not a regular file" "$TMP/err4"
rmdir "$CACHE"
ln -s "$TMP/elsewhere" "$CACHE"
out=$(bench 2>/dev/null)
check "a symlink at the cache's path is not followed" bash -c 'test -L "$1" && test ! -e "$2"' _ "$CACHE" "$TMP/elsewhere"
rm -f "$CACHE"

# a cache that cannot be written: a warning, the run goes on
touch "$TMP/file"
out=$(XDG_CACHE_HOME=$TMP/file/sub bench 2>"$TMP/err5")
check "an unwritable cache directory: the run goes on, measured" test "$(field cpu_tune <<<"$out")" = measured
check "and a warning says what could not be made" grep -q "pollen: warning: cpu tune: cannot create $TMP/file/sub" "$TMP/err5"
XDG_CACHE_HOME=$TMP/file/sub "$POLLEN" generate "$SET" --token-ids 5,9 --max-new-tokens 1 --quiet --json >"$TMP/out6" 2>"$TMP/err6"
check "generate --quiet: the warning on stderr, the results alone on stdout" \
  bash -c 'grep -q "cannot create" "$1" && grep -q "^{" "$2" && ! grep -q warning "$2"' _ "$TMP/err6" "$TMP/out6"

# the distances timed on the model's own decode step (tune.c CPU_TUNE_MODEL_NOTE): not for a
# model whose step reads less than 64 MiB (this one), unless PLN_CPU_TUNE_MODEL_MIB lowers the floor
out=$(bench 2>/dev/null)
check "a small model: its steps not timed (cpu_tune_model null)" test "$(field cpu_tune_model <<<"$out")" = null
check "and no model in the cache" bash -c '! grep -q "\"models\"" "$1"' _ "$CACHE"
export PLN_CPU_TUNE_MODEL_MIB=0
out=$(bench 2>"$TMP/errm1")
check "the floor at 0: the model's steps timed" test "$(field cpu_tune_model <<<"$out")" = measured
"$POLLEN" bench "$SET" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --threads 1 --cpu-tune redo >"$TMP/outm1" 2>"$TMP/errm1"
check "bench names where they came from" grep -q "^cpu tune: measured (--cpu-tune), on this model.s steps: measured, prefetch ahead" "$TMP/outm1"
"$POLLEN" generate "$SET" --token-ids 5,9 --max-new-tokens 1 --threads 1 --cpu-tune redo >/dev/null 2>"$TMP/errm1"
check "generate says so on stderr, with the way to skip it" grep -q "pollen: cpu tune: timing this model's decode step at each prefetch distance (21 steps, once per machine and model; --cpu-tune off skips it)" "$TMP/errm1"
check "the cache holds the machine and the model (layout, shapes, dtype, int-dot)" \
  grep -q ", 1 threads, .* | bloom-tp-v1, hidden 64, 2 layers, 4 heads, vocabulary [0-9]*, fp16 group 0, [0-9]* bytes, int-dot off, batch-invariant off\": {" "$CACHE"
check "with the fp16 GEMVs' distance and its step time at every candidate" \
  bash -c 'grep -A3 "\"pf_ahead\": {" "$1" | grep -Eq "\"fp16\": (0|1024|2048|4096|8192|8193|16384)$" && test "$(grep -c "\"8193\": [0-9.]*" "$1")" = 5' _ "$CACHE"
out=$(bench 2>"$TMP/errm2")
check "the second run uses the model's cached distances" test "$(field cpu_tune_model <<<"$out")" = cached
check "quietly" bash -c '! grep -q "timing this model" "$1"' _ "$TMP/errm2"
check "bench names where they came from, cached" bash -c '"$@" 2>&1 | grep -q "^cpu tune: cached (--cpu-tune), on this model.s steps: cached, prefetch ahead"' _ \
  "$POLLEN" bench "$SET" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --threads 1
out=$(bench --cpu-tune redo 2>/dev/null)
check "redo times the model's steps again" test "$(field cpu_tune_model <<<"$out")" = measured
out=$(bench --cpu-tune off 2>/dev/null)
check "off times nothing" test "$(field cpu_tune_model <<<"$out")" = null
out=$(bench --int-dot on 2>/dev/null)
check "another int-dot choice is another model entry" bash -c 'test "$1" = measured && test "$(grep -c "\"step_ms\"" "$2")" = 2' _ \
  "$(field cpu_tune_model <<<"$out")" "$CACHE"
# a set of two kinds (int8 per row, its embedding and head fp16): each timed, the larger first
check "reshard an int8 set" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/set8" --tp 1 --dtype int8 --quiet
"$POLLEN" generate "$TMP/set8" --token-ids 5,9 --max-new-tokens 1 --threads 1 --cpu-tune auto >/dev/null 2>"$TMP/errm4"
check "an int8 set with an fp16 head: two kinds, 42 steps" grep -q "at each prefetch distance (42 steps" "$TMP/errm4"
check "both kinds' choices cached for it" bash -c 'grep -A6 "int8 group 0, [0-9]* bytes, int-dot off, batch-invariant off\": {" "$1" | grep -q "\"pf_ahead\": {" &&
  grep -A12 "int8 group 0, [0-9]* bytes, int-dot off, batch-invariant off\": {" "$1" | grep -Eq "\"fp16\": [0-9]+,?$" &&
  grep -A12 "int8 group 0, [0-9]* bytes, int-dot off, batch-invariant off\": {" "$1" | grep -Eq "\"int8\": [0-9]+,?$"' _ "$CACHE"
out=$(bench --batch-invariant 2>/dev/null)
check "the batch-invariant mode (other kernels for a token) is another model entry" bash -c 'test "$1" = measured && grep -q "batch-invariant on\": {" "$2"' _ \
  "$(field cpu_tune_model <<<"$out")" "$CACHE"
check_fails "PLN_CPU_TUNE_MODEL_MIB with a bad value" "PLN_CPU_TUNE_MODEL_MIB x: give 0..1048576" env PLN_CPU_TUNE_MODEL_MIB=x \
  "$POLLEN" bench "$SET" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --cpu-tune redo --json
# an entry pollen did not write: a warning naming the field, timed again, replaced
sed -i 's/"fp16": \(0\|1024\|2048\|4096\|8192\|8193\|16384\)$/"fp16": 777/' "$CACHE"
out=$(bench 2>"$TMP/errm3")
check "a bad cached model distance: timed again" test "$(field cpu_tune_model <<<"$out")" = measured
check "the warning names the file and the field" grep -q "$CACHE: its entry for this model has \"pf_ahead\" \"fp16\" not a GEMV kind" "$TMP/errm3"
check "and that entry was replaced, the others (int-dot on, batch-invariant on) left" test "$(grep -c '"fp16": 777' "$CACHE")" = 2
# at most 32 models: the oldest goes first
fake=""
for i in $(seq -w 0 39); do fake+="\"model $i\": {\"pf_ahead\": {}, \"measured_at\": \"2001-01-01T00:00:${i}Z\"}, "; done
sed -i "s/\"models\": {/\"models\": {$fake/" "$CACHE"
check "40 more models written into the cache" test "$(grep -o '"measured_at": "2001-' "$CACHE" | wc -l)" = 40
out=$(bench --cpu-tune redo 2>/dev/null)
check "a full cache: 32 models kept (the 4 measured here, 28 of the 40)" \
  test "$(grep -c '"step_ms"' "$CACHE"):$(grep -c '"measured_at": "2001-' "$CACHE")" = 4:28
check "the newest kept, the oldest dropped" bash -c '! grep -q "\"model 11\"" "$1" && grep -q "\"model 12\"" "$1" && test "$(grep -c "int-dot o[nf]f*, batch-invariant o[nf]f*\": {" "$1")" = 4' _ "$CACHE"
if command -v mpirun >/dev/null; then
  check "reshard TP 2" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/set2" --tp 2 --dtype fp16 --quiet
  out=$(timeout 120 "$POLLEN" bench "$TMP/set2" --prompt-len 4 --batch 1 --steps 1 --context 4 --mbu off --threads 1 --json 2>/dev/null)
  check "TP 2: the model's steps are not timed (collectives every rank must join)" test "$(field cpu_tune_model <<<"$out")" = null
fi

# the distance decides only what is asked for early: the same tokens and logits at off and auto
# (the model's steps timed as well: PLN_CPU_TUNE_MODEL_MIB=0 above)
ids="--token-ids 5,9,14,3"
gen() { # gen MODE: the JSON of a greedy generation, the logits in $TMP/MODE.st
  # shellcheck disable=SC2086
  "$POLLEN" generate "$SET" $ids --max-new-tokens 6 --cpu-tune "$1" --quiet --json --dump-logits "$TMP/$1.st" >"$TMP/$1.json"
}
check "generate --cpu-tune off" gen off
check "generate --cpu-tune redo" gen redo
check "the same logits, bit for bit" cmp "$TMP/off.st" "$TMP/redo.st"
check "the same tokens" bash -c 'diff <(grep -o "\"ids\":\[[^]]*\]" "$1") <(grep -o "\"ids\":\[[^]]*\]" "$2")' _ "$TMP/off.json" "$TMP/redo.json"
e2e_done
