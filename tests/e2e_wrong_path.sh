#!/usr/bin/env bash
# e2e_wrong_path.sh — the paths a new user gets wrong, each with a message that says what to give
# instead: a rank file or the manifest where the set's directory belongs (generate, verify,
# inspect), and a shard set (or one of its files) given to reshard as if it were a checkpoint.
source "$(dirname "$0")/e2e.sh"
export OMP_NUM_THREADS=1
F=tests/fixtures/models/bloom-4h/fp16-st
check "reshard a set" "$POLLEN" reshard $F -o "$TMP/s" --tp 1 --dtype fp16 --quiet
R="$TMP/s/rank-0-of-1.pln"
check_fails "generate on a rank file: names the set's directory" \
  "$R is a rank file of a shard set; give the set's directory \\($TMP/s\\)" \
  "$POLLEN" generate "$R" --token-ids 5,6 --max-new-tokens 1
check_fails "verify on a rank file: the same" "$R is a rank file of a shard set; give the set's directory" \
  "$POLLEN" verify "$R"
check_fails "generate on the manifest: names the set's directory" \
  "$TMP/s/manifest.json is the manifest of a shard set; give the set's directory \\($TMP/s\\)" \
  "$POLLEN" generate "$TMP/s/manifest.json" --token-ids 5,6 --max-new-tokens 1
echo hello >"$TMP/plain.txt"
check_fails "generate on some other file: not a shard set" "plain.txt is a file, not a pollen shard set" \
  "$POLLEN" generate "$TMP/plain.txt" --token-ids 5,6 --max-new-tokens 1
for what in "$TMP/s" "$R"; do
  check_fails "reshard $(basename "$what"): already a pollen shard set, names its source" \
    "is already a pollen shard set.*not a Hugging Face checkpoint: give the checkpoint it was made from \\($F, as its manifest records\\)" \
    "$POLLEN" reshard "$what" -o "$TMP/again" --tp 1 --dtype fp16
done
check "nothing written by the refused reshards" test ! -e "$TMP/again"
e2e_done
