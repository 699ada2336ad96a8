#!/bin/sh
# Curio's proving demand for vastctl: prints {"queued": N, "proofs_per_hour": X} (demand.command in the config).
#
#   demand:
#     command: "CURIO_DB_URL=postgres://yugabyte:yugabyte@yb.internal:5433/yugabyte /usr/local/bin/curio-demand.sh"
#
# queued:          unclaimed (owner_id IS NULL) harmony tasks of the three SNARK kinds cuzk proves
# proofs_per_hour: those kinds finished successfully in the last hour
# Any failure (psql missing, database unreachable, odd output) exits non-zero with a line on stderr:
# vastctl then treats demand as unknown and never shrinks the fleet on it.
set -eu

URL="${CURIO_DB_URL:-postgres://${CURIO_DB_USER:-yugabyte}:${CURIO_DB_PASSWORD:-yugabyte}@${CURIO_DB_HOST:-127.0.0.1}:${CURIO_DB_PORT:-5433}/${CURIO_DB_NAME:-yugabyte}}"
TASKS="'PoRep','UpdateProve','PSProve'"

count() {
    psql "$URL" -X -q -t -A -v ON_ERROR_STOP=1 -c "$1"
}

queued=$(count "SELECT count(*) FROM harmony_task WHERE name IN ($TASKS) AND owner_id IS NULL")
# work_end is a TIMESTAMP without time zone: compared in the session's time zone (set PGTZ if Curio's differs)
finished=$(count "SELECT count(*) FROM harmony_task_history WHERE name IN ($TASKS) AND result AND work_end > now() - interval '1 hour'")

for value in "$queued" "$finished"; do
    case "$value" in
        ''|*[!0-9]*) echo "curio-demand: psql printed '$value', expected a count" >&2; exit 1 ;;
    esac
done
printf '{"queued": %s, "proofs_per_hour": %s}\n' "$queued" "$finished"
