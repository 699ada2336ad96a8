#!/bin/bash
# vastctl boot script, run by vast at each container start. The launch sets VASTCTL_SERVER, _TOKEN,
# _UUID, _LABEL, _PIP (launch.vastctl_source), _INSTALL (launch.install), _BENCH_COUNT, _BENCH_CONCURRENCY.
# launch.env may set VASTCTL_FETCH_CMD, _CUZK_CMD, _BENCH_CMD (prints proofs/h), _PROOFS_CMD (prints
# proofs done), _ZK_DIR, _CUZK_LISTEN, _CUZK_STATUS_LISTEN, _CUZK_MEMORY, _CUZK_WAIT_S, _HEARTBEAT_S, _C1_URL.
# launch.join sets VASTCTL_JOIN (ssh: with _TUNNEL_HOST, _SSH_PORT, _USER, _PORT, _HOST_KEY, _KEY; command: _JOIN_CMD).
set -u
exec >>"${VASTCTL_LOG:-/var/log/vastctl-onstart.log}" 2>&1
log() { echo "$(date -u +%FT%TZ) vastctl-onstart: $*"; }
for v in VASTCTL_SERVER VASTCTL_TOKEN VASTCTL_UUID VASTCTL_LABEL; do
  [ -n "${!v:-}" ] || { log "$v is not set: not launched by vastctl?"; exit 1; }
done
export VASTCTL_SERVER VASTCTL_TOKEN VASTCTL_UUID VASTCTL_LABEL PATH="${HOME:-/root}/.local/bin:$PATH"
ZK=${VASTCTL_ZK_DIR:-/data/zk}
export FIL_PROOFS_PARAMETER_CACHE=${FIL_PROOFS_PARAMETER_CACHE:-$ZK/params}
mkdir -p "$FIL_PROOFS_PARAMETER_CACHE" && cd "$ZK" || exit 1
LISTEN=${VASTCTL_CUZK_LISTEN:-127.0.0.1:9820}  # cuzk's gRPC; without a config it is a Unix socket
STATUS=${VASTCTL_CUZK_STATUS_LISTEN:-127.0.0.1:9821}  # its GET /status (JSON); without a config, none
case "$LISTEN" in unix://*) ADDR=$LISTEN ;; *) ADDR=http://$LISTEN ;; esac
CUZK=
# the end of a log as one short printable line, for a reason
tail1() { tail -n 8 "$1" 2>/dev/null | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' | LC_ALL=C tr -c ' -~' ' ' | tr -s ' ' | LC_ALL=C grep -o '.\{0,300\}$'; }
stop() {  # the prover, given 10 s to exit: SIGINT, the signal cuzk shuts down gracefully on (SIGTERM ends it at once)
  [ -n "$CUZK" ] || return 0; kill -INT "$CUZK" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$CUZK" 2>/dev/null || return 0; sleep 0.2; done; kill -9 "$CUZK" 2>/dev/null
}
# log tails to the manager (`vastctl logs`), never fatal
push() { for n; do f=$ZK/$n.log; [ $n = onstart ] && f=${VASTCTL_LOG:-/var/log/vastctl-onstart.log}
  VASTCTL_RETRY_FOR=9s vastctl log-push --name $n --file "$f" >/dev/null 2>&1; done; :; }
# a boot that cannot measure a rate is a failed bench, reported at once: the manager kills the machine
fail() {
  log "$1"; stop; push onstart fetch cuzk bench; set -- "$(echo "$1" | sed 's/ *$//')"  # a reason never ends in a space
  vastctl bench-report --failed --reason="$1"; log "failed bench reported (exit $?)"; exit 1
}

# the dead-man switch, from the start: no answer from the manager (any HTTP status counts) for launch.orphan_after,
# after one last try, or a 409 (killed): stop proving and destroy this instance with its own key (docs/deployment.md).
# VASTCTL_ORPHAN_AFTER_S (launch.orphan_after; 0: off); launch.env may set _WATCHDOG_S (how often it looks, 60),
# _LAST_TRY_FOR (the last heartbeat's retries, 2m), _VAST_URL (vast's API, https://console.vast.ai)
export VASTCTL_CONTACT_FILE=$ZK/manager-contact  # vastctl writes the epoch of each answer here
MAIN=$$ ORPHAN=${VASTCTL_ORPHAN_AFTER_S:-14400}; date +%s >"$VASTCTL_CONTACT_FILE"
destroy_self() {  # once: vast refuses the key when the instance is gone
  log "destroying this instance: $1"; stop; local id=${CONTAINER_ID:-}; case "$id" in *[!0-9]*) id= ;; esac
  local u="${VASTCTL_VAST_URL:-https://console.vast.ai}/api/v0/instances/$id/"
  [ -n "$id" ] && [ -n "${CONTAINER_API_KEY:-}" ] || { log "no CONTAINER_ID/CONTAINER_API_KEY: cannot destroy itself"; return 1; }
  for _ in $(seq 30); do  # retried only while vast does not answer
    python3 -c 'import os,sys,urllib.request as r
try: r.urlopen(r.Request(sys.argv[1], b"{}", {"Authorization": "Bearer " + os.environ["CONTAINER_API_KEY"],
  "Content-Type": "application/json"}, method="DELETE"), timeout=30)
except r.HTTPError as e: print(f"vast refused the destroy: HTTP {e.code}"); sys.exit(3)' "$u"; case $? in
      0) log "destroyed"; kill ${WATCHDOG:-} 2>/dev/null; return 0 ;; 3) return 1 ;; esac; sleep 20
  done; log "vast did not take the destroy"; return 1
}
# A contact file that cannot be written (a full disk) or read is never silence: the switch counts from the newest
# of the file's time, its own start and the last answer it saw itself; any exit of its last try but 1 (no answer,
# or only 5xx) and 3 (killed) is the manager answering.
watchdog() {
  local ok; ok=$(date +%s)
  while sleep "${VASTCTL_WATCHDOG_S:-60}"; do
    last() { local t=; read -r t <"$VASTCTL_CONTACT_FILE"; case "$t" in ''|*[!0-9]*) t=0 ;; esac
      [ "$t" -gt "$ok" ] || t=$ok; echo $(($(date +%s) - t)); } 2>/dev/null
    [ "$(last)" -ge "$ORPHAN" ] || continue
    log "no answer from the manager for ${ORPHAN}s: one last heartbeat"
    VASTCTL_RETRY_FOR=${VASTCTL_LAST_TRY_FOR:-2m} vastctl heartbeat; rc=$?
    [ $rc -eq 1 ] || [ $rc -eq 3 ] || { ok=$(date +%s); log "the manager answered (exit $rc): carrying on"; continue; }
    [ $rc -eq 3 ] || [ "$(last)" -ge "$ORPHAN" ] || { log "the manager answered (exit $rc): carrying on"; continue; }
    kill "$MAIN" 2>/dev/null; CUZK=$(cat cuzk.pid 2>/dev/null); destroy_self "orphaned (last heartbeat exit $rc)"; exit
  done
}
[ "$ORPHAN" -gt 0 ] 2>/dev/null && { watchdog & WATCHDOG=$!; }

