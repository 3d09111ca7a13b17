#!/usr/bin/env bash
# tools/bench/gpu-bundle.sh — prebuilt binaries for tools/bench/gpu.sh, for a GPU machine that has
# the CUDA libraries and NCCL (toolkit or PyTorch's pip wheels) but not pollen's -dev packages
# (jansson, libarchive, xxhash, pcre2, microhttpd) and no network to install them, or where a
# build would eat minutes of a short GPU lease.
# Builds here (CUDA=1, MPI off: one rank needs no launcher; --as-needed; debug info stripped),
# copies the shared libraries the binaries need into lib/, except the C runtime and the CUDA/NCCL
# libraries (libcublasLt alone is 540 MB: the GPU machine provides them), and packs it all into
# build/gpu-bundle/bundle.tar.gz with build/gpu-bundle/SOURCE, the hash of the sources it was built
# from. Packed, because the tree and what it carries must stay under 64 MiB and the libraries
# alone are 44 MB (libicu's data, pulled in by libarchive -> libxml2); gzip is on every machine.
# It also carries compute-sanitizer (sanitizer/, from PyPI) for a machine whose toolkit has none.
# Carry build/gpu-bundle with the tree; gpu.sh unpacks it and uses it without building when SOURCE
# matches the tree it runs on.
#   tools/bench/gpu-bundle.sh          build and pack
#   tools/bench/gpu-bundle.sh --hash   print the hash of the sources (what SOURCE holds)
set -eu
cd "$(dirname "$0")/../.."
# The sources that go into the binaries (not the scripts, docs or fixtures).
srchash() {
  ls Makefile formats/*.[ch] runtime/*.[ch] kernels/*.[ch] kernels/cpu/*.[ch] kernels/cuda/*.c \
     kernels/cuda/*.h kernels/cuda/*.cu kernels/cuda/*.cuh tools/*.[ch] tests/*.h tests/gpu/*.c 2>/dev/null |
    LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16
}
if [ "${1:-}" = --hash ]; then srchash; exit 0; fi

B=build/gpu-bundle
rm -rf $B
make -j"$(nproc)" CUDA=1 BUILD=$B MPI_CFLAGS= MPI_LIBS= LDFLAGS=-Wl,--as-needed \
  $B/pollen $B/tests-gpu/test_cuda_ops $B/tests-gpu/test_cuda_e2e $B/tests-gpu/test_cuda_nccl $B/tests-gpu/bench_decode
bins="$B/pollen $B/tests-gpu/test_cuda_ops $B/tests-gpu/test_cuda_e2e $B/tests-gpu/test_cuda_nccl $B/tests-gpu/bench_decode"
strip --strip-debug $bins
mkdir -p $B/lib
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libnvidia|libcudart|libcublas|libnccl)'
for b in $bins; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    echo "$name" | grep -Eq "$skip" && continue
    cp -L "$path" "$B/lib/$name"
  done
done
# Self-check: with the bundle's lib/ first, every library resolves; list what the GPU machine
# must provide (the CUDA/NCCL libraries) and what came from the system's C runtime.
notfound=$(for b in $bins; do LD_LIBRARY_PATH=$B/lib ldd "$b" | grep 'not found' || true; done | sort -u)
if [ -n "$notfound" ]; then echo "gpu-bundle: libraries not found:"; echo "$notfound"; exit 1; fi
echo "the GPU machine must provide:" \
  $(for b in $bins; do LD_LIBRARY_PATH=$B/lib ldd "$b"; done | awk '{print $1}' | grep -E "^(libcuda|libcudart|libcublas|libnccl)" | sort -u) libcuda.so.1
# compute-sanitizer (PyPI's nvidia-cuda-sanitizer-api; docs, headers and 32-bit helpers left out), for a GPU machine
# whose toolkit lacks it; optional: without pip or the registry the bundle goes without.
san=""
if tmp=$(mktemp -d) && timeout 300 python3 -m pip download -q --no-deps -d "$tmp" "nvidia-cuda-sanitizer-api>=13,<14" > "$tmp/log" 2>&1 &&
   python3 -m zipfile -e "$tmp"/nvidia_cuda_sanitizer_api-*.whl "$tmp/x" &&
   d=$(dirname "$(find "$tmp/x" -path '*/compute-sanitizer/compute-sanitizer' -type f | head -1)") && [ "$d" != . ]; then
  rm -rf "$d/docs" "$d/include" "$d/x86"; cp -r "$d" $B/sanitizer; chmod +x $B/sanitizer/compute-sanitizer $B/sanitizer/TreeLauncher* 2>/dev/null
  san=sanitizer
else
  echo "gpu-bundle: no compute-sanitizer in the bundle (pip download failed: $(tail -1 "$tmp/log" 2>/dev/null))"
fi
rm -rf "$tmp"
srchash > $B/SOURCE
tar -C $B -czf $B/bundle.tar.gz pollen tests-gpu lib SOURCE $san
# leave only what is carried: the packed bundle and its SOURCE
find $B -mindepth 1 -maxdepth 1 ! -name bundle.tar.gz ! -name SOURCE -exec rm -rf {} +
ls -la $B
du -sh $B
