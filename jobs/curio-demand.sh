#!/bin/sh
# Curio's proving demand for vastctl (demand.command in the config); prints one line:
#   {"queued": N, "in_flight": N, "lookahead": N, "proofs_per_hour": X, "arrivals": [N, … 9 counts], "later": N}
#
#   demand:
#     command: "CURIO_DB_URL=postgres://yugabyte:yugabyte@yb.internal:5433/yugabyte /usr/local/bin/curio-demand.sh"
#
# queued:          PoRep/UpdateProve/PSProve tasks no Curio node has claimed yet (owner_id IS NULL; a retry too)
# in_flight:       those tasks claimed by a node (with cuzk: waiting or proving at a daemon)
# lookahead:       sectors precommitted on chain whose PoRep task is not created yet (it comes ~75 min later)
# proofs_per_hour: those tasks finished successfully in the last hour
# arrivals:        the lookahead sectors by when their PoRep task comes: 9 counts of 10 minutes each, the next 90 min.
#                  Curio creates the task at chain height >= seed_epoch + 3; one already due is in the first count;
#                  one due past the 90 minutes or with no seed_epoch yet is in lookahead only
# later:           sectors in earlier stages (not precommitted on chain yet, not failed): each one's PoRep comes at
#                  least ~75 min from now, most of them hours from now; a count, with no time
#
# The chain's height comes from the clock: (now - genesis) / 30 s. CURIO_GENESIS_UNIX is the network's genesis in
# unix seconds (default mainnet's, 1598306400 = 2020-08-24T22:00:00Z; calibration net's is 1667326380 =
# 2022-11-01T18:13:00Z); CURIO_NOW_UNIX replaces the clock (a fixed now, for a test).
#
# The sector size the fleet proves: CURIO_SECTOR_SIZE, else VASTCTL_SECTOR_SIZE (vastctl sets it from
# launch.sector_size when it runs demand.command): 32GiB or 64GiB. PoRep work on sectors of the other size
# (sectors_sdr_pipeline.reg_seal_proof) is left out of queued, in_flight and lookahead; unset: every size counts.
#
# Curio keeps its tables in schema "curio" (CURIO_DB_SCHEMA to change it); every name is qualified with it.
# One statement, one snapshot. Bounded well under vastctl's 20 s: connecting 5 s, waiting for a lock 5 s,
# the statement 10 s, so no backend is left waiting on the database. Any failure exits non-zero with one
# line on stderr naming the cause; vastctl then treats demand as unknown and never shrinks the fleet on it.
set -eu

# Without CURIO_DB_URL, the parts Curio reads (CURIO_DB_HOST, a comma-separated list, each host on CURIO_DB_PORT;
# CURIO_DB_USER, _PASSWORD, _NAME) go to psql as libpq's own variables, never pasted into a URL: a password with
# @, / or % in it is taken as it is written, and every host of the list gets the port. libpq tries the hosts in
# order; Curio itself (without load balancing) uses the first.
if [ -n "${CURIO_DB_URL:-}" ]; then
    CONN=$CURIO_DB_URL
else
    CONN=
    PGHOST="${CURIO_DB_HOST:-127.0.0.1}" PGPORT="${CURIO_DB_PORT:-5433}" PGUSER="${CURIO_DB_USER:-yugabyte}"
    PGPASSWORD="${CURIO_DB_PASSWORD:-yugabyte}" PGDATABASE="${CURIO_DB_NAME:-yugabyte}"
    export PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE
fi
SCHEMA="${CURIO_DB_SCHEMA:-curio}"
TASKS="'PoRep','UpdateProve','PSProve'"

fail() { echo "curio-demand: $*" >&2; exit 1; }

case "$SCHEMA" in  # it is pasted into the SQL: a plain identifier only
    [!A-Za-z_]*|*[!A-Za-z0-9_]*) fail "CURIO_DB_SCHEMA '$SCHEMA' is not a plain identifier (letters, digits, _; e.g. curio)" ;;
esac
command -v psql >/dev/null 2>&1 || fail "psql not found on PATH (install postgresql-client)"

# the chain's height now: whole epochs of 30 s since the network's genesis
GENESIS="${CURIO_GENESIS_UNIX:-1598306400}"
NOW="${CURIO_NOW_UNIX:-$(date +%s)}"
for value in "$GENESIS" "$NOW"; do  # pasted into the SQL too: digits only, at most 12 of them
    case "$value" in
        ''|*[!0-9]*|?????????????*)
            fail "CURIO_GENESIS_UNIX and CURIO_NOW_UNIX are unix seconds (calibration net's genesis: 1667326380), got '$value'" ;;
    esac
done
[ "$NOW" -ge "$GENESIS" ] || fail "now ($NOW) is before the genesis, CURIO_GENESIS_UNIX ($GENESIS): another network's, or a wrong clock"
HEIGHT=$(( (NOW - GENESIS) / 30 ))
BUCKET_EPOCHS=20  # 10 minutes of 30 s epochs
BUCKETS=9         # 90 minutes

