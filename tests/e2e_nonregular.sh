#!/usr/bin/env bash
# e2e_nonregular.sh — a FIFO, a socket, a directory or a character device (/dev/zero's node)
# in place of each kind of file pollen reads (checkpoint weights, index, config.json,
# tokenizer.json, a shard set's manifest.json, config.json, tokenizer.json and rank files, synth's --model and --tokenizer)
# gives every command (reshard, inspect, verify, generate, serve, synth) a clear error naming
# the file and what it is, a non-zero exit, and never a hang: each run has 20 s.
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
[ -x "$HELPER" ] || { echo "SKIP: $HELPER not built"; e2e_done; exit; }
FIX=tests/fixtures/models/bloom-4h/fp16-st
KINDS="fifo socket dir chardev"

# make_kind KIND PATH: puts a non-regular file of that kind at PATH (replacing what was there).
make_kind() {
  rm -rf "$2"
  case $1 in
    fifo) mkfifo "$2" ;;
    socket) perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => $ARGV[0], Listen => 1) or die "$!"' "$2" ;;
    dir) mkdir "$2" ;;
    # a device node where the system lets us make one (root), else a link to one (which a shard
    # set also refuses as leading out of its directory: either way a clear error naming the file)
    chardev) mknod "$2" c 1 5 2>/dev/null || ln -s /dev/zero "$2" ;;
  esac
}
what_of() {
  case $1 in
    fifo) echo "is a FIFO" ;; socket) echo "is a socket" ;; dir) echo "is a directory" ;;
    chardev) echo "(is a character device|leads out of the set directory \(to /dev/zero\))" ;;
  esac
}
# bounded CMD...: the command with a 20 s limit (a hang fails with rc 124, which check_fails refuses)
bounded() { timeout 20 "$@"; }

# ---- reshard: every file of the source checkpoint, and the source path itself ----
for kind in $KINDS; do
  re=$(what_of $kind)
  for f in config.json tokenizer.json model.safetensors.index.json model-00002-of-00003.safetensors; do
    d=$TMP/ck-$kind; rm -rf "$d"; cp -r $FIX "$d"; make_kind $kind "$d/$f"
    check_fails "reshard, $f $re" "$f: $re" bounded "$POLLEN" reshard "$d" -o "$TMP/o-$kind" --tp 1 --dtype fp16 --quiet
    check "reshard, $f $re: no output" test ! -e "$TMP/o-$kind"
    check_fails "inspect checkpoint, $f $re" "$f: $re" bounded "$POLLEN" inspect "$d"
  done
  [ $kind = dir ] || { make_kind $kind "$TMP/src-$kind"
    check_fails "reshard SRC $re" "src-$kind: $re" bounded "$POLLEN" reshard "$TMP/src-$kind" -o "$TMP/o-$kind" --tp 1 --dtype fp16
    check_fails "inspect PATH $re" "src-$kind: $re" bounded "$POLLEN" inspect "$TMP/src-$kind"; }
done

# ---- a shard set: verify, inspect, generate, serve ----
S=$TMP/set
check "sample TP-1 set" "$HELPER" --write-sample "$S" --tp 1
for kind in $KINDS; do
  re=$(what_of $kind)
  for f in manifest.json rank-0-of-1.pln config.json tokenizer.json; do
    d=$TMP/set-$kind; rm -rf "$d"; cp -r "$S" "$d"; make_kind $kind "$d/$f"
    if [ $f != tokenizer.json ]; then
      check_fails "verify, $f $re" "$f: $re" bounded "$POLLEN" verify "$d"
      check_fails "inspect set, $f $re" "$f: $re" bounded "$POLLEN" inspect "$d"
      check_fails "verify --source with the set's $f $re" "$f: $re" bounded "$POLLEN" verify "$d" --source $FIX
    fi
    check_fails "generate, $f $re" "$f: $re" bounded "$POLLEN" generate "$d" --prompt hi --max-new-tokens 2 --quiet
    check_fails "serve, $f $re" "$f: $re" bounded "$POLLEN" serve "$d" --port 0 --quiet
  done
done
# verify --source whose config.json is not a file
d=$TMP/ck-src; rm -rf "$d"; cp -r $FIX "$d"; make_kind fifo "$d/config.json"
check_fails "verify --source, config.json is a FIFO" "config.json: is a FIFO" bounded "$POLLEN" verify "$S" --source "$d"

# ---- synth: --model and --tokenizer ----
for kind in $KINDS; do
  re=$(what_of $kind)
  make_kind $kind "$TMP/synth-in"
  check_fails "synth --model $re" "synth-in: $re" bounded "$POLLEN" synth --model "$TMP/synth-in" -o "$TMP/sy" --quiet
  check_fails "synth --tokenizer $re" "synth-in: $re" bounded "$POLLEN" synth --model $FIX/config.json --tokenizer "$TMP/synth-in" -o "$TMP/sy" --quiet
  check "synth: nothing written" test ! -e "$TMP/sy"
done
rm -rf "$TMP/synth-in"
e2e_done
