#!/usr/bin/env bash
# e2e_integrity.sh — every file of a shard set is covered, over real processes on sets made by
# `pollen reshard` from the bloom-4h fixture:
#   - the manifest's config block, config.json and tokenizer.json are checksummed: an edited
#     n_head (shapes still consistent), a garbage or mismatched config.json, an edited tokenizer
#     fail `verify` and are refused by `generate` / `serve`, each naming the file and field, also
#     when the edit recomputes the checksum of the file it touched;
#   - the manifest's "tokenizer" field is the file loaded (another name works, tokenizer.json
#     absent), and one that escapes the set (.., absolute, symlink out) is refused;
#   - a non-zero padding byte fails `verify`;
#   - a NaN / Inf / zero / negative int8 scale whose tensor, table, preamble and manifest
#     checksums were all recomputed is refused at load (no --verify) and by `verify`;
#   - non-finite logits (PLN_FAULT_NAN_LOGITS_AT_STEP) fail the request: TGI 424, OpenAI 500, an
#     SSE error event, counted as failures in /metrics, generate exits non-zero, and the server
#     keeps serving (TP 1, and TP 2 under mpirun);
#   - a version-1 manifest (no small-file checksums) still loads, with a warning.
# Servers listen on 127.0.0.1 port 0 (--port-file); every wait is bounded.
source "$(dirname "$0")/e2e.sh"
SRC=tests/fixtures/models/bloom-4h/fp16-st
if ! "$POLLEN" reshard --help >/dev/null 2>&1 || [ ! -d "$SRC" ] || ! command -v python3 >/dev/null; then
  echo "SKIP: needs pollen reshard, the bloom-4h fixture and python3"
  e2e_done; exit $?
fi
CURL="curl -s --max-time 30"
export PYTHONPATH=$PWD/tests/tools

# edit.py: edits a set the way a careless or hostile hand would, optionally recomputing the
# checksums that would otherwise catch it (XXH3 from the format document's own reader).
cat >"$TMP/edit.py" <<'EOF'
import json, struct, sys
from read_shard import xxh3

def load(d): return json.load(open(d + "/manifest.json"))
def save(d, m): open(d + "/manifest.json", "w").write(json.dumps(m, indent=2) + "\n")
def hexsum(b): return "%016x" % xxh3(b)

cmd, d = sys.argv[1], sys.argv[2]
if cmd == "config":            # config KEY VALUE: the manifest's config block only
    m = load(d); m["config"][sys.argv[3]] = json.loads(sys.argv[4]); save(d, m)
elif cmd == "set":             # set KEY JSON: a top-level manifest field
    m = load(d); m[sys.argv[3]] = json.loads(sys.argv[4]); save(d, m)
elif cmd == "del":             # del KEY...
    m = load(d)
    for k in sys.argv[3:]: m.pop(k, None)
    save(d, m)
elif cmd == "hfconfig":        # hfconfig KEY JSON: config.json
    c = json.load(open(d + "/config.json")); c[sys.argv[3]] = json.loads(sys.argv[4])
    open(d + "/config.json", "w").write(json.dumps(c, indent=2) + "\n")
elif cmd == "resum":           # resum FILE KEY: record FILE's checksum as the manifest's KEY
    m = load(d); m[sys.argv[4]] = hexsum(open(d + "/" + sys.argv[3], "rb").read()); save(d, m)
elif cmd == "poke":            # poke RANKFILE OFFSET BYTE: one byte, nothing recomputed
    p = d + "/" + sys.argv[3]; b = bytearray(open(p, "rb").read())
    off = int(sys.argv[4]); b[off if off >= 0 else len(b) + off] = int(sys.argv[5], 0)
    open(p, "wb").write(b)
elif cmd == "gap":             # gap RANKFILE: offset of the last byte before data_offset
    b = open(d + "/" + sys.argv[3], "rb").read(); print(struct.unpack_from("<Q", b, 56)[0] - 1)
