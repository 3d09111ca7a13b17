#!/usr/bin/env bash
# e2e_paths.sh — reshard and synth never destroy what they read: an output that is the source,
# holds it or lies inside it is refused before anything is written, however it is spelled (the
# same path, a trailing slash, "..", a relative path, symbolic links to it or to its files, a bind
# mount), with or without --force, and the whole source tree is byte-identical afterwards.
# --force replaces only an empty directory or an earlier pollen output (shard set, synth
# checkpoint), deletes only the files pollen writes, and names what it refuses.
source "$(dirname "$0")/e2e.sh"
P=$(realpath "$POLLEN")
FIX=$(realpath tests/fixtures/models/bloom-4h/fp16-st)

# tree_sum DIR: one checksum over every name (files, dirs, links with their targets) and every
# file's bytes under DIR.
tree_sum() {
  (cd "$1" && find . -printf '%y %p %l\n' | LC_ALL=C sort && \
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}
no_tmp_beside() { # no temporary sibling of $1 was left
  [ -z "$(ls -d "${1%/}".tmp-* "${1%/}".old-* 2>/dev/null)" ]
}
# refused WHAT REGEX TREE CMD...: the command exits non-zero with the message, TREE is unchanged
# and no temporary output is left beside the output path (the last argument after -o).
refused() {
  local what=$1 re=$2 tree=$3; shift 3
  local before; before=$(tree_sum "$tree")
  check_fails "$what: refused" "$re" "$@"
  check "$what: $tree byte-identical" test "$(tree_sum "$tree")" = "$before"
}

W=$TMP/w                        # W/src: the checkpoint; W is its parent
mkdir -p "$W"
cp -r "$FIX" "$W/src"
mkdir "$W/src/sub"               # a subdirectory of the source (an output must not go there either)
echo "notes" > "$W/src/sub/README"
RS="reshard --tp 1 --dtype fp16 --quiet"

# ---- OUT is the source, an ancestor of it, or inside it: every spelling, with --force ----
refused "-o SRC" "is the source" "$W" "$P" $RS "$W/src" -o "$W/src" --force
refused "-o SRC/ (trailing slash)" "is the source" "$W" "$P" $RS "$W/src" -o "$W/src/" --force
refused "-o SRC/sub/.. (dot-dot)" "is the source" "$W" "$P" $RS "$W/src" -o "$W/src/sub/.." --force
refused "-o SRC without --force" "is the source" "$W" "$P" $RS "$W/src" -o "$W/src"
refused "-o . from inside SRC" "name the output|is the source" "$W" bash -c "cd '$W/src' && '$P' $RS . -o ."
refused "relative -o ../../src from SRC/sub" "is the source" "$W" bash -c "cd '$W/src/sub' && '$P' $RS .. -o ../../src --force"
refused "relative -o ../src from SRC/sub (inside)" "inside the source" "$W" bash -c "cd '$W/src/sub' && '$P' $RS .. -o ../src --force"
refused "-o the parent of SRC" "contains the source" "$W" "$P" $RS "$W/src" -o "$W" --force
refused "-o the grandparent of SRC" "contains the source" "$W" "$P" $RS "$W/src" -o "$TMP" --force
refused "-o / " "contains the source" "$W" "$P" $RS "$W/src" -o / --force
refused "-o inside SRC" "inside the source" "$W" "$P" $RS "$W/src" -o "$W/src/out" --force
refused "-o inside a subdirectory of SRC" "inside the source" "$W" "$P" $RS "$W/src" -o "$W/src/sub/out"
check "nothing was created inside SRC" test ! -e "$W/src/out" -a ! -e "$W/src/sub/out"

# ---- through symbolic links ----
ln -s "$W/src" "$TMP/link"
ln -s "$W" "$TMP/wlink"
refused "SRC given as a link, -o its target" "is the source" "$W" "$P" $RS "$TMP/link" -o "$W/src" --force
refused "-o a link to SRC" "symbolic link" "$W" "$P" $RS "$W/src" -o "$TMP/link" --force
refused "-o SRC through a linked parent" "is the source" "$W" "$P" $RS "$W/src" -o "$TMP/wlink/src" --force
refused "-o a link to the parent" "symbolic link" "$W" "$P" $RS "$TMP/link" -o "$TMP/wlink" --force
refused "-o a link to the parent, trailing slash" "symbolic link" "$W" "$P" $RS "$TMP/link" -o "$TMP/wlink/" --force
refused "-o inside SRC through a link" "inside the source" "$W" "$P" $RS "$W/src" -o "$TMP/link/out" --force
refused "SRC as the index file, -o its directory" "contains the source" "$W" "$P" $RS "$W/src/model.safetensors.index.json" -o "$W/src" --force
refused "SRC as the index file, -o beside it" "inside the source" "$W" "$P" $RS "$W/src/model.safetensors.index.json" -o "$W/src/tp1"
# the Hugging Face cache layout: weight files and the tokenizer are links into a blob store
H=$TMP/hub; mkdir -p "$H/blobs" "$H/snap"
for f in "$FIX"/*; do b=$(basename "$f"); cp "$f" "$H/blobs/$b.blob"; ln -s "../blobs/$b.blob" "$H/snap/$b"; done
refused "-o the blob store the weights link into" "contains the source" "$H" "$P" $RS "$H/snap" -o "$H/blobs" --force
refused "-o the hub root" "contains the source" "$H" "$P" $RS "$H/snap" -o "$H" --force
check "the linked checkpoint still converts to a new place" "$P" $RS "$H/snap" -o "$TMP/hub-tp1"
# a tokenizer.json linked from elsewhere
T=$TMP/tokhome; mkdir -p "$T/shared" "$TMP/src2"
cp "$FIX/tokenizer.json" "$T/shared/tokenizer.json"
for f in "$FIX"/*; do [ "$(basename "$f")" = tokenizer.json ] || cp "$f" "$TMP/src2/"; done
ln -s "$T/shared/tokenizer.json" "$TMP/src2/tokenizer.json"
refused "-o the directory a linked tokenizer lives in" "contains the source" "$T" "$P" $RS "$TMP/src2" -o "$T/shared" --force
refused "-o the tokenizer's grandparent" "contains the source" "$T" "$P" $RS "$TMP/src2" -o "$T" --force

# ---- a bind mount of the source (an unprivileged mount namespace; skipped where unavailable) ----
if unshare -rm true 2>/dev/null; then
  mkdir -p "$TMP/mnt"
  before=$(tree_sum "$W")
  check_fails "-o a bind mount of SRC: refused" "is the source" \
    unshare -rm bash -c "mount --bind '$W/src' '$TMP/mnt' && '$P' $RS '$W/src' -o '$TMP/mnt' --force"
  check_fails "-o inside a bind mount of SRC: refused" "inside the source" \
    unshare -rm bash -c "mount --bind '$W/src' '$TMP/mnt' && '$P' $RS '$W/src' -o '$TMP/mnt/out' --force"
  check_fails "-o a bind mount of SRC's parent, SRC reached through it: refused" "contains the source" \
    unshare -rm bash -c "mount --bind '$W' '$TMP/mnt' && '$P' $RS '$TMP/mnt/src' -o '$W' --force"
  check "bind mounts: $W byte-identical" test "$(tree_sum "$W")" = "$before"
else
  echo "SKIP: bind mounts: no unprivileged mount namespaces here"
fi

# ---- synth: its tokenizer and config file are sources too; a synth checkpoint is pollen's own,
#      yet never replaced by a reshard that reads it ----
refused "synth -o the tokenizer's directory" "contains the source" "$T" \
  "$P" synth --model "$FIX/config.json" --tokenizer "$T/shared/tokenizer.json" -o "$T/shared" --force --quiet
cp "$FIX/config.json" "$T/cfg.json"
refused "synth -o the --model config's directory" "contains the source" "$T" \
  "$P" synth --model "$T/cfg.json" -o "$T" --force --quiet
check "synth a checkpoint" "$P" synth --model "$FIX/config.json" -o "$TMP/syn" --quiet
check "synth marks it as pollen's" grep -q '"pollen synth"' "$TMP/syn/pollen-synth.json"
refused "reshard a synth checkpoint onto itself" "is the source" "$TMP/syn" "$P" $RS "$TMP/syn" -o "$TMP/syn" --force
check "synth --force replaces its own checkpoint" "$P" synth --model "$FIX/config.json" -o "$TMP/syn" --seed 7 --force --quiet
check "the replacement is the new one" grep -q '"seed": 7' "$TMP/syn/pollen-synth.json"
check "no .old or .tmp left after a replacement" no_tmp_beside "$TMP/syn"

# ---- --force: what it replaces and what it refuses ----
O=$TMP/out
mkdir "$O"
check "--force into an empty directory" "$P" $RS "$W/src" -o "$O" --force
check "an earlier shard set is replaced (TP 1 -> TP 2)" "$P" reshard "$W/src" -o "$O" --tp 2 --dtype fp16 --quiet --force
check "only the new set's files are there" test "$(ls "$O" | tr '\n' ' ')" = "config.json manifest.json rank-0-of-2.pln rank-1-of-2.pln tokenizer.json "
check "no .old or .tmp left after a replacement" no_tmp_beside "$O"
touch "$O/notes.txt"
refused "a shard set holding a file pollen did not write" "also holds notes.txt" "$TMP" "$P" $RS "$W/src" -o "$O" --force
rm "$O/notes.txt"
mkdir "$O/keep"
refused "a shard set holding a subdirectory" "also holds keep" "$TMP" "$P" $RS "$W/src" -o "$O" --force
rmdir "$O/keep"
check "reshard --force replaces a synth checkpoint" "$P" $RS "$W/src" -o "$TMP/syn" --force
check "... leaving only the shard set" test ! -e "$TMP/syn/pollen-synth.json" -a -e "$TMP/syn/manifest.json"
check "synth --force replaces a shard set" "$P" synth --model "$FIX/config.json" -o "$O" --force --quiet
rm "$O/pollen-synth.json"
refused "a checkpoint without synth's marker" "is not an earlier pollen output" "$TMP" \
  "$P" synth --model "$FIX/config.json" -o "$O" --force --quiet
D=$TMP/docs; mkdir "$D"; for i in 1 2 3 4 5 6; do echo $i > "$D/file$i.txt"; done
refused "a directory of other files" "holds file1.txt, file2.txt, file3.txt and 3 more" "$D" "$P" $RS "$W/src" -o "$D" --force
echo '{"format": "something-else"}' > "$D/manifest.json"
refused "a manifest.json that is not pollen's" "is not an earlier pollen output" "$D" "$P" $RS "$W/src" -o "$D" --force
refused "without --force a non-empty directory" "not empty \(holds" "$D" "$P" $RS "$W/src" -o "$D"
echo x > "$TMP/afile"
refused "-o an existing file" "not a directory" "$TMP/w" "$P" $RS "$W/src" -o "$TMP/afile" --force
check "the file is untouched" test "$(cat "$TMP/afile")" = x
mkdir "$TMP/emptytarget"; ln -s "$TMP/emptytarget" "$TMP/outlink"
refused "-o a link to an empty directory" "symbolic link" "$TMP/emptytarget" "$P" $RS "$W/src" -o "$TMP/outlink" --force
check "the link is still a link" test -L "$TMP/outlink"
check_fails "-o under a missing parent" "parent directory" "$P" $RS "$W/src" -o "$TMP/missing/out"

# ---- files the runtime writes never land in the shard set ----
S=$TMP/set; "$P" $RS "$W/src" -o "$S"
refused "generate --dump-logits into the set" "inside the source" "$S" \
  "$P" generate "$S" --prompt hi --max-new-tokens 1 --quiet --dump-logits "$S/rank-0-of-1.pln"
refused "serve --port-file into the set" "inside the source" "$S" \
  timeout 30 "$P" serve "$S" --port 0 --port-file "$S/manifest.json" --quiet

check "the source checkpoint still verifies against its set" "$P" verify "$S" --source "$W/src"
e2e_done
