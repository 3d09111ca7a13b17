#!/usr/bin/env bash
# e2e_bench_machine.sh — tools/bench/machine.sh, the machine line every benchmark table starts
# with: the microarchitecture table on known and unknown CPUs, and on this machine the CPU, the
# flags, the CPU count, memory, load, a positive STREAM copy, FMA peak and core-to-core latency
# from `pollen bench --copy-only`.
source "$(dirname "$0")/e2e.sh"
# shellcheck source=tools/bench/machine.sh
source tools/bench/machine.sh
uarch_is() { [ "$(machine_uarch "$1" "$2" "$3" "$4")" = "$5" ]; }
check "AMD family 25 model 17 is Zen 4 Genoa" uarch_is AuthenticAMD 25 17 1 'Zen 4 "Genoa"'
check "AMD family 25 model 1 is Zen 3 Milan" uarch_is AuthenticAMD 25 1 1 'Zen 3 "Milan"'
check "AMD family 26 model 2 is Zen 5 Turin" uarch_is AuthenticAMD 26 2 1 'Zen 5 "Turin"'
check "AMD family 26 model 17 is Zen 5c Turin Dense" uarch_is AuthenticAMD 26 17 0 'Zen 5c "Turin Dense"'
check "Intel 6/143 is Sapphire Rapids" uarch_is GenuineIntel 6 143 8 "Sapphire Rapids"
check "Intel 6/85 stepping 7 is Cascade Lake" uarch_is GenuineIntel 6 85 7 "Cascade Lake"
check "Intel 6/85 stepping 4 is Skylake-SP" uarch_is GenuineIntel 6 85 4 "Skylake-SP"
check "an unknown model names nothing" uarch_is GenuineIntel 6 9999 0 ""
check "an unknown vendor names nothing" uarch_is HygonGenuine 24 1 0 ""
check_fails "the table check can fail" "" uarch_is AuthenticAMD 25 17 1 'Zen 5 "Turin"'
out=$(MACHINE_STREAM_MIB=8 machine_report 3 "$POLLEN"; machine_load_after)
echo "$out"
check "the CPU line: model name, vendor, family/model/stepping in decimal" \
  grep -Eq '^# machine: .+; [^ ]+ family [0-9?]+ model [0-9?]+ stepping [0-9?]+' <<<"$out"
check "the CPU line names this machine's vendor" grep -q "; $(machine_cpuinfo vendor_id) family" <<<"$out"
check "online CPUs and threads used" grep -Eq "^# flags:.*; $(getconf _NPROCESSORS_ONLN) online CPUs, 3 threads used; [0-9.]+ GiB memory" <<<"$out"
if grep -qw avx2 /proc/cpuinfo; then check "the avx2 flag is listed" grep -Eq '^# flags:.* avx2( |;)' <<<"$out"; fi
check "load average before and after" bash -c 'grep -Eq "^# load average before: [0-9.]+ [0-9.]+ [0-9.]+$" <<<"$1" && grep -Eq "^# load average after: [0-9.]+" <<<"$1"' _ "$out"
check "a positive copy bandwidth on 1 thread and on all CPUs" \
  grep -Eq "^# STREAM copy \(pollen bench --copy-only, 8 MiB arrays, read \+ write bytes\): ([0-9]*[1-9][0-9]*\.[0-9]|0\.[1-9]) GB/s on 1 thread, ([0-9]*[1-9][0-9]*\.[0-9]|0\.[1-9]) GB/s on $(getconf _NPROCESSORS_ONLN) threads$" <<<"$out"
check "a positive FMA peak on 1 thread and on all CPUs, naming the kernels' tier" \
  grep -Eq "^# FMA peak \(pollen bench --copy-only, fp32 multiply-adds, (c|avx2|avx512) kernels\): ([0-9]*[1-9][0-9]*\.[0-9]|0\.[1-9]) GFLOP/s on 1 thread, ([0-9]*[1-9][0-9]*\.[0-9]|0\.[1-9]) GFLOP/s on $(getconf _NPROCESSORS_ONLN) threads$" <<<"$out"
if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then
  check "the core-to-core latency of the first two CPUs, positive" \
    grep -Eq "^# core to core \(pollen bench --copy-only, the first two CPUs, one way\): [1-9][0-9]* ns$" <<<"$out"
fi
out2=$(machine_load_after "$POLLEN")
check "machine_load_after POLLEN: the load and the core-to-core latency again" \
  bash -c 'grep -q "^# load average after: " <<<"$1" && grep -q "^# core to core (pollen bench --copy-only" <<<"$1"' _ "$out2"
out=$(PLN_CPU_ISA=c MACHINE_STREAM_MIB=8 machine_report 1 "$POLLEN")
check "PLN_CPU_ISA lowers the tier whose FMA peak is reported" grep -q "^# FMA peak (pollen bench --copy-only, fp32 multiply-adds, c kernels): " <<<"$out"
out=$(machine_report 1 "$TMP/no-pollen")
check "without a pollen binary: no copy, FMA or core-to-core line, the rest still printed" bash -c '! grep -q "STREAM copy\|FMA peak\|core to core" <<<"$1" && grep -q "^# machine: " <<<"$1"' _ "$out"
e2e_done
