#!/usr/bin/env bash
# e2e_nonregular.sh — a FIFO, a socket, a directory or a character device (/dev/zero's node) in
# place of each kind of file pollen reads (checkpoint weights, index, config.json and tokenizer.json
# of a BLOOM and a Llama-family checkpoint, and the tokenizer_config.json and chat_template.jinja
# reshard carries into a set; a shard set's manifest.json, config.json, tokenizer.json, rank files
# and its copies of tokenizer_config.json and chat_template.jinja; a Hugging Face directory's
# tokenizer.json, tokenizer_config.json and chat_template.jinja for tokenize and template; the
# tokenizer_config.json beside a .jinja; synth's --model and --tokenizer; serve's --chat-template as
# a .jinja or a tokenizer_config.json; template's PATH, --messages, --tools and --tokens; tokenize's
# PATH; perplexity's --file and --kl-base set), and a FIFO or /dev/zero itself as every path-taking
# positional and flag (SET of generate, serve, verify, inspect, bench and perplexity; reshard's SRC;
# verify --source) gives every command (reshard, inspect, verify, generate, serve, bench,
# perplexity, synth, tokenize, template) a clear error naming the file and what it is, a non-zero
# exit, and never a hang: each run has 20 s. tokenize's stdin is no file pollen opens: a pipe there
# is read as ever.
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

# ---- a Llama-family checkpoint: the same readers, and the family's own config.json parse ----
LFIX=tests/fixtures/models/llama-gqa/bf16-st
for kind in $KINDS; do
  re=$(what_of $kind)
  for f in config.json tokenizer.json model.safetensors.index.json model-00003-of-00006.safetensors; do
    d=$TMP/lck-$kind; rm -rf "$d"; cp -r $LFIX "$d"; make_kind $kind "$d/$f"
    check_fails "reshard llama-gqa, $f $re" "$f: $re" bounded "$POLLEN" reshard "$d" -o "$TMP/o-$kind" --tp 1 --dtype fp16 --quiet
    check "reshard llama-gqa, $f $re: no output" test ! -e "$TMP/o-$kind"
    check_fails "inspect llama-gqa, $f $re" "$f: $re" bounded "$POLLEN" inspect "$d"
  done
done

# ---- a shard set: verify, inspect, generate, serve, tokenize, template ----
S=$TMP/set
MSG=$TMP/messages.json
echo '[{"role": "user", "content": "Hi"}]' >"$MSG"
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
    check_fails "tokenize set, $f $re" "$f: $re" bounded "$POLLEN" tokenize "$d" --text hi
    check_fails "template set, $f $re" "$f: $re" bounded "$POLLEN" template "$d" --messages "$MSG"
  done
done
# verify --source whose config.json is not a file
d=$TMP/ck-src; rm -rf "$d"; cp -r $FIX "$d"; make_kind fifo "$d/config.json"
check_fails "verify --source, config.json is a FIFO" "config.json: is a FIFO" bounded "$POLLEN" verify "$S" --source "$d"

