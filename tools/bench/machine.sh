# shellcheck shell=bash
# machine.sh — sourced by the benchmark scripts (cpu-vs-llamacpp.sh, cpu.sh, reshard.sh,
# quality.sh) to print, beside every table, the machine that made it:
#
#   machine_report THREADS [POLLEN]   "# "-prefixed lines: CPU model name, vendor, family / model /
#                                     stepping (decimal) and the microarchitecture where the table
#                                     below knows it, the SIMD flags that matter to the kernels,
#                                     online CPUs and the threads the benchmark uses, memory, the
#                                     load average, and (with POLLEN, a built pollen) the STREAM
#                                     copy bandwidth on one thread and on all online CPUs
#                                     (`pollen bench --copy-only`, the ceiling of pollen bench's MBU;
#                                     arrays of MACHINE_STREAM_MIB MiB, default 512) and the FMA
#                                     peak of pollen's CPU kernels' tier, the ceiling of the
#                                     compute-bound figures, on 1 thread and on all of them, and
#                                     how far apart the first two CPUs are (core-to-core, ns)
#   machine_load_after [POLLEN]       "# load average after: ...", and the core-to-core latency
#
# A table is worth keeping only beside a low load average; the copy bandwidth says what the memory
# gave on the day (a VM's moves from run to run).

# machine_uarch VENDOR FAMILY MODEL STEPPING: the microarchitecture name, or nothing when unknown.
# Families and models in decimal, as /proc/cpuinfo prints them (AMD's PPR and Intel's SDM list
# them in hex: AMD family 19h model 11h = 25 / 17).
machine_uarch() {
  local v=$1 f=$2 m=$3 s=$4
  case $v in
    AuthenticAMD)
      case $f in
        23) case $m in
              1) echo "Zen \"Naples\"" ;; 8) echo "Zen+" ;; 49) echo "Zen 2 \"Rome\"" ;; 113) echo "Zen 2 \"Matisse\"" ;;
              *) echo "Zen / Zen 2" ;;
            esac ;;
        25) if [ "$m" -eq 1 ]; then echo "Zen 3 \"Milan\""
            elif [ "$m" -eq 8 ]; then echo "Zen 3 \"Chagall\""
            elif [ "$m" -eq 24 ]; then echo "Zen 4 \"Storm Peak\""
            elif [ "$m" -ge 16 ] && [ "$m" -le 31 ]; then echo "Zen 4 \"Genoa\""
            elif [ "$m" -eq 33 ]; then echo "Zen 3 \"Vermeer\""
            elif [ "$m" -eq 97 ]; then echo "Zen 4 \"Raphael\""
            elif [ "$m" -ge 160 ] && [ "$m" -le 175 ]; then echo "Zen 4c \"Bergamo\""
            else echo "Zen 3 / Zen 4"; fi ;;
        26) if [ "$m" -le 15 ]; then echo "Zen 5 \"Turin\""
            elif [ "$m" -le 31 ]; then echo "Zen 5c \"Turin Dense\""
            else echo "Zen 5"; fi ;;
      esac ;;
    GenuineIntel)
      [ "$f" = 6 ] || return 0
      case $m in
        63) echo "Haswell-EP" ;; 79) echo "Broadwell-EP" ;;
        85) if [ "$s" -le 4 ]; then echo "Skylake-SP"; elif [ "$s" -le 7 ]; then echo "Cascade Lake"; else echo "Cooper Lake"; fi ;;
        106|108) echo "Ice Lake-SP" ;; 143) echo "Sapphire Rapids" ;; 207) echo "Emerald Rapids" ;;
        173|174) echo "Granite Rapids" ;; 175) echo "Sierra Forest" ;;
        142|158) echo "Kaby Lake / Coffee Lake" ;; 165) echo "Comet Lake" ;; 126) echo "Ice Lake" ;; 140|141) echo "Tiger Lake" ;;
        151|154) echo "Alder Lake" ;; 183|186|191) echo "Raptor Lake" ;; 170) echo "Meteor Lake" ;;
      esac ;;
  esac
}