elif cmd == "scale":           # scale RANK TENSOR INDEX FP16BITS: patch one scale, recompute every checksum
    r, name, idx, bits = int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6], 0)
    m = load(d); fe = m["files"][r]; p = d + "/" + fe["name"]
    b = bytearray(open(p, "rb").read())
    n, toff = struct.unpack_from("<Q", b, 32)[0], 128
    for i in range(n):
        e = toff + 256 * i
        if b[e:e + 128].split(b"\0")[0].decode() == name:
            off, nbytes = struct.unpack_from("<2Q", b, e + 200)
            struct.pack_into("<H", b, off + 2 * idx, bits)
            struct.pack_into("<Q", b, e + 216, xxh3(bytes(b[off:off + nbytes])))
            break
    else:
        sys.exit("no tensor " + name)
    struct.pack_into("<Q", b, 112, xxh3(bytes(b[toff:toff + 256 * n])))
    struct.pack_into("<Q", b, 120, xxh3(bytes(b[0:120])))
    open(p, "wb").write(b)
    fe["xxh3"] = "%016x" % struct.unpack_from("<Q", b, 120)[0]; save(d, m)
EOF
edit() { python3 "$TMP/edit.py" "$@"; }
fresh() { rm -rf "$TMP/$2"; cp -r "$1" "$TMP/$2"; echo "$TMP/$2"; }
gen() { timeout 60 "$POLLEN" generate "$@" --max-new-tokens 4 --temperature 0 --quiet; }