# ---- chat files: reshard carries a checkpoint's tokenizer_config.json and chat_template.jinja into
# the set; template and serve read them from a Hugging Face directory, a set, or a path given ----
CK=$TMP/ck-chat; rm -rf "$CK"; cp -r $FIX "$CK"
echo '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}' >"$CK/tokenizer_config.json"
printf '%s' '{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}' >"$CK/chat_template.jinja"
echo '[]' >"$TMP/tools.json"
CS=$TMP/chat-set
check "reshard a checkpoint with chat files" "$POLLEN" reshard "$CK" -o "$CS" --tp 1 --dtype fp16 --quiet
check "the set carries tokenizer_config.json" test -f "$CS/tokenizer_config.json"
check "the set carries chat_template.jinja" test -f "$CS/chat_template.jinja"
check "template of the chat set renders" "$POLLEN" template "$CS" --messages "$MSG" --tools "$TMP/tools.json" --tokens "$CK/tokenizer_config.json" >/dev/null
check "template of a .jinja renders" "$POLLEN" template "$CK/chat_template.jinja" --messages "$MSG" >/dev/null
check "serve with the chat set's template starts" start_server chatset "$POLLEN" serve "$CS"
stop_server
for kind in $KINDS; do
  re=$(what_of $kind)
  for f in tokenizer_config.json chat_template.jinja; do
    d=$TMP/ckc-$kind; rm -rf "$d"; cp -r "$CK" "$d"; make_kind $kind "$d/$f"
    check_fails "reshard, source $f $re" "$f: $re" bounded "$POLLEN" reshard "$d" -o "$TMP/o-$kind" --tp 1 --dtype fp16 --quiet
    check "reshard, source $f $re: no output" test ! -e "$TMP/o-$kind"
    check_fails "template HF directory, $f $re" "$f: $re" bounded "$POLLEN" template "$d" --messages "$MSG"
    check_fails "serve --chat-template HF directory's $f $re" "$f: $re" bounded "$POLLEN" serve "$S" --port 0 --quiet --chat-template "$d/$f"
    d=$TMP/cset-$kind; rm -rf "$d"; cp -r "$CS" "$d"; make_kind $kind "$d/$f"
    check_fails "template set, its $f $re" "$f: $re" bounded "$POLLEN" template "$d" --messages "$MSG"
    check_fails "serve set, its $f $re" "$f: $re" bounded "$POLLEN" serve "$d" --port 0 --quiet
  done
  # a .jinja given as the path: the tokenizer_config.json beside it gives the special tokens
  d=$TMP/jsib-$kind; rm -rf "$d"; mkdir "$d"; cp "$CK/chat_template.jinja" "$d/"; make_kind $kind "$d/tokenizer_config.json"
  check_fails "template FILE.jinja, tokenizer_config.json beside it $re" "tokenizer_config.json: $re" bounded "$POLLEN" template "$d/chat_template.jinja" --messages "$MSG"
  check_fails "serve --chat-template FILE.jinja, tokenizer_config.json beside it $re" "tokenizer_config.json: $re" bounded "$POLLEN" serve "$S" --port 0 --quiet --chat-template "$d/chat_template.jinja"
  # the files of template's flags (a directory included: each takes a file)
  make_kind $kind "$TMP/tflag-$kind"
  check_fails "template --messages $re" "messages .*tflag-$kind: $re" bounded "$POLLEN" template "$CK" --messages "$TMP/tflag-$kind"
  check_fails "template --tools $re" "tools .*tflag-$kind: $re" bounded "$POLLEN" template "$CK" --messages "$MSG" --tools "$TMP/tflag-$kind"
  check_fails "template --tokens $re" "tokens .*tflag-$kind: $re" bounded "$POLLEN" template "$CK" --messages "$MSG" --tokens "$TMP/tflag-$kind"
  # serve --chat-template: a .jinja, a tokenizer_config.json (a directory too: it takes a file)
  for f in chat.jinja tokenizer_config.json; do
    d=$TMP/ctf-$kind; rm -rf "$d"; mkdir "$d"; make_kind $kind "$d/$f"
    check_fails "serve --chat-template $f $re" "chat-template .*$f: $re" bounded "$POLLEN" serve "$S" --port 0 --quiet --chat-template "$d/$f"
    [ $kind = dir ] && continue   # a directory is a model directory to template's PATH
    check_fails "template PATH $f $re" "$f: $re" bounded "$POLLEN" template "$d/$f" --messages "$MSG"
  done
done

# ---- tokenize: PATH a tokenizer.json, a Hugging Face directory's, a set's (stdin is no file) ----
TOK=tests/fixtures/tokenizer/tokenizer.json
check "tokenize reads its text from a pipe on stdin" bash -c "printf 'Hello world' | \"\$1\" tokenize $TOK" _ "$POLLEN" >/dev/null
for kind in $KINDS; do
  re=$(what_of $kind)
  d=$TMP/hf-$kind; rm -rf "$d"; mkdir "$d"; make_kind $kind "$d/tokenizer.json"
  check_fails "tokenize HF directory, tokenizer.json $re" "tokenizer.json: $re" bounded "$POLLEN" tokenize "$d" --text hi
  check_fails "tokenize HF directory, tokenizer.json $re (stdin)" "tokenizer.json: $re" bounded "$POLLEN" tokenize "$d" </dev/null
  [ $kind = dir ] && continue   # a directory is what PATH may be
  make_kind $kind "$TMP/tokpath-$kind"
  check_fails "tokenize PATH $re" "tokpath-$kind: $re" bounded "$POLLEN" tokenize "$TMP/tokpath-$kind" --text hi
  check_fails "tokenize PATH $re --decode" "tokpath-$kind: $re" bounded "$POLLEN" tokenize "$TMP/tokpath-$kind" --decode --text 1
