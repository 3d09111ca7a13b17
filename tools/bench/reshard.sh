#!/usr/bin/env bash
# reshard.sh — `pollen reshard` throughput against this machine's I/O floor, measured in the same
# run: floor = reading the source (cat SRC/* > /dev/null) + writing the same number of output
# bytes (dd ... conv=fsync, as reshard fsyncs before its rename). reshard writes with O_DIRECT
# where the file system takes it (PLN_WRITE_DIRECT, formats/shard.c) while that dd writes through
# the page cache, so a second floor writes with dd oflag=direct too (floorD, ratioD); whichever
# write is faster on the day is the stricter reference. Warm cache (source in the page
# cache) and cold cache (source evicted first with dd iflag=nocache). Also the peak RSS of a
# reshard of a ~6 GB bf16 checkpoint (synth bloom-3b). Prints one table, the machine above it
# (tools/bench/machine.sh: CPU, flags, cores, memory, load, copy bandwidth) and the load average
# after it; figures go to docs/BENCHMARKS.md with this command line.
#
#   tools/bench/reshard.sh                      # bloom-1b7 fp16 source, TP 2, then the 6 GB RSS run
#   MODEL=bloom-3b TP=4 RSS_RUN=0 tools/bench/reshard.sh
# Needs ~3x the model size free under BENCH_DIR (default /tmp; a fresh pln-bench-reshard.XXXXXX
# inside it), and ~10 GB of /dev/shm (SHM_DIR) for the RSS run (else it uses BENCH_DIR); the
# scratch directories it made are removed after. ~3-7 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
POLLEN=${POLLEN:-build/pollen}
MODEL=${MODEL:-bloom-1b7}
TP=${TP:-2}
# Scratch is a fresh directory made inside BENCH_DIR / SHM_DIR: only what this script created is
# ever removed, never the directory a caller named.
mkdir -p "${BENCH_DIR:-/tmp}"
DIR=$(mktemp -d "${BENCH_DIR:-/tmp}/pln-bench-reshard.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
RSS_RUN=${RSS_RUN:-1}
[ -x "$POLLEN" ] || { echo "build first: make" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }
size_of() { du -cb "$@" | tail -n 1 | cut -f 1; }
evict() { sync; for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none 2>/dev/null || true; done; }
# floor_write BYTES: dd the same number of bytes to disk with fsync; prints seconds
# Every timed step starts with `sync`, so no step pays for the previous one's writeback (synth
# leaves gigabytes of dirty pages behind; a buffered dd right after it measured 0.4 GB/s).
floor_write() {
  sync; local t0=$(now)
  dd if=/dev/zero of="$DIR/floor.bin" bs=8M count=$(( ($1 + 8388607) / 8388608 )) conv=fsync status=none
  local t1=$(now); rm -f "$DIR/floor.bin"; secs "$t0" "$t1"
}
# floor_write_direct BYTES: the same with O_DIRECT (no page-cache copy), as reshard writes
floor_write_direct() {
  sync; local t0=$(now)
  dd if=/dev/zero of="$DIR/floor.bin" bs=8M count=$(( ($1 + 8388607) / 8388608 )) oflag=direct conv=fsync status=none
  local t1=$(now); rm -f "$DIR/floor.bin"; secs "$t0" "$t1"
}
floor_read() { sync; local t0=$(now); cat "$@" > /dev/null; secs "$t0" "$(now)"; }
# run_reshard ARGS...: prints "seconds maxrss_kb out_bytes cpu_seconds"
run_reshard() {
  local out="$DIR/out"; rm -rf "$out"; sync
  PLN_RESHARD_TIMING=1 /usr/bin/time -v -o "$DIR/time.txt" "$POLLEN" reshard "$SRC" -o "$out" --quiet "$@" 2>"$DIR/rs.err" \
    || { cat "$DIR/rs.err" >&2; exit 1; }
  local wall=$(awk -F': ' '/Elapsed \(wall clock\)/{n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$DIR/time.txt")
  local rss=$(awk -F': ' '/Maximum resident set size/{print $2}' "$DIR/time.txt")
  local cpu=$(awk -F': ' '/User time|System time/{s+=$2} END{printf "%.1f", s}' "$DIR/time.txt")
  echo "$wall $rss $(size_of "$out") $cpu"
  rm -rf "$out"
}

# shellcheck source=tools/bench/machine.sh
source tools/bench/machine.sh
echo "# pollen reshard benchmark — $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_report "$(getconf _NPROCESSORS_ONLN)" "$POLLEN"
echo "# source: pollen synth --model $MODEL (fp16), TP $TP"
t0=$(now); "$POLLEN" synth --model "$MODEL" -o "$DIR/src" --quiet; t1=$(now)
SRC=$DIR/src
SRC_FILES=("$SRC"/*.safetensors)
IN=$(size_of "${SRC_FILES[@]}")
echo "# synth: $(awk -v b="$IN" 'BEGIN{printf "%.2f GB", b/1e9}') in $(secs "$t0" "$t1") s"
printf "%-14s %-5s %7s %7s %8s %8s %8s %7s %8s %7s %9s %6s\n" case cache "in_GB" "out_GB" "time_s" "GB/s_in" "floor_s" ratio "floorD_s" ratioD "maxRSS_MB" "cpu_s"
row() { # case cache in out t floor floor_direct rss cpu
  awk -v c="$1" -v k="$2" -v i="$3" -v o="$4" -v t="$5" -v f="$6" -v g="$7" -v r="$8" -v u="$9" 'BEGIN{
    printf "%-14s %-5s %7.2f %7.2f %8.2f %8.2f %8.2f %7.2f %8.2f %7.2f %9.0f %6s\n", c, k, i/1e9, o/1e9, t, (t>0? i/1e9/t : 0), f, (f>0? t/f : 0), g, (g>0? t/g : 0), r/1024, u }'
}
# The write floor depends only on the byte count: measured once per output size.
declare -A FW FWD
for cache in warm cold; do
  for dt in fp16 int8; do
    if [ $cache = warm ]; then cat "${SRC_FILES[@]}" > /dev/null; else evict "${SRC_FILES[@]}"; fi
    read -r t rss out cpu < <(run_reshard --tp "$TP" --dtype "$dt")
    # the read floor in the same cache state
    if [ $cache = warm ]; then cat "${SRC_FILES[@]}" > /dev/null; else evict "${SRC_FILES[@]}"; fi
    fr=$(floor_read "${SRC_FILES[@]}")
    [ -n "${FW[$dt]:-}" ] || FW[$dt]=$(floor_write "$out")
    [ -n "${FWD[$dt]:-}" ] || FWD[$dt]=$(floor_write_direct "$out")
    fw=${FW[$dt]}; fwd=${FWD[$dt]}
    fl=$(awk -v a="$fr" -v b="$fw" 'BEGIN{printf "%.2f", a+b}')
    fld=$(awk -v a="$fr" -v b="$fwd" 'BEGIN{printf "%.2f", a+b}')
    row "reshard-$dt" $cache "$IN" "$out" "$t" "$fl" "$fld" "$rss" "$cpu"
    echo "    reshard: $(grep -Eo '[A-Z_a-z]+ writes' "$DIR/rs.err"), $(grep -Eo 'rank files finished \(fsync\) [0-9.]+ s' "$DIR/rs.err")"
    echo "    floor = read $fr s (cat) + write $fw s (dd conv=fsync of $(awk -v b="$out" 'BEGIN{printf "%.2f GB", b/1e9}')); floorD: write $fwd s (dd oflag=direct conv=fsync)"
  done
done
rm -rf "$SRC"

# Peak RSS on a ~6 GB checkpoint (bloom-3b in bf16), and the conversion's own speed: source and
# output in RAM (/dev/shm, when it has room) so no disk is involved — tmpfs pages a process maps
# count in its RSS, so this is the strictest place to measure memory.
if [ "$RSS_RUN" = 1 ]; then
  SHM=
  if [ "$(df -B1 --output=avail /dev/shm 2>/dev/null | tail -n 1)" -gt 11000000000 ] 2>/dev/null; then
    SHM=$(mktemp -d "${SHM_DIR:-/dev/shm}/pln-bench-reshard.XXXXXX"); base=$SHM
  else
    base=$DIR
  fi
  trap 'rm -rf "$DIR" ${SHM:+"$SHM"}' EXIT
  "$POLLEN" synth --model "${RSS_MODEL:-bloom-3b}" --dtype bf16 -o "$base/src3b" --quiet
  SRC=$base/src3b
  IN=$(size_of "$SRC"/*.safetensors)
  for dt in fp16 int8; do
    rm -rf "$base/out"
    /usr/bin/time -v -o "$DIR/time.txt" "$POLLEN" reshard "$SRC" -o "$base/out" --tp "$TP" --dtype $dt --quiet
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/{n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$DIR/time.txt")
    rss=$(awk -F': ' '/Maximum resident set size/{print $2}' "$DIR/time.txt")
    cpu=$(awk -F': ' '/User time|System time/{s+=$2} END{printf "%.1f", s}' "$DIR/time.txt")
    out=$(size_of "$base/out")
    echo "# ${RSS_MODEL:-bloom-3b} bf16 $(awk -v b="$IN" 'BEGIN{printf "%.2f GB", b/1e9}') -> TP $TP $dt $(awk -v b="$out" 'BEGIN{printf "%.2f GB", b/1e9}') in $base: $wall s ($(awk -v b="$IN" -v t="$wall" 'BEGIN{printf "%.2f GB/s in", b/1e9/t}')), cpu $cpu s, max RSS $(awk -v r="$rss" 'BEGIN{printf "%.0f MB", r/1024}')"
  done
  rm -rf "$base/out" "$SRC"
fi
machine_load_after "$POLLEN"
