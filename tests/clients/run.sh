#!/usr/bin/env bash
# tests/clients/run.sh — `make test-clients`: the Python clients users already have, unmodified
# from PyPI (text-generation, huggingface_hub, openai; versions pinned below), against a real
# `pollen serve` on a small shard set: every call they make, streamed and not, compared with the
# server's raw answers and `pollen generate`. Needs network access to PyPI once (the venv is
# kept in $BUILD/clients-venv). The server binds 127.0.0.1 on a kernel-chosen port; every wait
# is bounded.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
VENV=$BUILD/clients-venv
PINS="text-generation==0.7.0 huggingface_hub==0.36.0 openai==3.57.0"
POLLEN=$BUILD/pollen
HELPER=$BUILD/tests/test_shard
[ -x "$POLLEN" ] && [ -x "$HELPER" ] || { echo "test-clients: build $POLLEN and $HELPER first"; exit 2; }
if [ ! -f "$VENV/.pins" ] || [ "$(cat "$VENV/.pins")" != "$PINS" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" || { echo "test-clients: python3 -m venv failed (install python3-venv)"; exit 2; }
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install -q $PINS || { echo "test-clients: pip install $PINS failed"; exit 2; }
  echo "$PINS" > "$VENV/.pins"
fi
TMP=$(mktemp -d)
# the server measures its GEMV prefetch distance as a user's would (--cpu-tune auto), caching it
# here rather than in the user's ~/.cache
export XDG_CACHE_HOME=$TMP/xdg-cache
SRV=
cleanup() { [ -n "$SRV" ] && kill -TERM "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
"$HELPER" --write-sample "$TMP/s1" --tp 1 >/dev/null || { echo "test-clients: sample set failed"; exit 1; }
"$POLLEN" serve "$TMP/s1" --port 0 --port-file "$TMP/port" --quiet >"$TMP/log" 2>&1 &
SRV=$!
for _ in $(seq 300); do [ -s "$TMP/port" ] && break; kill -0 $SRV 2>/dev/null || break; sleep 0.1; done
[ -s "$TMP/port" ] || { echo "test-clients: server did not start"; cat "$TMP/log"; exit 1; }
export PLN_URL="http://127.0.0.1:$(cat "$TMP/port")" PLN_MODEL=s1 PLN_POLLEN=$POLLEN PLN_SET=$TMP/s1
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1 HF_HUB_DISABLE_TELEMETRY=1
fail=0
for t in tgi hub openai; do
  timeout 300 "$VENV/bin/python" "tests/clients/test_$t.py" || fail=1
done
# the chat route, with the example template
kill -TERM $SRV; wait $SRV 2>/dev/null; SRV=; rm -f "$TMP/port"
"$POLLEN" serve "$TMP/s1" --port 0 --port-file "$TMP/port" --quiet \
  --chat-template docs/examples/chat-template-bloomz.json >"$TMP/log" 2>&1 &
SRV=$!
for _ in $(seq 300); do [ -s "$TMP/port" ] && break; kill -0 $SRV 2>/dev/null || break; sleep 0.1; done
[ -s "$TMP/port" ] || { echo "test-clients: chat server did not start"; cat "$TMP/log"; exit 1; }
PLN_URL="http://127.0.0.1:$(cat "$TMP/port")" timeout 300 "$VENV/bin/python" tests/clients/test_openai_chat.py || fail=1
# the set's own Jinja template (tokenizer_config.json), as a chat model's set carries it
kill -TERM $SRV; wait $SRV 2>/dev/null; SRV=; rm -f "$TMP/port"
cp -r "$TMP/s1" "$TMP/s1chat"
cat >"$TMP/s1chat/tokenizer_config.json" <<'J'
{"bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tool messages are not supported') }}{% endif %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"}
J
"$POLLEN" serve "$TMP/s1chat" --port 0 --port-file "$TMP/port" --quiet >"$TMP/log" 2>&1 &
SRV=$!
for _ in $(seq 300); do [ -s "$TMP/port" ] && break; kill -0 $SRV 2>/dev/null || break; sleep 0.1; done
[ -s "$TMP/port" ] || { echo "test-clients: Jinja chat server did not start"; cat "$TMP/log"; exit 1; }
PLN_URL="http://127.0.0.1:$(cat "$TMP/port")" PLN_SET="$TMP/s1chat" timeout 300 "$VENV/bin/python" tests/clients/test_hub_chat.py || fail=1
[ $fail = 0 ] && echo "test-clients: all passed" || echo "test-clients: FAILED"
exit $fail