done

# ---- files named by a flag or a positional of their own: a FIFO, a directory, /dev/zero itself ----
# (each must fail at once with a message naming the path: a FIFO with no writer would block an
# open(2) without O_NONBLOCK for ever, /dev/zero would be read without end)
echo "hello world, the quick brown fox jumps over the lazy dog" >"$TMP/text.txt"
echo '{"user": {"prefix": "U: ", "suffix": "\n"}, "generation_prompt": "A:"}' >"$TMP/chat.json"
check "serve with a regular --chat-template starts" start_server chat "$POLLEN" serve "$S" --chat-template "$TMP/chat.json"
stop_server
for kind in fifo dir devzero; do
  if [ $kind = devzero ]; then P=/dev/zero; re="/dev/zero: is a character device"
  else P=$TMP/flag-$kind; make_kind $kind "$P"; re="flag-$kind: $(what_of $kind)"; fi
  # a set, a checkpoint: a directory is what these take, and anything else is named as not one
  set_re="$P: is (a FIFO|a character device).*(not a directory|not a regular file)"
  check_fails "serve --chat-template $kind" "chat-template .*$re" bounded "$POLLEN" serve "$S" --port 0 --quiet --chat-template "$P"
  check_fails "perplexity --file $kind" "file: .*$re" bounded "$POLLEN" perplexity "$S" --file "$P"
  check_fails "synth --model $kind (the path itself)" "$re" bounded "$POLLEN" synth --model "$P" -o "$TMP/sy" --quiet
  check_fails "synth --tokenizer $kind (the path itself)" "$re" bounded "$POLLEN" synth --model $FIX/config.json --tokenizer "$P" -o "$TMP/sy" --quiet
  check "synth --tokenizer $kind: nothing written" test ! -e "$TMP/sy"
  [ $kind = dir ] && continue   # a directory is what these take
  for cmd in generate serve verify inspect bench perplexity; do
    case $cmd in
      generate) args=(--prompt hi --max-new-tokens 2 --quiet) ;; serve) args=(--port 0 --quiet) ;;
      bench) args=(--steps 1 --batch 1 --prompt-len 2 --context 4) ;; perplexity) args=(--file "$TMP/text.txt") ;;
      *) args=() ;;
    esac
    check_fails "$cmd SET: $kind" "$set_re" bounded "$POLLEN" $cmd "$P" "${args[@]}"
  done
  check_fails "reshard SRC: $kind" "$set_re" bounded "$POLLEN" reshard "$P" -o "$TMP/o-flag" --tp 1 --dtype fp16 --quiet
  check_fails "verify --source $kind" "$set_re" bounded "$POLLEN" verify "$S" --source "$P"
  check_fails "perplexity --kl-base $kind" "kl-base: $set_re" bounded "$POLLEN" perplexity "$S" --file "$TMP/text.txt" --kl-base "$P"
done
rm -rf "$TMP/flag-fifo" "$TMP/flag-dir"
# perplexity --kl-base: each file of the base set not a regular file
for kind in fifo dir; do
  re=$(what_of $kind)
  for f in manifest.json rank-0-of-1.pln config.json tokenizer.json; do
    d=$TMP/base-$kind; rm -rf "$d"; cp -r "$S" "$d"; make_kind $kind "$d/$f"
    check_fails "perplexity --kl-base, its $f $re" "$f: $re" bounded "$POLLEN" perplexity "$S" --file "$TMP/text.txt" --kl-base "$d"
  done
done

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
