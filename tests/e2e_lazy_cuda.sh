#!/usr/bin/env bash
# e2e_lazy_cuda.sh — the CUDA backend is loaded only when --backend cuda asks for it: pollen links
# no CUDA library (they live in libpollen-cuda.so beside it), --version and a CPU generate run with
# LD_LIBRARY_PATH pointing nowhere, --backend cuda without a GPU fails with the backend's own clear
# message, and with the library missing or unloadable the error names it and what to do.
source "$(dirname "$0")/e2e.sh"
SO=$(dirname "$POLLEN")/libpollen-cuda.so
export OMP_NUM_THREADS=1
check "pollen links no CUDA library (ldd)" bash -c "! ldd '$POLLEN' | grep -E 'libcudart|libcublas|libnccl'"
check "--version without any library path" env LD_LIBRARY_PATH=/nonexistent "$POLLEN" --version
check "reshard a set for the CPU checks" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/s" --tp 1 \
  --dtype fp16 --quiet
out=$(env LD_LIBRARY_PATH=/nonexistent "$POLLEN" generate "$TMP/s" --token-ids 5,17,42 --max-new-tokens 3 --json --quiet)
check "a CPU generate without any library path (3 ids)" bash -c "echo '$out' | grep -Eq '\"ids\":\[[0-9]+,[0-9]+,[0-9]+\]'"
# what the dynamic loader really opens at run time (ldd shows only the link): no CUDA library, and
# not libpollen-cuda.so either, on the CPU path
LD_DEBUG=files "$POLLEN" generate "$TMP/s" --token-ids 5,17 --max-new-tokens 1 --quiet >/dev/null 2>"$TMP/ld.log"
check "a CPU generate opens no CUDA library at run time" bash -c "grep -q 'file=' '$TMP/ld.log' && ! grep -Eq 'file=[^ ]*(libcudart|libcublas|libnccl|libpollen-cuda)' '$TMP/ld.log'"
if [ ! -e "$SO" ]; then
  echo "SKIP: $SO not built (CUDA=0 build): the loader's checks need it"; e2e_done; exit 0
fi
# a CUDA=0 pollen never opens the library, even when one from an earlier CUDA build lies beside it
if "$POLLEN" generate "$TMP/s" --token-ids 5 --max-new-tokens 1 --backend cuda 2>&1 | grep -q "this build has no CUDA backend"; then
  echo "SKIP: $POLLEN is a CUDA=0 build ($SO is from another build): the loader's checks need a CUDA build"
  e2e_done; exit 0
fi
check "libpollen-cuda.so links the CUDA runtime" bash -c "ldd '$SO' | grep -q libcudart"
LD_DEBUG=files "$POLLEN" generate "$TMP/s" --token-ids 5,17 --max-new-tokens 1 --backend cuda >/dev/null 2>"$TMP/ldc.log"
check "--backend cuda does open libpollen-cuda.so and cudart (the check above can see them)" \
  bash -c "grep -q 'file=[^ ]*libpollen-cuda.so' '$TMP/ldc.log' && grep -q 'file=[^ ]*libcudart' '$TMP/ldc.log'"
# --backend cuda: the library loads; without a GPU the backend says so (as before the split).
if [ ! -e /dev/nvidiactl ]; then
  check_fails "--backend cuda without a GPU: the backend's clear error" 'no NVIDIA GPU or driver on this machine' \
    "$POLLEN" generate "$TMP/s" --token-ids 5,17 --max-new-tokens 1 --backend cuda
fi
# A pollen without the library beside it: the error names the library and what to do, no crash.
mkdir -p "$TMP/bin" "$TMP/bad"
cp "$POLLEN" "$TMP/bin/pollen"
check_fails "--backend cuda without libpollen-cuda.so: names it" \
  "the CUDA backend needs $TMP/bin/libpollen-cuda.so .*cannot open shared object file.*or use --backend cpu" \
  "$TMP/bin/pollen" generate "$TMP/s" --token-ids 5,17 --max-new-tokens 1 --backend cuda
ref_out=$("$POLLEN" generate "$TMP/s" --token-ids 5,17 --max-new-tokens 1 --quiet)
check "... and the CPU backend there still works (the same text as beside the library)" \
  bash -c "out=\$(\"$TMP/bin/pollen\" generate \"$TMP/s\" --token-ids 5,17 --max-new-tokens 1 --quiet) && [ -n \"\$out\" ] && [ \"\$out\" = \"\$1\" ]" _ "$ref_out"
# An unloadable library (not an ELF file): the loader's reason, still no crash.
cp "$POLLEN" "$TMP/bad/pollen"
echo "not a shared object" >"$TMP/bad/libpollen-cuda.so"
check_fails "--backend cuda with an unloadable libpollen-cuda.so" \
  "the CUDA backend needs $TMP/bad/libpollen-cuda.so .*(invalid ELF header|file too short)" \
  "$TMP/bad/pollen" generate "$TMP/s" --token-ids 5,17 --max-new-tokens 1 --backend cuda
e2e_done
