#!/usr/bin/env bash
# run.sh — `make fuzz`: builds every tests/fuzz/fuzz_*.c (each defines LLVMFuzzerTestOneInput)
# with clang -fsanitize=fuzzer,address against the library sources, runs each for FUZZ_SECONDS
# on a seed corpus (tests/fuzz/seeds/<target>/, matching fixtures, and the saved regressions),
# and copies any crashing input into tests/fuzz/regressions/<target>/ so tests/test_fuzz_regress
# replays it in every `make test` from then on.
#   env: BUILD (default build-fuzz), FUZZ_CC (clang), FUZZ_SECONDS (20), FUZZ_TARGETS (all)
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-fuzz}
FUZZ_CC=${FUZZ_CC:-clang}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
command -v "$FUZZ_CC" >/dev/null || { echo "fuzz: $FUZZ_CC not found (apt-get install clang)"; exit 1; }

MPI_CFLAGS=$(mpicc --showme:compile 2>/dev/null)
MPI_LIBS=$(mpicc --showme:link 2>/dev/null)
CFLAGS="-std=gnu11 -g -O1 -fno-omit-frame-pointer -fopenmp -pthread -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I. $MPI_CFLAGS"
LDLIBS="$MPI_LIBS -ljansson -larchive -lz -lxxhash -lpcre2-8 -lmicrohttpd -lm -fopenmp -pthread"
OBJ=$BUILD/obj
mkdir -p "$OBJ"

# The library, instrumented for coverage (fuzzer-no-link) and ASan. A static archive: each target
# links only the objects it uses.
fail=0
srcs=$(ls formats/*.c runtime/*.c kernels/*.c kernels/cpu/*.c 2>/dev/null)
objs=()
for s in $srcs; do
  o="$OBJ/${s//\//_}.o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find formats runtime kernels -name '*.h' -newer "$o" 2>/dev/null | head -n 1)" ]; then
    # A source clang cannot compile is left out (said so); a target that needs it fails to link.
    "$FUZZ_CC" $CFLAGS -fsanitize=fuzzer-no-link,address -c "$s" -o "$o" 2>"$o.err" ||
      { echo "fuzz: note: $s does not compile with $FUZZ_CC ($(grep -m1 'error:' "$o.err")); left out"; rm -f "$o"; continue; }
  fi
  objs+=("$o")
done
rm -f "$BUILD/libpollen-fuzz.a"
ar rcs "$BUILD/libpollen-fuzz.a" "${objs[@]}"

# Seeds beyond tests/fuzz/seeds/<target>/: fixture files of the kind the target reads.
fixture_seeds() {
  case "$1" in
    fuzz_safetensors) find tests/fixtures -name '*.safetensors' -size -300k ;;
    fuzz_torchzip)    find tests/fixtures -name '*.bin' -size -300k ;;
    fuzz_hfconfig)    find tests/fixtures -name 'config.json' ;;
    fuzz_shard)       find tests/fixtures -name '*.pln' -size -300k 2>/dev/null ;;
  esac
}

summary=()
for src in tests/fuzz/fuzz_*.c; do
  [ -f "$src" ] || continue
  t=$(basename "$src" .c)
  if [ -n "${FUZZ_TARGETS:-}" ] && ! [[ " $FUZZ_TARGETS " == *" $t "* ]]; then continue; fi
  bin="$BUILD/$t"
  if ! "$FUZZ_CC" $CFLAGS -fsanitize=fuzzer,address "$src" "$BUILD/libpollen-fuzz.a" $LDLIBS -o "$bin"; then
    echo "fuzz: cannot build $t"; summary+=("$t: BUILD FAILED"); fail=1; continue
  fi
  corpus="$BUILD/corpus/$t"; art="$BUILD/artifacts/$t"
  rm -rf "$art"; mkdir -p "$corpus" "$art"
  for f in tests/fuzz/seeds/"$t"/* tests/fuzz/regressions/"$t"/* $(fixture_seeds "$t"); do
    [ -f "$f" ] && cp "$f" "$corpus/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
  done
  echo "== $t: ${FUZZ_SECONDS}s, $(ls "$corpus" | wc -l) corpus files"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" "$corpus" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
      -rss_limit_mb=2048 -max_len=1048576 -artifact_prefix="$art/" -print_final_stats=1 >"$BUILD/$t.log" 2>&1
  rc=$?
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+ *DONE' "$BUILD/$t.log" | sed 's/^/   /'
  found=$(ls "$art" 2>/dev/null | grep -E '^(crash|leak|timeout|oom|slow-unit)-' || true)
  if [ -n "$found" ]; then
    mkdir -p "tests/fuzz/regressions/$t"
    for a in $found; do cp "$art/$a" "tests/fuzz/regressions/$t/$a"; done
    echo "   FOUND: $found (copied to tests/fuzz/regressions/$t/; log $BUILD/$t.log)"
    grep -E 'ERROR: |SUMMARY: ' "$BUILD/$t.log" | head -n 3 | sed 's/^/   /'
    summary+=("$t: CRASH ($found)"); fail=1
  elif [ $rc -ne 0 ]; then
    echo "   exit $rc without an artifact; see $BUILD/$t.log"; tail -n 5 "$BUILD/$t.log" | sed 's/^/   /'
    summary+=("$t: exit $rc"); fail=1
  else
    summary+=("$t: ok ($(grep -o 'number_of_executed_units: [0-9]*' "$BUILD/$t.log" | grep -o '[0-9]*') runs)")
  fi
done
echo "fuzz summary:"; printf '  %s\n' "${summary[@]}"
exit $fail