# the registered seal proofs of a size (V1, V1_1, V1_1 synthetic PoRep, V1_2 NI-PoRep)
SIZE="${CURIO_SECTOR_SIZE:-${VASTCTL_SECTOR_SIZE:-}}"
case "$SIZE" in
    '') OTHER_SIZE= SIZED= ;;
    32GiB|64GiB)
        PROOFS="3,8,13,18"; [ "$SIZE" = 64GiB ] && PROOFS="4,9,14,19"
        OTHER_SIZE="AND NOT EXISTS (SELECT 1 FROM $SCHEMA.sectors_sdr_pipeline s WHERE s.task_id_porep = t.id AND s.reg_seal_proof NOT IN ($PROOFS))"
        SIZED="AND reg_seal_proof IN ($PROOFS)" ;;
    *) fail "sector size '$SIZE' is not 32GiB or 64GiB (CURIO_SECTOR_SIZE, or launch.sector_size)" ;;
esac

SQL="SELECT
  (SELECT count(*) FROM $SCHEMA.harmony_task t WHERE name IN ($TASKS) AND owner_id IS NULL $OTHER_SIZE),
  (SELECT count(*) FROM $SCHEMA.harmony_task t WHERE name IN ($TASKS) AND owner_id IS NOT NULL $OTHER_SIZE),
  (SELECT count(*) FROM $SCHEMA.sectors_sdr_pipeline
    WHERE after_precommit_msg_success AND NOT after_porep AND NOT failed AND task_id_porep IS NULL $SIZED),
  (SELECT count(*) FROM $SCHEMA.harmony_task_history
    WHERE name IN ($TASKS) AND result AND work_end > now() - interval '1 hour'),
  (SELECT string_agg(coalesce(due.n, 0)::text, ',' ORDER BY b.bucket)
    FROM generate_series(0, $BUCKETS - 1) AS b (bucket)
    LEFT JOIN (SELECT greatest(0, (seed_epoch + 3 - $HEIGHT) / $BUCKET_EPOCHS) AS bucket, count(*) AS n
               FROM $SCHEMA.sectors_sdr_pipeline
               WHERE after_precommit_msg_success AND NOT after_porep AND NOT failed AND task_id_porep IS NULL $SIZED
                 AND seed_epoch + 3 - $HEIGHT < $BUCKETS * $BUCKET_EPOCHS
               GROUP BY 1) AS due USING (bucket)),
  (SELECT count(*) FROM $SCHEMA.sectors_sdr_pipeline
    WHERE NOT after_precommit_msg_success AND NOT after_porep AND NOT failed AND task_id_porep IS NULL $SIZED)"

errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
if ! counts=$(PGCONNECT_TIMEOUT=5 PGAPPNAME=curio-demand psql ${CONN:+"$CONN"} -X -q -t -A -F ' ' -v ON_ERROR_STOP=1 \
        -c "SET statement_timeout = '10s'" -c "SET lock_timeout = '5s'" -c "$SQL" 2>"$errors"); then
    why=$(grep -m 1 -E 'ERROR|FATAL|error' "$errors" || head -n 1 "$errors")
    case "$why" in
        *"authentication failed"*|*"no password supplied"*|*"role \""*"does not exist"*) cause="authentication failed" ;;
        *"lock timeout"*) cause="timeout: waited 5 s for a lock" ;;
        *"statement timeout"*) cause="timeout: the query ran past 10 s" ;;
        *"timeout expired"*) cause="cannot connect: timeout (5 s)" ;;
        *"database \""*"does not exist"*) cause="no such database" ;;
        *"does not exist"*) cause="missing schema or table (CURIO_DB_SCHEMA is '$SCHEMA')" ;;
        *"permission denied"*) cause="permission denied" ;;
        *"connection to server"*|*"could not translate host name"*|*"could not connect"*) cause="cannot connect" ;;
        *) cause="psql failed" ;;
    esac
    fail "$cause: $why"
fi

read -r queued in_flight lookahead finished arrivals later extra <<EOF
$counts
EOF
printed() { fail "psql printed '$counts', expected five counts and $BUCKETS arrivals"; }
for value in "$queued" "$in_flight" "$lookahead" "$finished" "$later"; do
    case "$value" in
        ''|*[!0-9]*) printed ;;
    esac
done
case "$arrivals" in
    ''|*[!0-9,]*|,*|*,|*,,*) printed ;;
esac
[ -z "$extra" ] && [ "$(printf '%s' "$arrivals" | tr -cd , | wc -c)" -eq $((BUCKETS - 1)) ] || printed
printf '{"queued": %s, "in_flight": %s, "lookahead": %s, "proofs_per_hour": %s, "arrivals": [%s], "later": %s}\n' \
    "$queued" "$in_flight" "$lookahead" "$finished" "$(printf '%s' "$arrivals" | sed 's/,/, /g')" "$later"