R16=$TMP/r16; R8=$TMP/r8
check "reshard fp16 TP 1" "$POLLEN" reshard "$SRC" -o "$R16" --tp 1 --dtype fp16 --quiet
check "reshard int8 TP 1" "$POLLEN" reshard "$SRC" -o "$R8" --tp 1 --dtype int8 --quiet
check "the manifest is version 2 with the three small-file checksums" python3 -c "
import json, sys; m = json.load(open('$R16/manifest.json'))
sys.exit(0 if m['version'] == 2 and all(len(m[k]) == 16 for k in ('config_xxh3', 'tokenizer_xxh3', 'hf_config_xxh3')) else 1)"
check "verify: intact fp16 set" "$POLLEN" verify "$R16"
check "verify: intact int8 set" "$POLLEN" verify "$R8"
BASE=$(gen "$R16" --prompt "Hello world" --json | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p')
check "generate: intact set ($BASE)" test -n "$BASE"

# ---- the manifest's config block -------------------------------------------------------------
D=$(fresh "$R16" nhead)
edit config "$D" n_head 2          # 64 % 2 == 0 and 2 % tp == 0: every shape still fits
check_fails "verify: manifest n_head 4 -> 2 is named" "n_head is 4 but .*config.n_head 2" "$POLLEN" verify "$D"
check_fails "generate refuses the edited n_head" "n_head is 4 but .*config.n_head 2" gen "$D" --token-ids 5,6
edit hfconfig "$D" n_head 2        # the same edit in config.json too: its checksum catches it
check_fails "verify: n_head edited in config.json too" "config.json: checksum mismatch" "$POLLEN" verify "$D"
edit resum "$D" config.json hf_config_xxh3   # and its checksum recomputed: the config block's catches it
check_fails "verify: ... and config.json's checksum recomputed" "config block: checksum mismatch" "$POLLEN" verify "$D"
check_fails "generate refuses it" "config block: checksum mismatch" gen "$D" --token-ids 5,6
D=$(fresh "$R16" eps)
edit config "$D" layer_norm_epsilon 1e-6
check_fails "verify: edited layer_norm_epsilon is named" "layer_norm_epsilon" "$POLLEN" verify "$D"
D=$(fresh "$R16" eos)
edit config "$D" eos_token_id 5
check_fails "verify: eos_token_id other than BLOOM's is refused by name" "eos_token_id" "$POLLEN" verify "$D"

# ---- config.json ------------------------------------------------------------------------------
D=$(fresh "$R16" garbage)
printf 'not json {' >"$D/config.json"
check_fails "verify: garbage config.json" "config.json: checksum mismatch" "$POLLEN" verify "$D"
edit resum "$D" config.json hf_config_xxh3
check_fails "verify: garbage config.json with its checksum recomputed" "config.json: not valid JSON" "$POLLEN" verify "$D"
check_fails "generate refuses it" "config.json: not valid JSON" gen "$D" --token-ids 5,6
D=$(fresh "$R16" mismatch)
edit hfconfig "$D" vocab_size 1002
edit resum "$D" config.json hf_config_xxh3
check_fails "verify: config.json disagreeing with the manifest names the field" "config.json: vocab_size is 1002 but .*config.vocab_size 1003" "$POLLEN" verify "$D"
check_fails "serve refuses it" "vocab_size is 1002" timeout 60 "$POLLEN" serve "$D" --port 0
D=$(fresh "$R16" nocfg)
rm "$D/config.json"
check_fails "verify: config.json missing" "config.json: missing" "$POLLEN" verify "$D"

# ---- tokenizer --------------------------------------------------------------------------------
D=$(fresh "$R16" tok)
python3 -c "import sys; p = sys.argv[1]; s = open(p).read(); open(p, 'w').write(s.replace('\"Hello\"', '\"Hellp\"', 1))" "$D/tokenizer.json"
check "the tokenizer edit changed the file" bash -c "! cmp -s '$D/tokenizer.json' '$R16/tokenizer.json'"
check_fails "verify: edited tokenizer.json" "tokenizer.json: checksum mismatch" "$POLLEN" verify "$D"
check_fails "generate refuses it" "tokenizer.json: checksum mismatch" gen "$D" --prompt "Hello world"
D=$(fresh "$R16" tokname)
mv "$D/tokenizer.json" "$D/bloom-tokenizer.json"
edit set "$D" tokenizer '"bloom-tokenizer.json"'
check "verify: a tokenizer under another name" "$POLLEN" verify "$D"
OTHER=$(gen "$D" --prompt "Hello world" --json | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p')
check "generate loads the manifest's tokenizer, not tokenizer.json ($OTHER)" test -n "$OTHER" -a "$OTHER" = "$BASE"
D=$(fresh "$R16" tokdotdot)
edit set "$D" tokenizer '"../r16/tokenizer.json"'
check_fails "a tokenizer path with .. is refused" "\"tokenizer\" must be a plain file name" gen "$D" --prompt "Hello"
edit set "$D" tokenizer "\"$R16/tokenizer.json\""
check_fails "an absolute tokenizer path is refused" "\"tokenizer\" must be a plain file name" "$POLLEN" verify "$D"
D=$(fresh "$R16" toklink)
cp "$D/tokenizer.json" "$TMP/outside-tokenizer.json"
rm "$D/tokenizer.json"; ln -s "$TMP/outside-tokenizer.json" "$D/tokenizer.json"
check_fails "a tokenizer symlinked out of the set is refused" "leads out of the set directory" gen "$D" --prompt "Hello"
check_fails "... by verify too" "leads out of the set directory" "$POLLEN" verify "$D"
mkdir "$D/sub"; rm "$D/tokenizer.json"; cp "$TMP/outside-tokenizer.json" "$D/sub/t.json"; ln -s sub/t.json "$D/tokenizer.json"
check "a symlink inside the set is fine" "$POLLEN" verify "$D"
D=$(fresh "$R16" notok)
edit set "$D" tokenizer null; edit set "$D" tokenizer_xxh3 null
check_fails "no tokenizer: text prompts get a clear error" "records no tokenizer" gen "$D" --prompt "Hello"
check "no tokenizer: token ids still work" gen "$D" --token-ids 5,6

# ---- padding ----------------------------------------------------------------------------------
D=$(fresh "$R16" pad)
edit poke "$D" rank-0-of-1.pln "$(edit gap "$D" rank-0-of-1.pln)" 0x01
check_fails "verify: non-zero byte between the table and the data" "padding byte at offset .* is 0x01" "$POLLEN" verify "$D"
D=$(fresh "$R16" padend)
edit poke "$D" rank-0-of-1.pln -1 0x5a
check_fails "verify: non-zero byte after the last tensor" "padding byte .*after tensor \"ln_f.bias\"" "$POLLEN" verify "$D"
check "the document's reader agrees" bash -c "! python3 tests/tools/read_shard.py '$D' >/dev/null 2>&1"

# ---- int8 scales ------------------------------------------------------------------------------
T=h.1.mlp.dense_4h_to_h.weight_scale
for v in "0x7e00 NaN" "0x7c00 infinite" "0x0000 zero" "0xbc00 negative"; do
  set -- $v
  D=$(fresh "$R8" "scale-$2")
  edit scale "$D" 0 "$T" 7 "$1"
  check "$2 scale: the tensor checksums still match (only the value check can tell)" bash -c "python3 tests/tools/read_shard.py '$D' >/dev/null"
  check_fails "$2 scale: generate refuses to load (no --verify)" "rank-0-of-1.pln: tensor \"$T\": scale \[7, 0\] is $2" gen "$D" --token-ids 5,6
  check_fails "$2 scale: verify names it" "scale \[7, 0\] is $2" "$POLLEN" verify "$D"
done
check_fails "NaN scale: serve refuses to start" "is NaN" timeout 60 "$POLLEN" serve "$TMP/scale-NaN" --port 0

# ---- non-finite logits ------------------------------------------------------------------------
check_fails "generate: NaN logits at step 2 -> non-zero exit naming them" "step 2, sequence 1: .*non-finite logits" \
  env PLN_FAULT_NAN_LOGITS_AT_STEP=2 "$POLLEN" generate "$R16" --token-ids 5,6 --max-new-tokens 4 --quiet

code() { $CURL -o "$TMP/body" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT$1" -d "$2"; }
post() { $CURL -X POST "http://127.0.0.1:$PORT$1" -d "$2"; }
G='{"inputs":"Hello world","parameters":{"max_new_tokens":6}}'

# nan_server NAME STEP LAUNCH...: a server whose engine step STEP has NaN logits
nan_server() { local name=$1 step=$2; shift 2; start_server "$name" PLN_FAULT_NAN_LOGITS_AT_STEP=$step "$@" serve "$R16"; }
if command -v curl >/dev/null; then
  check "server starts (NaN logits at step 1)" nan_server n1 1 "$POLLEN"
  check "TGI /generate: 424" test "$(code /generate "$G")" = 424
  check "... a generation error that says why" grep -q '"error":"generation failed: .*non-finite logits.*","error_type":"generation"' "$TMP/body"
  check "/metrics: counted as a generation error" test "$(metric 'pln_requests_total{route="generate",outcome="generation_error"}')" = 1
  check "/metrics: not as a success" test "$(metric 'pln_requests_total{route="generate",outcome="success"}')" = 0
  check "/metrics: a sequence finished with an error" test "$(metric 'pln_sequences_finished_total{reason="error"}')" = 1
  check "the next request is served (200)" test "$(code /generate "$G")" = 200
  check "... with its text" grep -q '"generated_text":"..*"' "$TMP/body"
  check "/health stays 200" test "$($CURL -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200
  check "clean exit" stop_server

  check "server starts (NaN logits at step 3)" nan_server n2 3 "$POLLEN"
  EV=$(post /generate_stream "$G" | grep '^data:')
  check "SSE: two tokens, then an error event" test "$(grep -c '"token"' <<<"$EV")" = 2
  check "... the last event is the generation error" grep -q '"error":"generation failed: .*non-finite logits.*","error_type":"generation"' <<<"$(tail -n 1 <<<"$EV")"
  check "... and no event claims success" bash -c "! grep -q '\"generated_text\":\"' <<<'$EV'"
  check "/metrics: the stream counted as a generation error" test "$(metric 'pln_requests_total{route="generate_stream",outcome="generation_error"}')" = 1
  check "clean exit" stop_server

  check "server starts (NaN logits at step 1, OpenAI)" nan_server n3 1 "$POLLEN"
  check "OpenAI /v1/completions: 500" test "$(code /v1/completions '{"prompt":"Hello world","max_tokens":6}')" = 500
  check "... an OpenAI error object" grep -q '"error":{"message":"generation failed: .*non-finite logits' "$TMP/body"
  check "/metrics: counted as a generation error" test "$(metric 'pln_requests_total{route="completions",outcome="generation_error"}')" = 1
  OS=$(post /v1/completions '{"prompt":"Hello world","max_tokens":6,"stream":true}')
  check "the next OpenAI stream completes" test "$(grep '^data:' <<<"$OS" | tail -n 1)" = "data: [DONE]"
  check "... without an error" bash -c "! grep -q '\"error\"' <<<'$OS'"
  check "clean exit" stop_server

  check "server starts (NaN logits at step 2, OpenAI stream)" nan_server n5 2 "$POLLEN"
  OS=$(post /v1/completions '{"prompt":"Hello world","max_tokens":6,"stream":true}' | grep '^data:')
  check "OpenAI stream: an error object before [DONE]" grep -q '^data: {"error":{"message":"generation failed: .*non-finite logits' <<<"$(tail -n 2 <<<"$OS" | head -n 1)"
  check "/metrics: counted as a generation error" test "$(metric 'pln_requests_total{route="completions",outcome="generation_error"}')" = 1
  check "clean exit" stop_server

  if command -v mpirun >/dev/null; then
    R2=$TMP/r16-tp2
    check "reshard fp16 TP 2" "$POLLEN" reshard "$SRC" -o "$R2" --tp 2 --dtype fp16 --quiet
    check "TP 2 server starts (NaN logits at step 2)" start_server n4 PLN_FAULT_NAN_LOGITS_AT_STEP=2 mpirun -np 2 "$POLLEN" serve "$R2"
    check "TP 2: TGI 424" test "$(code /generate "$G")" = 424
    check "TP 2: the next request is served" test "$(code /generate "$G")" = 200
    check "TP 2: every rank exits 0" stop_server
    check_fails "TP 2: generate exits non-zero" "non-finite logits" \
      env PLN_FAULT_NAN_LOGITS_AT_STEP=2 timeout 60 mpirun -np 2 "$POLLEN" generate "$R2" --token-ids 5,6 --max-new-tokens 4 --quiet
  else
    echo "SKIP: TP 2 (mpirun not installed)"
  fi
else
  echo "SKIP: serve checks (curl not installed)"
fi

# ---- version 1 manifests ----------------------------------------------------------------------
D=$(fresh "$R16" v1)
edit set "$D" version 1; edit del "$D" config_xxh3 tokenizer_xxh3 hf_config_xxh3
ERR=$("$POLLEN" verify "$D" 2>&1 >/dev/null)
check "verify: a version-1 set passes" test $? = 0
check "... and says on stderr that its small files carry no checksums" grep -q "version 1 records no checksums" <<<"$ERR"
OUT=$("$POLLEN" verify "$D" --strict); RC=$?
check "verify --strict: a version-1 set fails (exit $RC)" test "$RC" = 1
check "... naming why" grep -q "FAILED .*manifest version 1 records no checksums .*--strict" <<<"$OUT"
check "verify --strict: a version-2 set passes" "$POLLEN" verify "$R16" --strict
v1_warns() { gen "$D" --token-ids 5,6 2>&1 >/dev/null | grep -q 're-run reshard to add them'; }
check "generate: a version-1 set loads with a warning" v1_warns
edit config "$D" n_head 2
check_fails "version 1: an edited n_head is still caught by config.json" "n_head is 4 but .*config.n_head 2" "$POLLEN" verify "$D"
e2e_done
