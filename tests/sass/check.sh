#!/usr/bin/env bash
# tests/sass/check.sh — static checks of the device code nvcc makes for one architecture (sm_90a by
# default): compiles each .cu to a cubin with `-Xptxas -v`, reads the SASS and the ELF attributes
# with cuobjdump, prints one row per kernel and one "FAIL kernel: why" line per broken rule, and
# exits with the number of failures (0: all good; 100 at most). No Python, no GPU.
#   tests/sass/check.sh EXPECT FILE.cu...   (from anywhere; WORK=dir keeps the intermediate files)
#   tests/sass/check.sh --probe             exit 0 when the tools are there, else say which is missing
# Every kernel, always (a device function ptxas did not inline gets a row and the first two):
#   - no spills: ptxas's "0 bytes spill stores, 0 bytes spill loads";
#   - no local memory: "0 bytes stack frame" and no LDL/STL instruction in its SASS (a register
#     array indexed at run time lands there without being a spill);
#   - registers within the budget its launch bounds assume: 65536 / the block size, rounded down
#     to 8 and at most 255, where the block size is that of __launch_bounds__ (EIATTR_MAX_THREADS),
#     else `threads=N` from EXPECT, else 256 (every launcher uses at most 256 threads where no bound
#     is declared); lower where ptxas recorded a register cap (EIATTR_MAXREG_COUNT: launch bounds
#     with a minimum of blocks per SM) or EXPECT says `regs<=N`.
# EXPECT: one line per pattern, `REGEX rule...` (# starts a comment). REGEX is an awk regex over the
# demangled kernel name with its template arguments, without spaces and parameters, e.g.
# `gemv_kernel<true,false,16,float>`; every pattern but a `library` one must match at least one
# kernel (a renamed kernel would escape its rules). Rules:
#   ldg128 stg128 lds128 sts128   at least one 128-bit global load / global store / shared load /
#                                 shared store (LDG.E.128, LDG.E.128.CONSTANT, LDG.E.EF.128, ...)
#   COUNTER<=N COUNTER>=N COUNTER=N   on any counter of the table (ldg32<=0: no 32-bit global loads)
#   threads=N                     the block size of a kernel without launch bounds
#   regs<=N                       a tighter register budget than the launch bounds give
#   library                       code that is not pollen's (CUB): reported, not checked
# Counters: ldg128 ldg64 ldg32 ldg16 ldg8 (global loads by width; the LD generic loads count in
# ld), stg*, lds*, sts* likewise, ldsm (ldmatrix), ldgsts (cp.async), local (LDL+STL); programmatic
# dependent launch: pdlwait (griddepcontrol.wait, ACQBULK in the SASS), pdltrigger
# (griddepcontrol.launch_dependents, PREEXIT), ldgpre (global loads before the first pdlwait),
# ldgstspre (cp.async before the first pdlwait).
# Tools: NVCC (else nvcc on PATH or /usr/local/cuda/bin), CUOBJDUMP (else cuobjdump on PATH, the
# toolkit's, or the one `make sass-tools` puts in build/sass-tools). Flags: NVCCFLAGS of the
# Makefile without its -gencode list, plus -arch=$PLN_SASS_ARCH -cubin -Xptxas -v.
set -u
cd "$(dirname "$0")/../.." || exit 100
ARCH=${PLN_SASS_ARCH:-sm_90a}
find_tools() {   # sets NVCC and CUOBJDUMP, or prints why not and returns 1
  NVCC=${NVCC:-$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })}
  local d c=${CUOBJDUMP:-}
  if [ -z "$c" ]; then
    for d in "$(command -v cuobjdump)" "$(dirname "${NVCC:-/x/x}")/cuobjdump" build/sass-tools/bin/cuobjdump; do
      [ -n "$d" ] && [ -x "$d" ] && { c=$d; break; }
    done
  fi
  CUOBJDUMP=$c
  [ -n "$NVCC" ] || { echo "nvcc not found (CUDA toolkit absent)"; return 1; }
  [ -n "$CUOBJDUMP" ] || { echo "cuobjdump not found (make sass-tools installs it into build/sass-tools)"; return 1; }
  command -v c++filt >/dev/null || { echo "c++filt not found (binutils)"; return 1; }
}
if [ "${1:-}" = --probe ]; then find_tools; exit $?; fi   # check.sh --probe: why not, or nothing
if [ $# -lt 2 ]; then echo "usage: $0 EXPECT FILE.cu... | --probe" >&2; exit 100; fi
EXPECT=$1; shift
why=$(find_tools) || { echo "check.sh: $why" >&2; exit 100; }
find_tools
# cuobjdump runs nvdisasm: the one next to it first (the wheel keeps both in one directory).
export PATH="$(dirname "$(readlink -f "$CUOBJDUMP")"):$PATH"
FLAGS=$(make -s --no-print-directory --eval 'pln-print-nvccflags: ; @echo $(NVCCFLAGS)' pln-print-nvccflags 2>/dev/null)
[ -n "$FLAGS" ] || { echo "check.sh: cannot read NVCCFLAGS from the Makefile" >&2; exit 100; }
FLAGS=$(echo "$FLAGS" | tr ' ' '\n' | grep -v -e '^-gencode' | tr '\n' ' ')
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/pln-sass.XXXXXX")}
mkdir -p "$WORK"

# ---- compile every file (two at a time) ----------------------------------------------------------
fails=0
pids=()
for cu in "$@"; do
  n=$(basename "$cu" .cu)
  # shellcheck disable=SC2086
  ( "$NVCC" $FLAGS -arch="$ARCH" -cubin -Xptxas -v -o "$WORK/$n.cubin" "$cu" > "$WORK/$n.ptxas" 2>&1 ) &
  pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
: > "$WORK/all.ptxas"; : > "$WORK/all.sass"; : > "$WORK/all.elf"
for cu in "$@"; do
  n=$(basename "$cu" .cu)
  if [ ! -s "$WORK/$n.cubin" ]; then
    echo "FAIL $cu: nvcc failed:"; tail -n 20 "$WORK/$n.ptxas" | sed 's/^/    /'; fails=$((fails + 1)); continue
  fi
  cat "$WORK/$n.ptxas" >> "$WORK/all.ptxas"
  "$CUOBJDUMP" -sass "$WORK/$n.cubin" >> "$WORK/all.sass" 2> "$WORK/$n.err" &&
    "$CUOBJDUMP" -elf "$WORK/$n.cubin" >> "$WORK/all.elf" 2>> "$WORK/$n.err" ||
    { echo "FAIL $cu: cuobjdump failed: $(head -c 300 "$WORK/$n.err")"; fails=$((fails + 1)); }
done

# ---- one record per function: mangled name and counters ---------------------------------------------
awk '
function width(op,   n, p, i, w) {   # bits moved by a load/store opcode such as LDG.E.128.CONSTANT
  n = split(op, p, "."); w = 32
  for (i = 2; i <= n; i++) {
    if (p[i] == "128") w = 128; else if (p[i] == "64") w = 64
    else if (p[i] == "U16" || p[i] == "S16") w = 16; else if (p[i] == "U8" || p[i] == "S8") w = 8
  }
  return w
}
function add(f, k) { c[f, k]++; seen[f] = 1 }
function num(x,   i, d, n) {   # "0x400" or "1024" (mawk has no strtonum)
  x = tolower(x); if (x !~ /^0x/) return x + 0
  n = 0; for (i = 3; i <= length(x); i++) { d = index("0123456789abcdef", substr(x, i, 1)) - 1; if (d < 0) break; n = n * 16 + d }
  return n
}
FILENAME ~ /all\.ptxas$/ {
  if (match($0, /Compiling entry function .[^'"'"' ]+/)) { cur = substr($0, RSTART + 25, RLENGTH - 25); gsub(/'"'"'/, "", cur); seen[cur] = 1; entry[cur] = 1 }
  else if (match($0, /Function properties for [^ ]+/)) { cur = substr($0, RSTART + 24, RLENGTH - 24); seen[cur] = 1 }
  else if ($0 ~ /bytes stack frame/) { stack[cur] = $1; spst[cur] = $5; spld[cur] = $9 }
  else if (match($0, /Used [0-9]+ registers/)) { regs[cur] = substr($0, RSTART + 5, RLENGTH - 15) + 0 }
  next
}
FILENAME ~ /all\.elf$/ {
  if ($0 ~ /^\.nv\.info\./) { cur = substr($1, 10); next }
  if ($0 ~ /^\./) { cur = ""; next }
  if ($0 ~ /Attribute:/) { attr = $2; next }
  if ($0 ~ /Value:/ && cur != "") {
    if (attr == "EIATTR_MAX_THREADS") maxt[cur] = num($2) * num($3) * num($4)
    if (attr == "EIATTR_MAXREG_COUNT") maxr[cur] = num($2)
  }
  next
}
FILENAME ~ /all\.sass$/ {
  if ($0 ~ /Function : /) { cur = $3; seen[cur] = 1; waited = 0; next }
  if (!match($0, /\/\*[0-9a-f]+\*\/ +[^;]*;/)) next
  s = substr($0, RSTART, RLENGTH); sub(/^\/\*[0-9a-f]+\*\/ +/, "", s)
  split(s, t, " "); op = t[1]; if (op ~ /^@/) op = t[2]
  b = op; sub(/\..*/, "", b)
  if (b == "LDG" && !waited) add(cur, "ldgpre")
  if (b == "LDGSTS" && !waited) add(cur, "ldgstspre")
  if (b == "ACQBULK") { add(cur, "pdlwait"); waited = 1 }
  else if (b == "PREEXIT") add(cur, "pdltrigger")
  else if (b == "LDG") add(cur, "ldg" width(op))
  else if (b == "STG") add(cur, "stg" width(op))
  else if (b == "LDS") add(cur, "lds" width(op))
  else if (b == "STS") add(cur, "sts" width(op))
  else if (b == "LDSM") add(cur, "ldsm")
  else if (b == "LDGSTS") add(cur, "ldgsts")
  else if (b == "LD") add(cur, "ld")
  else if (b == "LDL" || b == "STL") add(cur, "local")
  next
}
END {
  split("ldg128 ldg64 ldg32 ldg16 ldg8 ld stg128 stg64 stg32 stg16 stg8 lds128 lds64 lds32 lds16 lds8 sts128 sts64 sts32 sts16 sts8 ldsm ldgsts local pdlwait pdltrigger ldgpre ldgstspre", K, " ")
  for (f in seen) {
    line = f " entry=" (f in entry ? 1 : 0) " regs=" (f in regs ? regs[f] : -1) " stack=" (f in stack ? stack[f] : -1) \
           " spill=" ((f in spst ? spst[f] : -1) + (f in spld ? spld[f] : 0)) \
           " maxthreads=" (f in maxt ? maxt[f] : 0) " maxreg=" (f in maxr ? maxr[f] : 0)
    for (i = 1; i in K; i++) line = line " " K[i] "=" (c[f, K[i]] + 0)
    print line
  }
}' "$WORK/all.ptxas" "$WORK/all.elf" "$WORK/all.sass" | sort > "$WORK/records"

# demangled names without parameters, return type or spaces: gemv_kernel<true,false,16,float>
cut -d' ' -f1 "$WORK/records" | c++filt | awk '{
  s = $0; sub(/^void /, "", s); d = 0; out = ""
  for (i = 1; i <= length(s); i++) { ch = substr(s, i, 1); if (ch == "<") d++; if (ch == ">") d--; if (ch == "(" && d == 0) break; out = out ch }
  gsub(/ /, "", out); print out }' > "$WORK/names"
paste -d' ' "$WORK/names" "$WORK/records" > "$WORK/table"

# ---- the checks ------------------------------------------------------------------------------------
awk -v fails="$fails" '
FNR == NR {   # the expectations
  sub(/#.*/, ""); if (NF == 0) next
  np++; pat[np] = $1; rules[np] = ""
  for (i = 2; i <= NF; i++) rules[np] = rules[np] " " $i
  next
}
{
  name = $1; delete v
  for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] + 0 }
  lib = 0; thr = 0; rb = 0; nr = 0
  for (p = 1; p <= np; p++) if (name ~ pat[p] && (v["entry"] || rules[p] ~ / library/)) {
    hit[p]++; n = split(rules[p], r, " ")
    for (i = 1; i <= n; i++) {
      if (r[i] == "library") lib = 1
      else if (r[i] ~ /^threads=/) thr = substr(r[i], 9) + 0
      else if (r[i] ~ /^regs<=/) rb = substr(r[i], 7) + 0
      else { nr++; rr[nr] = r[i] }
    }
  }
  t = v["maxthreads"] > 0 ? v["maxthreads"] : (thr > 0 ? thr : 256)
  budget = int(65536 / t / 8) * 8; why = v["maxthreads"] > 0 ? t " threads of __launch_bounds__" : t " threads per block"
  if (budget > 255) budget = 255
  if (v["maxreg"] > 0 && v["maxreg"] < budget) { budget = v["maxreg"]; why = "launch bounds with blocks per SM" }
  if (rb > 0 && rb < budget) { budget = rb; why = "regs<=" rb " in the expectations" }
  bad = ""
  if (!v["entry"]) { budget = 0; nr = 0 }   # a device function ptxas did not inline: no launch, no rules
  if (!lib) {
    if (v["spill"] != 0) bad = bad sprintf("; spills (ptxas: %d bytes of spill stores + loads)", v["spill"])
    if (v["stack"] != 0) bad = bad sprintf("; %d bytes stack frame", v["stack"])
    if (v["local"] != 0) bad = bad sprintf("; %d local-memory instructions (LDL/STL)", v["local"])
    if (!v["entry"]) { }
    else if (v["regs"] < 0) bad = bad "; ptxas reported no register count"
    else if (v["regs"] > budget) bad = bad sprintf("; %d registers, over the budget of %d (%s)", v["regs"], budget, why)
    for (i = 1; i <= nr; i++) {
      x = rr[i]; op = ">="; lim = 1
      if (match(x, /(<=|>=|=)[0-9]+$/)) { op = substr(x, RSTART, RLENGTH); k = substr(x, 1, RSTART - 1); sub(/[0-9]+$/, "", op); lim = substr(x, RSTART + length(op)) + 0 } else k = x
      if (!(k in v)) { bad = bad "; unknown rule " x " in the expectations"; continue }
      ok = op == ">=" ? v[k] >= lim : op == "<=" ? v[k] <= lim : v[k] == lim
      if (!ok) bad = bad sprintf("; %s is %d, expected %s%d", k, v[k], op, lim)
    }
    delete rr; nr = 0
  }
  printf "%-52s %4d %4d %5d %5d %6d %5d %5d %6d %4d %6d %6d %6d %6d %5d %s\n", substr(name, 1, 52), v["regs"], budget, v["stack"], v["spill"],
    v["ldg128"], v["ldg64"], v["ldg32"], v["ldg16"] + v["ldg8"], v["ld"], v["stg128"], v["lds128"], v["lds64"] + v["lds32"] + v["lds16"] + v["lds8"] + v["ldsm"], v["sts128"], v["local"], lib ? "library" : bad == "" ? "ok" : "FAIL"
  if (bad != "") { fl[++nf] = "FAIL " name ": " substr(bad, 3) }
  delete rr; nr = 0
}
BEGIN { printf "%-52s %4s %4s %5s %5s %6s %5s %5s %6s %4s %6s %6s %6s %6s %5s\n", "kernel (sm_90a)", "regs", "max", "stack", "spill", "ldg128", "ldg64", "ldg32", "ldg<32", "ld", "stg128", "lds128", "lds<128", "sts128", "local" }
END {
  for (p = 1; p <= np; p++) if (!hit[p] && rules[p] !~ / library/) fl[++nf] = "FAIL expectation /" pat[p] "/ matches no kernel (renamed or removed?)"
  for (i = 1; i <= nf; i++) print fl[i]
  n = nf + fails; exit n > 100 ? 100 : n
}' "$EXPECT" "$WORK/table"