# machine_cpuinfo FIELD: the first value of FIELD in /proc/cpuinfo, or "?"
machine_cpuinfo() {
  local v
  v=$(awk -F': *' -v k="$1" '{ sub(/[ \t]+$/, "", $1) } $1 == k { print $2; exit }' /proc/cpuinfo 2>/dev/null)
  echo "${v:-?}"
}

machine_report() {
  local threads=${1:-?} pollen=${2:-} vendor fam mod step uarch flags have="" f cpus mem
  vendor=$(machine_cpuinfo vendor_id); fam=$(machine_cpuinfo "cpu family")
  mod=$(machine_cpuinfo model); step=$(machine_cpuinfo stepping)
  uarch=$(machine_uarch "$vendor" "$fam" "$mod" "$step")
  flags=" $(machine_cpuinfo flags) "
  for f in avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8 amx_bf16; do
    case $flags in *" $f "*) have+=" $f" ;; esac
  done
  cpus=$(getconf _NPROCESSORS_ONLN)
  mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
  echo "# machine: $(machine_cpuinfo "model name"); $vendor family $fam model $mod stepping $step${uarch:+ ($uarch)}"
  echo "# flags:${have:- none of avx2 fma f16c avx512f avx512_vnni avx512_bf16 avx_vnni amx}; $cpus online CPUs, $threads threads used; $mem memory; kernel $(uname -r)"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ -n "$pollen" ] && [ -x "$pollen" ]; then
    local j1 jn isa mib=${MACHINE_STREAM_MIB:-512}
    j1=$("$pollen" bench --copy-only --threads 1 --stream-mib "$mib" --json 2>/dev/null || true)
    jn=$("$pollen" bench --copy-only --threads "$cpus" --stream-mib "$mib" --json 2>/dev/null || true)
    field() { grep -o "\"$1\":[0-9.e+-]*" <<<"$2" | cut -d: -f2 | awk '{ if ($1 == "") print "?"; else printf "%.1f", $1 }'; }
    isa=$(grep -o '"cpu_isa":"[a-z0-9]*"' <<<"$jn" | cut -d'"' -f4)
    printf '# STREAM copy (pollen bench --copy-only, %s MiB arrays, read + write bytes): %s GB/s on 1 thread, %s GB/s on %s threads\n' \
      "$mib" "$(field stream_copy_gbs "$j1")" "$(field stream_copy_gbs "$jn")" "$cpus"
    # the compute-bound figures' ceiling (prefill, large batches), on the tier pollen's kernels
    # run (PLN_CPU_ISA lowers it, as --avx2 does)
    printf '# FMA peak (pollen bench --copy-only, fp32 multiply-adds, %s kernels): %s GFLOP/s on 1 thread, %s GFLOP/s on %s threads\n' \
      "${isa:-?}" "$(field fma_peak_gflops "$j1")" "$(field fma_peak_gflops "$jn")" "$cpus"
    machine_c2c "$pollen" "$jn"
  fi
}

# machine_c2c POLLEN [JSON]: how far apart the first two CPUs are (kernels/cpu/cpu.h
# NEIGHBOUR_NOTE: on a VM it changes while a table runs, and with it the two-thread figures)
machine_c2c() {
  local j=${2:-} ns
  [ -n "$j" ] || j=$("$1" bench --copy-only --stream-mib 8 --json 2>/dev/null || true)
  ns=$(grep -o '"core_to_core_ns":[0-9.e+-]*' <<<"$j" | cut -d: -f2 | awk '{ printf "%.0f", $1 }')
  echo "# core to core (pollen bench --copy-only, the first two CPUs, one way): ${ns:-n/a} ns"
}

# machine_load_after [POLLEN]: the load average after a table, and with POLLEN the core-to-core
# latency again
machine_load_after() {
  echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ -n "${1:-}" ] && [ -x "$1" ]; then machine_c2c "$1"; fi
}
