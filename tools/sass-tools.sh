#!/usr/bin/env bash
# tools/sass-tools.sh — installs cuobjdump and nvdisasm (PyPI's nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm wheels) into a virtual environment under build/sass-tools, with links in
# build/sass-tools/bin, for the static SASS checks (tests/e2e_sass.sh). The CUDA toolkit of the
# development machines has nvcc and ptxas but not these two. Idempotent: does nothing when they
# are there and run. Never fails a build: without Python, pip or the registry it says why and
# exits 0, and the test then SKIPs. `make sass-tools` runs it; .ci/run calls that before
# `make test` (which itself never needs Python).
set -u
cd "$(dirname "$0")/.." || exit 0
D=${PLN_SASS_TOOLS:-build/sass-tools}
if "$D/bin/cuobjdump" --version > /dev/null 2>&1 && "$D/bin/nvdisasm" --version > /dev/null 2>&1; then
  echo "sass-tools: $D/bin/cuobjdump and nvdisasm present"; exit 0
fi
command -v python3 > /dev/null || { echo "sass-tools: python3 not found, SASS checks will SKIP"; exit 0; }
mkdir -p "$(dirname "$D")"
if [ ! -x "$D/bin/pip" ]; then
  python3 -m venv "$D" > "$D.log" 2>&1 || { echo "sass-tools: python3 -m venv failed (python3-venv missing?), SASS checks will SKIP: $(tail -1 "$D.log")"; exit 0; }
fi
# 13.x reads the cubins of CUDA 12 and 13 toolkits alike (sm_80, sm_90a).
if ! "$D/bin/pip" install -q "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" >> "$D.log" 2>&1; then
  echo "sass-tools: pip install failed, SASS checks will SKIP: $(tail -1 "$D.log")"; exit 0
fi
for t in cuobjdump nvdisasm; do
  p=$(find "$D/lib" -path "*/nvidia/*/bin/$t" -type f | head -1)
  [ -n "$p" ] || { echo "sass-tools: $t not found in the wheel, SASS checks will SKIP"; exit 0; }
  ln -sf "$(readlink -f "$p")" "$D/bin/$t"
done
"$D/bin/cuobjdump" --version | tail -1
