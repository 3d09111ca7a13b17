# netns.sh — sourced by tests that need several "hosts" on one machine: network namespaces joined
# by veth links to a bridge (the bridge lives in a namespace of its own, so the machine's own
# network is never touched), each with its own host name (a UTS namespace), and `mpirun` across
# them through a launch agent that enters the namespace instead of ssh. TCP only, so every
# collective crosses a real network stack. Needs root and iproute2; everything is deleted by
# netns_down (call it from an EXIT trap).
#
#   netns_usable                 0 when namespaces can be made here (else prints why)
#   netns_up N                   hosts 1..N; sets NS_NAMES[i], NS_ADDR[i], NS_HOST[i], NS_SUBNET
#   netns_exec I CMD...          runs CMD on host I (its network and host name)
#   netns_mpirun "S1 S2 ..." ARGS...   mpirun from host 1 with S_i slots on host i (0 = unused),
#                                killed after NETNS_TIMEOUT seconds (default 120)
#   netns_down                   deletes every namespace made here
NS_PREFIX=pln$$x${RANDOM}
NS_SUBNET_ID=$(( $$ % 200 + 20 ))
NS_SUBNET=10.213.$NS_SUBNET_ID.0/24
NS_NAMES=(); NS_ADDR=(); NS_HOST=()
NS_DIR=

netns_usable() {
  if [ "$(id -u)" != 0 ]; then echo "not root"; return 1; fi
  command -v ip >/dev/null || { echo "no ip (iproute2: make deps)"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare (util-linux)"; return 1; }
  command -v mpirun >/dev/null || { echo "no mpirun"; return 1; }
  local probe=${NS_PREFIX}probe
  ip netns add "$probe" 2>/dev/null || { echo "cannot create a network namespace here"; return 1; }
  local ok=0
  ip -n "$probe" link add pbr type bridge 2>/dev/null || ok=1
  ip -n "$probe" link add pva type veth peer name pvb 2>/dev/null || ok=1
  unshare --uts true 2>/dev/null || ok=1
  ip netns del "$probe"
  [ $ok = 0 ] || echo "no bridge/veth/UTS namespaces in this kernel or container"
  return $ok
}

netns_up() {
  local n=$1 i
  NS_DIR=$(mktemp -d "${PLN_TEST_TMP:-/tmp}/netns.XXXXXX")
  ip netns add "${NS_PREFIX}sw" || return 1
  NS_NAMES+=("${NS_PREFIX}sw")
  ip -n "${NS_PREFIX}sw" link add br0 type bridge || return 1
  ip -n "${NS_PREFIX}sw" link set br0 up || return 1
  for i in $(seq 1 "$n"); do
    local ns=${NS_PREFIX}h$i
    ip netns add "$ns" || return 1
    NS_NAMES+=("$ns")
    # Both ends are made inside our namespaces: nothing appears in the machine's own.
    ip -n "${NS_PREFIX}sw" link add "p$i" type veth peer name eth0 netns "$ns" || return 1
    ip -n "${NS_PREFIX}sw" link set "p$i" master br0 up || return 1
    ip -n "$ns" addr add "10.213.$NS_SUBNET_ID.$i/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    NS_ADDR[$i]=10.213.$NS_SUBNET_ID.$i
    NS_HOST[$i]=${NS_PREFIX}-host$i
  done
  # Open MPI's launch agent: "agent [options] HOST COMMAND...". Only our hosts are accepted.
  {
    echo '#!/bin/bash'
    echo 'while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for i in $(seq 1 "$n"); do echo "  ${NS_ADDR[$i]}) ns=${NS_PREFIX}h$i; name=${NS_HOST[$i]};;"; done
    echo '  *) echo "netns agent: $host is not a host of this test" >&2; exit 1;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" unshare --uts /bin/bash -c '"'"'hostname "$0" && exec /bin/sh -c "$1"'"'"' "$name" "$*"'
  } >"$NS_DIR/agent"
  chmod +x "$NS_DIR/agent"
}

netns_exec() {
  local i=$1; shift
  ip netns exec "${NS_PREFIX}h$i" unshare --uts /bin/bash -c 'hostname "$0" && shift && exec "$@"' "${NS_HOST[$i]}" _ "$@"
}

netns_mpirun() {
  local slots=($1) i np=0; shift
  : >"$NS_DIR/hostfile"
  for i in "${!slots[@]}"; do
    [ "${slots[$i]}" -gt 0 ] || continue
    echo "${NS_ADDR[$((i + 1))]} slots=${slots[$i]}" >>"$NS_DIR/hostfile"
    np=$((np + slots[i]))
  done
  netns_exec 1 timeout -k 5 "${NETNS_TIMEOUT:-120}" mpirun -np $np --hostfile "$NS_DIR/hostfile" --mca plm rsh --mca plm_rsh_agent "$NS_DIR/agent" \
    --mca btl tcp,self --mca btl_tcp_if_include "$NS_SUBNET" --mca oob_tcp_if_include "$NS_SUBNET" "$@"
}

netns_down() {
  local ns
  for ns in "${NS_NAMES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  NS_NAMES=()
  [ -n "$NS_DIR" ] && rm -rf "$NS_DIR"
  return 0
}