# 1. vastctl itself
if ! command -v vastctl >/dev/null; then
  PKG=${VASTCTL_PIP:-}
  [ -n "$PKG" ] || { log "no vastctl in the image and launch.vastctl_source is empty"; exit 1; }
  command -v pip3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3-pip; }
  pip3 install -q "$PKG" || pip3 install -q --break-system-packages "$PKG" || { log "cannot install $PKG"; exit 1; }
fi

# 2. register (vast sets CONTAINER_ID to the instance id), then curio and cuzk
VID=${CONTAINER_ID:-}; case "$VID" in ''|*[!0-9]*) VID= ;; esac
vastctl register ${VID:+--vast-id "$VID"} || { log "register failed (exit $?)"; exit 1; }
# cuzk reads total_budget as exactly `auto` or a whole number of GiB, MiB, GB, MB or bytes, and turns anything
# else ("256G", "Auto") into 50 GiB without a word: refused here, before 53 GiB of parameters are fetched
MEM=${VASTCTL_CUZK_MEMORY:-auto} SIZE='^ *([1-9][0-9]{0,6} *(GiB|MiB|GB|MB)|[1-9][0-9]{0,15}) *$'
[ "$MEM" = auto ] || [[ $MEM =~ $SIZE ]] \
  || fail "VASTCTL_CUZK_MEMORY '$(printf '%s' "$MEM" | LC_ALL=C tr -c ' -~' '?' | cut -c1-40)' is not a size cuzk reads (auto, or e.g. 256GiB): cuzk would run on 50 GiB"
if [ -n "${VASTCTL_INSTALL:-}" ]; then bash -c "$VASTCTL_INSTALL" || { log "launch.install failed"; exit 1; }; fi
need() { command -v "$1" >/dev/null || { log "$1 missing: set launch.install or launch.image${2:-}"; exit 1; }; }
[ -n "${VASTCTL_FETCH_CMD:-}" ] || need curio
[ -n "${VASTCTL_CUZK_CMD:-}" ] || need cuzk
[ -n "${VASTCTL_BENCH_CMD:-}" ] || need cuzk-bench " (make cuzk builds only the daemon; cargo build --release -p cuzk-bench in extern/cuzk)"

