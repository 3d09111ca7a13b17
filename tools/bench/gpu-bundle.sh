#!/usr/bin/env bash
# tools/bench/gpu-bundle.sh — prebuilt binaries for tools/bench/gpu.sh, for a GPU machine that has
# nvcc, the CUDA libraries and NCCL (toolkit or PyTorch's pip wheels) but not pollen's -dev
# packages (jansson, libarchive, xxhash, pcre2, microhttpd) and no network to install them.
# Builds here into build/gpu-bundle/ (CUDA=1, MPI off: one rank needs no launcher; --as-needed; debug
# info stripped) and copies the shared libraries the binaries need, except the C runtime and the
# CUDA/NCCL libraries the GPU machine provides, into build/gpu-bundle/lib. Carry build/gpu-bundle with the
# tree (it must stay under the 64 MiB carry limit: the script prints its size).
set -eu
cd "$(dirname "$0")/../.."
B=build/gpu-bundle
make -j"$(nproc)" CUDA=1 BUILD=$B MPI_CFLAGS= MPI_LIBS= LDFLAGS=-Wl,--as-needed \
  $B/pollen $B/tests-gpu/test_cuda_ops $B/tests-gpu/test_cuda_e2e $B/tests-gpu/test_cuda_nccl $B/tests-gpu/bench_decode
bins="$B/pollen $B/tests-gpu/test_cuda_ops $B/tests-gpu/test_cuda_e2e $B/tests-gpu/test_cuda_nccl $B/tests-gpu/bench_decode"
strip --strip-debug $bins
rm -rf $B/lib; mkdir -p $B/lib
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libnvidia|libcudart|libcublas|libnccl)'
for b in $bins; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    echo "$name" | grep -Eq "$skip" && continue
    cp -L "$path" "$B/lib/$name"
  done
done
rm -rf $B/formats $B/runtime $B/tools $B/kernels $B/tests $B/libpollen.a   # objects: not needed there
ls -la $B/lib
du -sh $B
