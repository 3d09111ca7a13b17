# e2e.sh — sourced by tests/e2e_*.sh: the same CHECK counting as tests/test.h, for shell.
# Each script ends with `e2e_done`, which prints "<name>: N passed, N failed".
E2E_PASS=0; E2E_FAIL=0
E2E_NAME=$(basename "$0" .sh)
POLLEN=${PLN_BUILD:-build}/pollen
TMP=$(mktemp -d "${PLN_TEST_TMP:-/tmp}/$E2E_NAME.XXXXXX")
check() { # check "what" cmd...
  local what=$1; shift
  if "$@"; then E2E_PASS=$((E2E_PASS+1)); else E2E_FAIL=$((E2E_FAIL+1)); echo "FAIL: $what" >&2; fi
}
check_fails() { # check_fails "what" "expected stderr regex" cmd...  (must exit non-zero, message must match)
  local what=$1 re=$2; shift 2
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && echo "$err" | grep -Eq "$re"; then E2E_PASS=$((E2E_PASS+1));
  else E2E_FAIL=$((E2E_FAIL+1)); echo "FAIL: $what (rc=$rc, stderr: $err)" >&2; fi
}
e2e_done() { echo "$E2E_NAME: $E2E_PASS passed, $E2E_FAIL failed"; [ $E2E_FAIL = 0 ]; }