# 3. proving parameters (~53 GiB for 32GiB) for VASTCTL_SECTOR_SIZE (launch.sector_size), from IPFS_GATEWAY
# (launch.params_mirror) when set. Each stage's seconds are logged and reported with `running` (fleet --json)
SECTOR=${VASTCTL_SECTOR_SIZE:-32GiB} STAGES=
took() { local s=$((SECONDS - $2)); STAGES="$STAGES${STAGES:+,}$1=$s"; log "stage $1 took ${s}s"; }
log "fetching $SECTOR parameters from ${IPFS_GATEWAY:-the public gateway} (fetch.log)"; T=$SECONDS
bash -c "${VASTCTL_FETCH_CMD:-curio fetch-params $SECTOR}" >fetch.log 2>&1 || fail "parameter fetch failed (exit $?): $(tail1 fetch.log)"
took fetch $T
vastctl params-done || exit 1
push onstart fetch

# 4. the prover on the config written here, then the benchmark gate
cat >cuzk.toml <<EOF
[daemon]
listen = "$LISTEN"
status_listen = "$STATUS"
[srs]
param_cache = "$FIL_PROOFS_PARAMETER_CACHE"
[memory]
total_budget = "$MEM"
EOF
if [ -n "${VASTCTL_CUZK_CMD:-}" ]; then bash -c "$VASTCTL_CUZK_CMD" >cuzk.log 2>&1 & else cuzk --config "$ZK/cuzk.toml" >cuzk.log 2>&1 & fi
CUZK=$!; echo $CUZK >cuzk.pid  # for the dead-man switch
status() {  # the daemon's completed proofs, from its status API
  python3 -c 'import json,sys,urllib.request as u; print(int(json.load(u.urlopen(sys.argv[1],timeout=10))["counters"]["total_completed"]))' "http://$STATUS/status"
}
WAIT=${VASTCTL_CUZK_WAIT_S:-600} T0=$SECONDS T=$SECONDS
until status >/dev/null 2>&1; do
  kill -0 $CUZK 2>/dev/null || fail "cuzk exited at start: $(tail1 cuzk.log)"
  [ $((SECONDS - T0)) -lt "$WAIT" ] || fail "cuzk status API at $STATUS did not answer in ${WAIT}s: $(tail1 cuzk.log)"
  sleep 1
done
log "cuzk is up (cuzk.log); benchmarking (bench.log)"; took daemon $T; T=$SECONDS
if [ -n "${VASTCTL_BENCH_CMD:-}" ]; then
  RATE=$(bash -c "$VASTCTL_BENCH_CMD" 2>bench.log)
else
  C1=c1.json; [ "$SECTOR" = 32GiB ] || C1=c1-$SECTOR.json  # a sector size's own input (launch.bench_input)
  if [ ! -s $C1 ]; then
    python3 -c 'import sys,urllib.request as u; u.urlretrieve(*sys.argv[1:])' "${VASTCTL_C1_URL:-https://pub-08ae819c828244bdbe5f615fd8c5e144.r2.dev/c1.json}" \
      c1.part >bench.log 2>&1 && mv c1.part $C1 || fail "cannot download the benchmark input $C1: $(tail1 bench.log)"
  fi
  # as the gate was calibrated: one warm-up proof (SRS and PCE loaded), then N proofs J at a time
  cuzk-bench -a "$ADDR" single -t porep --c1 $C1 >bench.log 2>&1
  grep -q '^status: *COMPLETED' bench.log || fail "warm-up proof failed: $(tail1 bench.log)"
  took warmup $T; T=$SECONDS
  cuzk-bench -a "$ADDR" batch -t porep --c1 $C1 -c "${VASTCTL_BENCH_COUNT:-5}" -j "${VASTCTL_BENCH_CONCURRENCY:-5}" >bench.log 2>&1
  PPM=$(sed -n 's|^throughput: *\([0-9][0-9.]*\) proofs/min.*|\1|p' bench.log | tail -1)
  [ -n "$PPM" ] || fail "benchmark completed no proof: $(tail1 bench.log)"
  RATE=$(awk -v p="$PPM" 'BEGIN{printf "%.3f", p*60}')
