#!/usr/bin/env bash
# e2e_help.sh — every command's --help runs, exits 0 and prints a usage on stdout; no test-only
# flag is shown (serve still accepts them: docs/SERVING.md); the shard set is SET in every
# synopsis; option descriptions line up (the shared --int-dot lines with each command's own);
# bench documents its flags; the command list and --temperature say what is true.
source "$(dirname "$0")/e2e.sh"
cmds=$("$POLLEN" --help | awk '/^commands:/ {f = 1; next} f && /^$/ {f = 0} f {print $1}')
check "the command list names the ten commands" test "$(echo "$cmds" | wc -w)" = 10
check "the command list: reshard does int4 too" bash -c "'$POLLEN' --help | grep -q 'reshard .*(fp16/int8/int4)'"
for c in $cmds; do
  out=$("$POLLEN" "$c" --help 2>"$TMP/$c.err"); rc=$?
  check "$c --help: exit 0" test $rc = 0
  check "$c --help: a usage on stdout" grep -q "^usage: .*pollen $c" <<<"$out"
  check "$c --help: nothing on stderr" test ! -s "$TMP/$c.err"
  check "$c --help: no test-only flag" bash -c "! grep -Eq -- '--fail-at-step|--step-delay-ms|--no-block-sharing|--dump-logits|test only' <<<\"\$1\"" _ "$out"
  check "$c --help: the set is SET in the synopsis" bash -c "! grep '^usage\|^       pollen' <<<\"\$1\" | grep -Eq 'SHARDS|SHARD_DIR|SRC|OUT|PATH'" _ "$out"
  # where both appear, the shared --int-dot lines start their description in the command's column
  ci=$(awk '/^  --int-dot /{print index($0, "cpu, int8")}' <<<"$out")
  cb=$(awk '/^  --backend /{print index($0, "(default")}' <<<"$out")
  [ -n "$ci" ] && [ -n "$cb" ] && check "$c --help: --int-dot aligned with --backend ($ci = $cb)" test "$ci" = "$cb"
done
for f in --prompt-len --batch --context --steps --stream-mib --mbu --json --copy-only --kv-dtype; do
  check "bench --help documents $f" bash -c "'$POLLEN' bench --help | grep -Eq -- '^  (-[a-z], )?$f [^ ]* *[a-zA-Z(]'"
done
check "generate --help: --temperature defaults to greedy" bash -c "'$POLLEN' generate --help | grep -q -- '--temperature .*default: greedy'"
# the hidden test flags are still accepted (their own value errors, not "unknown option")
check_fails "serve still accepts --fail-at-step" 'pollen: --fail-at-step "x": not an integer' "$POLLEN" serve /nonexistent --fail-at-step x
check_fails "serve still accepts --step-delay-ms" 'pollen: --step-delay-ms "x": not an integer' "$POLLEN" serve /nonexistent --step-delay-ms x
e2e_done
