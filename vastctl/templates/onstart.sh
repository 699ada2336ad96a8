#!/bin/bash
# vastctl boot script, run by vast at each container start. The launch sets VASTCTL_SERVER,
# _TOKEN, _UUID, _LABEL, _PIP (launch.vastctl_source), _INSTALL (launch.install: curio, cuzk).
# launch.env may set VASTCTL_FETCH_CMD, _CUZK_CMD, _BENCH_CMD (prints proofs/h),
# _PROOFS_CMD (prints proofs done), _ZK_DIR, _HEARTBEAT_S.
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
if [ -n "${VASTCTL_INSTALL:-}" ]; then bash -c "$VASTCTL_INSTALL" || { log "launch.install failed"; exit 1; }; fi
need() { command -v "$1" >/dev/null || { log "$1 missing: set launch.install or launch.image"; exit 1; }; }
[ -n "${VASTCTL_FETCH_CMD:-}" ] || need curio
[ -n "${VASTCTL_CUZK_CMD:-}" ] || need cuzk
[ -n "${VASTCTL_BENCH_CMD:-}" ] || need cuzk-bench

# 3. proving parameters (~53 GiB)
bash -c "${VASTCTL_FETCH_CMD:-curio fetch-params 32GiB}" || { log "parameter fetch failed"; exit 1; }
vastctl params-done || exit 1

# 4. the prover, then the benchmark gate
bash -c "${VASTCTL_CUZK_CMD:-cuzk --config $ZK/cuzk.toml}" & CUZK=$!
sleep 20
kill -0 $CUZK 2>/dev/null || { log "cuzk exited at start"; exit 1; }
if [ -n "${VASTCTL_BENCH_CMD:-}" ]; then
  RATE=$(bash -c "$VASTCTL_BENCH_CMD")
else
  [ -s c1.json ] || curl -fsSL -o c1.json "${VASTCTL_C1_URL:-https://pub-08ae819c828244bdbe5f615fd8c5e144.r2.dev/c1.json}"
  OUT=$(cuzk-bench batch --type porep --c1 c1.json --count "${VASTCTL_BENCH_COUNT:-5}" 2>&1); echo "$OUT"
  PPM=$(echo "$OUT" | grep -oiE '[0-9]+(\.[0-9]+)? *proofs/min' | tail -1 | grep -oE '^[0-9.]+')
  RATE=${PPM:+$(awk "BEGIN{print $PPM*60}")}
fi
case "$RATE" in ''|*[!0-9.]*) log "no benchmark rate (got '$RATE')"; kill $CUZK; exit 1 ;; esac
vastctl bench-report --rate "$RATE"; rc=$?
if [ $rc -eq 5 ]; then log "rate $RATE is below the gate: not proving"; kill $CUZK; exit 0; fi
[ $rc -eq 0 ] || { log "bench-report failed (exit $rc)"; exit 1; }

# 5. prove, with a heartbeat carrying the cumulative proof count
vastctl running || exit 1
proofs() {
  if [ -n "${VASTCTL_PROOFS_CMD:-}" ]; then bash -c "$VASTCTL_PROOFS_CMD"; return; fi
  curl -fsS --max-time 10 "${VASTCTL_CUZK_STATUS:-http://127.0.0.1:9821/status}" | python3 -c '
import json, sys
def find(o):
    if isinstance(o, dict):
        if "total_proofs_completed" in o: return o["total_proofs_completed"]
        o = list(o.values())
    for v in o if isinstance(o, list) else []:
        r = find(v)
        if r is not None: return r
print(int(find(json.load(sys.stdin)) or 0))'
}
while kill -0 $CUZK 2>/dev/null; do
  N=$(proofs 2>/dev/null); case "$N" in ''|*[!0-9]*) N= ;; esac
  vastctl heartbeat ${N:+--proofs-done "$N"}; rc=$?
  if [ $rc -eq 2 ] || [ $rc -eq 3 ]; then log "the manager refused the heartbeat (exit $rc): stopping"; kill $CUZK; exit 0; fi
  sleep "${VASTCTL_HEARTBEAT_S:-60}"
done
log "cuzk exited: no more heartbeats (reconcile will notice)"
exit 1