fi
case "$RATE" in ''|*[!0-9.]*) fail "no benchmark rate (got '$(echo "$RATE" | LC_ALL=C tr -c ' -~' ' ' | cut -c1-60)')" ;; esac
took bench $T; T=$SECONDS
push onstart cuzk bench
vastctl bench-report --rate "$RATE"; rc=$?
if [ $rc -eq 5 ]; then log "rate $RATE is below the gate: not proving"; stop; exit 0; fi
[ $rc -eq 0 ] || { log "bench-report failed (exit $rc)"; stop; exit 1; }

# 4b. join (launch.join): ssh opens a reverse tunnel from the manager's 127.0.0.1:VASTCTL_TUNNEL_PORT to the
# daemon (VASTCTL_TUNNEL_TARGET, default its gRPC), pinned to the manager's host key, kept up with backoff
# (tunnel.log); command runs VASTCTL_JOIN_CMD; none leaves it to the image. Only a joined machine says running.
tunnel_up() { ssh -S "$ZK/tunnel.ctl" -O check vastctl-manager >/dev/null 2>&1; }
tunnel_open() {
  ssh -f -N -M -S "$ZK/tunnel.ctl" -i "$ZK/tunnel.key" -p "$VASTCTL_TUNNEL_SSH_PORT" -E "$ZK/tunnel.log" \
    -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$ZK/tunnel.known_hosts" \
    -o HostKeyAlias=vastctl-manager -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 -o ServerAliveCountMax=3 \
    -o ConnectTimeout=20 -R "127.0.0.1:$VASTCTL_TUNNEL_PORT:$TARGET" "$VASTCTL_TUNNEL_USER@$VASTCTL_TUNNEL_HOST"
}
case "${VASTCTL_JOIN:-none}" in
  ssh)
    TARGET=${VASTCTL_TUNNEL_TARGET:-$LISTEN}; TARGET=${TARGET#unix://}
    (umask 077; echo "$VASTCTL_TUNNEL_KEY" | base64 -d >"$ZK/tunnel.key") || { log "no tunnel key"; stop; exit 1; }
    echo "vastctl-manager $VASTCTL_TUNNEL_HOST_KEY" >"$ZK/tunnel.known_hosts"
    T0=$SECONDS D=1
    until tunnel_open; do
      [ $((SECONDS - T0)) -lt "${VASTCTL_TUNNEL_WAIT_S:-300}" ] || { log "no tunnel to $VASTCTL_TUNNEL_HOST: $(tail1 "$ZK/tunnel.log")"; stop; exit 1; }
      sleep $D; D=$((D < 30 ? D * 2 : 60))
    done
    log "joined: the manager's 127.0.0.1:$VASTCTL_TUNNEL_PORT reaches $TARGET (tunnel.log)"
    (D=1; while kill -0 $$ 2>/dev/null; do  # reconnect with backoff while this script lives
       if tunnel_up; then D=1; sleep 5; continue; fi
       tunnel_open && log "tunnel reopened" || { sleep $D; D=$((D < 30 ? D * 2 : 60)); }
     done; ssh -S "$ZK/tunnel.ctl" -O exit vastctl-manager >/dev/null 2>&1) &
    ;;
  command) bash -c "$VASTCTL_JOIN_CMD" >join.log 2>&1 || { log "launch.join_command failed (exit $?): $(tail1 join.log)"; stop; exit 1; } ;;
  none) ;;
  *) log "unknown VASTCTL_JOIN '${VASTCTL_JOIN}'"; stop; exit 1 ;;
esac

# 5. prove, with a heartbeat carrying the daemon's cumulative proof count
took join $T
vastctl running --stages "$STAGES" || { stop; exit 1; }
proofs() {
  if [ -n "${VASTCTL_PROOFS_CMD:-}" ]; then bash -c "$VASTCTL_PROOFS_CMD"; return; fi
  status || cuzk-bench -a "$ADDR" status | sed -n 's/^proofs completed: *\([0-9]*\)$/\1/p'
}
while kill -0 $CUZK 2>/dev/null; do
  N=$(proofs 2>/dev/null | tail -1); case "$N" in ''|*[!0-9]*) N= ;; esac
  vastctl heartbeat ${N:+--proofs-done "$N"}; rc=$?
  push onstart cuzk
  if [ $rc -eq 2 ] || [ $rc -eq 3 ]; then log "the manager refused the heartbeat (exit $rc): stopping"; stop; [ $rc -eq 2 ] || destroy_self "killed by the manager"; exit 0; fi
  sleep "${VASTCTL_HEARTBEAT_S:-60}"
done
log "cuzk exited: no more heartbeats (reconcile will notice)"
push onstart cuzk
exit 1
