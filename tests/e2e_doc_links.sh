#!/usr/bin/env bash
# e2e_doc_links.sh — every relative link of README.md and the docs resolves: the file exists and a
# #fragment names a heading of it (tests/tools/check_links.py, GitHub's anchor rules). Also checks
# that the checker fails on a missing file and a missing anchor. Needs python3; SKIPs without it.
source tests/e2e.sh
PY=tests/tools/check_links.py
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIP: python3 not found (the link checker is a Python script)"
  e2e_done; exit $?
fi

DOCS=(README.md docs/*.md tests/fixtures/README.md tests/fixtures/templates/README.md)
check "every relative link of ${#DOCS[@]} documents resolves" python3 "$PY" "${DOCS[@]}"

# The checker must be able to fail: one run on a file with a missing target and a missing anchor.
printf '# Title\n\n[ok](#title) [gone](no-such-file.md) `[code](not-a-link.md)`\n[bad](#no-such-heading)\n```\n[fenced](not-a-link.md)\n```\n' >"$TMP/bad.md"
python3 "$PY" "$TMP/bad.md" 2>"$TMP/bad.err"; rc=$?
check "a broken file fails the check" test "$rc" = 1
check "a missing file is named with its line" grep -q "bad.md:3: no-such-file.md: no such file or directory" "$TMP/bad.err"
check "a missing anchor is named with its line" grep -q "bad.md:4: #no-such-heading: no heading" "$TMP/bad.err"
check "links in code are not links" bash -c "! grep -q not-a-link '$TMP/bad.err'"
check "exactly the two broken links are reported" test "$(wc -l <"$TMP/bad.err")" = 2
e2e_done
