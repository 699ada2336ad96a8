"""The state file's schema, as its history: numbered, named, append-only migrations that db.py applies on open.

A shipped migration is never edited: add a new one at the end of MIGRATIONS, with the next number and a name of
its own. Its number is the one recorded in the file's `migrations` table (with its name) and `user_version`; it is
written beside it, not taken from its place in the list (migration_rules.py says why and checks the list at import).
"""

from __future__ import annotations

from vastctl.state.migration_rules import Migration, MisnumberedMigrations, check

__all__ = ["MIGRATIONS", "Migration", "MisnumberedMigrations", "check"]

MIGRATIONS: tuple[Migration, ...] = check([
    Migration(
        number=1,
        name="instances, events, settings",
        sql="""
        CREATE TABLE instances (
            uuid TEXT PRIMARY KEY,
            label TEXT NOT NULL,
            state TEXT NOT NULL,
            vast_id INTEGER,
            machine_id INTEGER,
            offer_id INTEGER,
            gpu_name TEXT,
            num_gpus INTEGER,
            dph REAL,
            bench_rate REAL,
            proofs_done INTEGER NOT NULL DEFAULT 0,
            proofs_per_hour REAL,
            restarts INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            state_since TEXT NOT NULL,
            last_heartbeat_at TEXT,
            kill_reason TEXT,
            kill_code TEXT,
            killed_at TEXT,
            destroyed_at TEXT
        );
        CREATE UNIQUE INDEX instances_label ON instances(label);
        CREATE INDEX instances_state ON instances(state);
        CREATE INDEX instances_vast_id ON instances(vast_id);
        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            kind TEXT NOT NULL,
            uuid TEXT,
            label TEXT,
            from_state TEXT,
            to_state TEXT,
            reason TEXT,
            source TEXT NOT NULL,
            code TEXT
        );
        CREATE INDEX events_uuid ON events(uuid);
        CREATE TABLE settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        """,
    ),
    Migration(
        number=2,
        name="vast listing cache, provider audit, blocklist, locks",
        sql="""
        ALTER TABLE instances ADD COLUMN vast_status TEXT;
        ALTER TABLE instances ADD COLUMN vast_status_msg TEXT;
        ALTER TABLE instances ADD COLUMN vast_seen_at TEXT;
        ALTER TABLE instances ADD COLUMN vast_missing INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE instances ADD COLUMN resumed_at TEXT;
        ALTER TABLE instances ADD COLUMN destroy_attempts INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE instances ADD COLUMN destroy_error TEXT;
        CREATE TABLE vast_listings (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            ok INTEGER NOT NULL,
            instances INTEGER,
            error TEXT
        );
        CREATE TABLE vast_cache (
            vast_id INTEGER PRIMARY KEY,
            label TEXT,
            actual_status TEXT,
            intended_status TEXT,
            cur_state TEXT,
            status_msg TEXT,
            machine_id INTEGER,
            gpu_name TEXT,
            num_gpus INTEGER,
            dph REAL,
            first_seen_at TEXT NOT NULL,
            seen_at TEXT NOT NULL
        );
        CREATE TABLE actions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            actor TEXT NOT NULL,
            kind TEXT NOT NULL,
            uuid TEXT,
            label TEXT,
            vast_id INTEGER,
            request TEXT,
            ok INTEGER NOT NULL,
            result TEXT
        );
        CREATE INDEX actions_uuid ON actions(uuid);
        CREATE TABLE blocklist (
            machine_id INTEGER PRIMARY KEY,
            reason TEXT NOT NULL,
            until TEXT NOT NULL
        );
        CREATE TABLE locks (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            acquired_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        )
        """,
    ),
    Migration(
        number=3,
        name="agent conversation record and notes",
        sql="""
        CREATE TABLE agent_messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            step_id INTEGER,
            at TEXT NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL
        );
        CREATE INDEX agent_messages_step ON agent_messages(step_id);
        CREATE TABLE agent_notes (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            step_id INTEGER,
            at TEXT NOT NULL,
            text TEXT NOT NULL
        )
        """,
    ),
    Migration(
        number=4,
        name="a machine's claimed vast id, kept apart from the one the manager trusts",
        # vast_id is what the manager recorded at launch or vast listed under the row's label; a machine's
        # own report goes to claimed_vast_id. Ids an adopted row got from its machine before this are claims.
        sql="""
        ALTER TABLE instances ADD COLUMN claimed_vast_id INTEGER;
        UPDATE instances SET claimed_vast_id = vast_id, vast_id = NULL
            WHERE offer_id IS NULL AND vast_id IS NOT NULL AND destroyed_at IS NULL
        """,
    ),
    Migration(
        number=5,
        name="demand samples, agent steps",
        sql="""
        CREATE TABLE demand_samples (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            queued INTEGER,
            proofs_per_hour REAL,
            source TEXT NOT NULL,
            ok INTEGER NOT NULL,
            error TEXT
        );
        CREATE INDEX demand_samples_at ON demand_samples(at);
        CREATE TABLE agent_steps (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            policy TEXT NOT NULL,
            outcome TEXT NOT NULL,
            event_cursor INTEGER,
            observation TEXT,
            actions TEXT,
            refused TEXT,
            errors TEXT,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            cache_read_tokens INTEGER NOT NULL DEFAULT 0,
            cache_write_tokens INTEGER NOT NULL DEFAULT 0,
            cost REAL NOT NULL DEFAULT 0
        );
        CREATE INDEX agent_steps_outcome ON agent_steps(outcome, id)
        """,
    ),
    Migration(
        number=6,
        name="demand samples: in flight and look-ahead",
        sql="""
        ALTER TABLE demand_samples ADD COLUMN in_flight INTEGER;
        ALTER TABLE demand_samples ADD COLUMN lookahead INTEGER
        """,
    ),
    Migration(
        number=7,
        name="the disk price of each listed instance, what a stopped one still bills",
        sql="""
        ALTER TABLE vast_cache ADD COLUMN storage_dph REAL
        """,
    ),
    Migration(
        number=8,
        name="dashboard sessions ended by sign-out",
        sql="""
        CREATE TABLE dashboard_sign_outs (
            session TEXT PRIMARY KEY,
            expires_at TEXT NOT NULL,
            signed_out_at TEXT NOT NULL
        )
        """,
    ),
    Migration(
        number=9,
        name="vast webhook deliveries, one row an event id",
        # what makes a delivery vast retries (or anyone replays) a duplicate; event: the events row it made
        sql="""
        CREATE TABLE webhook_deliveries (
            event_id TEXT PRIMARY KEY,
            received_at TEXT NOT NULL,
            notif_type TEXT,
            attempt INTEGER,
            event INTEGER
        );
        CREATE INDEX webhook_deliveries_received ON webhook_deliveries(received_at)
        """,
    ),
    Migration(
        number=10,
        name="each machine's tunnel to the manager: its port, the public half of its key, joined or not since when",
        # The private half of the key went to the machine in its create request and is kept nowhere here.
        # A port stays taken until the machine is confirmed destroyed: a killed machine's open session may
        # still hold it on the manager.
        sql="""
        ALTER TABLE instances ADD COLUMN tunnel_port INTEGER;
        ALTER TABLE instances ADD COLUMN tunnel_public_key TEXT;
        ALTER TABLE instances ADD COLUMN joined_at TEXT;
        ALTER TABLE instances ADD COLUMN tunnel_down_since TEXT;
        ALTER TABLE instances ADD COLUMN tunnel_checked_at TEXT;
        CREATE UNIQUE INDEX instances_tunnel_port ON instances(tunnel_port)
            WHERE tunnel_port IS NOT NULL AND destroyed_at IS NULL
        """,
    ),
    Migration(
        number=11,
        name="each machine keeps the disk price vast last listed for it, for the cost account after it is gone",
        # vast_cache holds the last listing only: a destroyed machine drops out of it, and with it the price
        # its stopped hours billed at. Triggers copy the price onto the row whenever the listing is written.
        sql="""
        ALTER TABLE instances ADD COLUMN storage_dph REAL;
        UPDATE instances SET storage_dph = (SELECT c.storage_dph FROM vast_cache c WHERE c.vast_id = instances.vast_id)
            WHERE vast_id IS NOT NULL;
        CREATE TRIGGER vast_cache_storage_insert AFTER INSERT ON vast_cache WHEN NEW.storage_dph IS NOT NULL
        BEGIN
            UPDATE instances SET storage_dph = NEW.storage_dph WHERE vast_id = NEW.vast_id AND destroyed_at IS NULL;
        END;
        CREATE TRIGGER vast_cache_storage_update AFTER UPDATE OF storage_dph ON vast_cache
            WHEN NEW.storage_dph IS NOT NULL
        BEGIN
            UPDATE instances SET storage_dph = NEW.storage_dph WHERE vast_id = NEW.vast_id AND destroyed_at IS NULL;
        END
        """,
    ),
    Migration(
        number=12,
        name="the tail of each machine's logs, as its boot script pushed it",
        # one row per machine and log name, replaced at each push: bounded by the number of machines
        sql="""
        CREATE TABLE machine_logs (
            uuid TEXT NOT NULL,
            name TEXT NOT NULL,
            at TEXT NOT NULL,
            text TEXT NOT NULL,
            cut INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (uuid, name)
        )
        """,
    ),
    Migration(
        number=13,
        name="agent steps: why a step that did nothing held",
        sql="""
        ALTER TABLE agent_steps ADD COLUMN hold TEXT
        """,
    ),
    Migration(
        number=14,
        name="when vast's status of each machine last changed, as the listings saw it",
        # A host goes `unknown` and only later `offline`: it bills until then, nothing after. The cost account
        # needs when the listing first showed the status the row holds, not only the last time it did.
        sql="""
        ALTER TABLE instances ADD COLUMN vast_status_since TEXT;
        UPDATE instances SET vast_status_since = vast_seen_at WHERE vast_status IS NOT NULL;
        CREATE TRIGGER instances_vast_status_since AFTER UPDATE OF vast_status ON instances
            WHEN NEW.vast_status IS NOT OLD.vast_status
        BEGIN
            UPDATE instances SET vast_status_since = NEW.vast_seen_at WHERE uuid = NEW.uuid;
        END
        """,
    ),
    Migration(
        number=15,
        name="each machine's bid when rented interruptible, the offer's on-demand price, since when vast has it outbid",
        sql="""
        ALTER TABLE instances ADD COLUMN bid REAL;
        ALTER TABLE instances ADD COLUMN ask_dph REAL;
        ALTER TABLE instances ADD COLUMN outbid_since TEXT
        """,
    ),
    Migration(
        number=16,
        name="the simulated market's tables (provider: sim), empty until a market is set up in the file",
        # IF NOT EXISTS: a file that ran the simulator before its tables came through here has them already
        sql="""
        CREATE TABLE IF NOT EXISTS sim_meta (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            schema_version INTEGER NOT NULL,
            seed INTEGER NOT NULL,
            started_at TEXT NOT NULL,
            advanced_to TEXT NOT NULL,
            calls INTEGER NOT NULL,
            next_vast_id INTEGER NOT NULL,
            version INTEGER NOT NULL,
            busy_by TEXT,
            busy_until TEXT
        );
        CREATE TABLE IF NOT EXISTS sim_hosts (
            machine_id INTEGER PRIMARY KEY,
            offer_id INTEGER NOT NULL UNIQUE,
            gpu_name TEXT NOT NULL,
            num_gpus INTEGER NOT NULL,
            cpu_ram_gb REAL NOT NULL,
            inet_down_mbps REAL NOT NULL,
            reliability REAL NOT NULL,
            base_dph REAL NOT NULL,
            storage_cost REAL NOT NULL,
            true_rate REAL NOT NULL,
            slow INTEGER NOT NULL,
            phase REAL NOT NULL
        );
        CREATE TABLE IF NOT EXISTS sim_instances (
            vast_id INTEGER PRIMARY KEY,
            machine_id INTEGER NOT NULL,
            offer_id INTEGER NOT NULL,
            label TEXT,
            uuid TEXT,
            env_label TEXT,
            image TEXT,
            disk_gb REAL NOT NULL,
            gpu_dph REAL NOT NULL,
            storage_dph REAL NOT NULL,
            intended_status TEXT NOT NULL,
            actual_status TEXT,
            cur_state TEXT NOT NULL,
            status_msg TEXT,
            listed INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            epoch_at TEXT NOT NULL,
            step TEXT,
            step_at TEXT,
            fault TEXT,
            fault_at TEXT,
            proving_since TEXT,
            refused_at TEXT,
            created_at TEXT NOT NULL,
            died_at TEXT,
            destroy_requested_at TEXT,
            destroy_refused_s REAL NOT NULL,
            destroyed_at TEXT,
            cost REAL NOT NULL,
            billed_s REAL NOT NULL,
            gpu_s REAL NOT NULL,
            billed_at TEXT NOT NULL,
            bid REAL,
            outbids INTEGER NOT NULL DEFAULT 0,
            outbid_at TEXT,
            outbid_price REAL,
            paused_at TEXT,
            resume_at TEXT
        );
        CREATE INDEX IF NOT EXISTS sim_instances_live ON sim_instances(destroyed_at);
        CREATE TABLE IF NOT EXISTS sim_faults (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            kind TEXT NOT NULL,
            vast_id INTEGER,
            detail TEXT
        )
        """,
    ),
    Migration(
        number=17,
        name="indexes for what every decision and every reconcile pass reads, so that a pass costs the same in a file a"
        " year old",
        # implausible claims and resumes (observe) count a few events among all; the listing history is pruned by age
        sql="""
        CREATE INDEX events_kind ON events(kind, uuid);
        CREATE INDEX events_resumes ON events(uuid) WHERE from_state = 'stopped' AND to_state = 'launching';
        CREATE INDEX vast_listings_at ON vast_listings(at);
        CREATE INDEX vast_listings_ok ON vast_listings(ok)
        """,
    ),
    Migration(
        number=18,
        name="each machine's proofs over every run of its prover (a restarted counter adds, never lowers the total)",
        # proofs_done stays the prover's raw counter as last reported (the rate and the reset are read from it);
        # a file from before counted only that, so its total starts there
        sql="""
        ALTER TABLE instances ADD COLUMN proofs_total INTEGER NOT NULL DEFAULT 0;
        UPDATE instances SET proofs_total = max(proofs_done, 0);
        ALTER TABLE sim_instances ADD COLUMN proofs REAL NOT NULL DEFAULT 0;
        UPDATE sim_meta SET schema_version = 3 WHERE schema_version = 2
        """,
    ),
    Migration(
        number=19,
        name="the proof router: every call it delivered, what it holds, the machines it set aside",
        # vastctl/facts/deliveries.py says what each column means
        sql="""
        CREATE TABLE proof_calls (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            request_id TEXT,
            kind TEXT NOT NULL,
            uuid TEXT,
            label TEXT,
            result TEXT NOT NULL,
            held_ms INTEGER NOT NULL,
            prover_ms INTEGER,
            attempt INTEGER NOT NULL,
            size_bytes INTEGER NOT NULL,
            queue_wait_ms INTEGER,
            srs_load_ms INTEGER,
            synthesis_ms INTEGER,
            gpu_compute_ms INTEGER,
            total_ms INTEGER,
            detail TEXT
        );
        CREATE INDEX proof_calls_at ON proof_calls(at);
        CREATE INDEX proof_calls_uuid ON proof_calls(uuid, result);
        CREATE TABLE route_status (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            updated_at TEXT NOT NULL,
            held INTEGER NOT NULL,
            held_bytes INTEGER NOT NULL,
            oldest_held_s REAL,
            in_flight INTEGER NOT NULL,
            provers INTEGER NOT NULL
        );
        ALTER TABLE instances ADD COLUMN route_failing_since TEXT;
        ALTER TABLE instances ADD COLUMN route_failure TEXT
        """,
    ),
    Migration(
        number=20,
        name="where each machine's boot went: the seconds of each stage its boot script timed, reported with `running`",
        sql="ALTER TABLE instances ADD COLUMN boot_stages TEXT",
    ),
    Migration(
        number=21,
        name="webhook deliveries: the digest of what vast signed, so a body replayed under a fresh event id is one",
        sql="""
        ALTER TABLE webhook_deliveries ADD COLUMN signed TEXT;
        CREATE INDEX webhook_deliveries_signed ON webhook_deliveries(signed)
        """,
    ),
    Migration(
        number=22,
        name="an event's structured fields (a setting's key, old and new value; a kill or stop forced past the guard) and"
        " a row's kill_forced, so nothing is decided from a reason's text; older rows' fields read from it once",
        sql="""
        ALTER TABLE events ADD COLUMN data TEXT;
        ALTER TABLE instances ADD COLUMN kill_forced INTEGER NOT NULL DEFAULT 0;
        UPDATE events SET data = json_object(
                'key', substr(reason, 1, instr(reason, ' ') - 1),
                'old', CAST(trim(substr(reason, instr(reason, ' ') + 1, instr(reason, ' → ') - instr(reason, ' ') - 1)) AS REAL),
                'new', CAST(trim(substr(reason, instr(reason, ' → ') + length(' → '))) AS REAL))
            WHERE kind = 'setting' AND instr(reason, ' ') > 0 AND instr(reason, ' → ') > instr(reason, ' ');
        UPDATE events SET data = json_object('forced', json('true'))
            WHERE kind = 'transition' AND to_state IN ('killed', 'stopped') AND reason LIKE '%(forced)';
        UPDATE instances SET kill_forced = 1 WHERE state = 'killed' AND kill_reason LIKE '%(forced)'
        """,
    ),
    Migration(
        number=23,
        name="a machine's stored rates within their bounds and its prices real, once: what the file holds is counted as it"
        " is, never checked on read",
        # the bounds as plausible.py had them when this was written, spelled out because a shipped migration never
        # changes: a bench rate from 0 to 200/h per GPU (1 to 8 GPUs counted; an unknown count is one), a measured
        # rate from 0 to twice the bench rate and never past that ceiling; a value that is no number (text, which
        # the readers could not count) is no rate; −∞ is 0 and +∞ the bound. The counters are never negative, and
        # a GPU count below 1 (a listing's, copied before counts were checked) is not known. A price that is not
        # one (validate.price: a finite $/h of at least 0.001; a disk's at least 0) is none: the readers fall back
        # as they do for a price never listed. SQLite cannot hold a NaN; ±∞ is past ±1e308.
        sql="""
        UPDATE instances SET dph = NULL WHERE typeof(dph) NOT IN ('integer', 'real', 'null') OR dph < 0.001 OR dph > 1e308;
        UPDATE instances SET ask_dph = NULL
            WHERE typeof(ask_dph) NOT IN ('integer', 'real', 'null') OR ask_dph < 0.001 OR ask_dph > 1e308;
        UPDATE vast_cache SET dph = NULL WHERE typeof(dph) NOT IN ('integer', 'real', 'null') OR dph < 0.001 OR dph > 1e308;
        UPDATE vast_cache SET storage_dph = NULL
            WHERE typeof(storage_dph) NOT IN ('integer', 'real', 'null') OR storage_dph < 0 OR storage_dph > 1e308;
        UPDATE instances SET storage_dph = NULL
            WHERE typeof(storage_dph) NOT IN ('integer', 'real', 'null') OR storage_dph < 0 OR storage_dph > 1e308;
        UPDATE instances SET num_gpus = NULL WHERE typeof(num_gpus) != 'integer' OR num_gpus < 1;
        UPDATE vast_cache SET num_gpus = NULL WHERE typeof(num_gpus) != 'integer' OR num_gpus < 1;
        UPDATE instances SET bench_rate = CASE
                WHEN typeof(bench_rate) NOT IN ('integer', 'real') THEN NULL
                ELSE min(max(bench_rate, 0.0), 200.0 * min(coalesce(num_gpus, 1), 8)) END
            WHERE bench_rate IS NOT NULL;
        UPDATE instances SET proofs_per_hour = CASE
                WHEN typeof(proofs_per_hour) NOT IN ('integer', 'real') THEN NULL
                ELSE min(max(proofs_per_hour, 0.0), coalesce(bench_rate * 2.0, 1e308),
                         200.0 * min(coalesce(num_gpus, 1), 8)) END
            WHERE proofs_per_hour IS NOT NULL;
        UPDATE instances SET proofs_done = max(proofs_done, 0), proofs_total = max(proofs_total, 0)
            WHERE proofs_done < 0 OR proofs_total < 0
        """,
    ),
    Migration(
        number=24,
        name="a revision per machine, past the file's highest at every insert and update of its row: a reader that kept"
        " the rows reads only those changed since (state/kept_rows.py)",
        # a narrow table beside instances, by uuid: writing it costs far less than writing the wide row a second
        # time (bench/README.md), and a VACUUM may renumber instances' rowids, never its uuids; rows are never
        # deleted. Old rows start at their rowid (distinct), new writes past the highest.
        sql="""
        CREATE TABLE instance_revisions (uuid TEXT PRIMARY KEY, revision INTEGER NOT NULL);
        INSERT INTO instance_revisions (uuid, revision) SELECT uuid, rowid FROM instances;
        CREATE INDEX instance_revisions_by_revision ON instance_revisions (revision);
        CREATE TRIGGER instances_revision_insert AFTER INSERT ON instances
        BEGIN
            INSERT INTO instance_revisions (uuid, revision)
                VALUES (NEW.uuid, (SELECT coalesce(max(revision), 0) + 1 FROM instance_revisions))
                ON CONFLICT (uuid) DO UPDATE SET revision = excluded.revision;
        END;
        CREATE TRIGGER instances_revision_update AFTER UPDATE ON instances
        BEGIN
            INSERT INTO instance_revisions (uuid, revision)
                VALUES (NEW.uuid, (SELECT coalesce(max(revision), 0) + 1 FROM instance_revisions))
                ON CONFLICT (uuid) DO UPDATE SET revision = excluded.revision;
        END
        """,
    ),
    Migration(
        number=25,
        name="where the router sends each proof kind (own_daemon, fleet, refused) as JSON by kind name: the dashboard shows"
        " where the proofs Curio does not verify go, as the running router decided",
        sql="ALTER TABLE route_status ADD COLUMN routing TEXT",
    ),
    Migration(
        number=26,
        name="demand samples: when the look-ahead arrives (its counts per 10 minutes, as JSON) and the sectors further out",
        sql="""
        ALTER TABLE demand_samples ADD COLUMN arrivals TEXT;
        ALTER TABLE demand_samples ADD COLUMN later INTEGER
        """,
    ),
    Migration(
        number=27,
        name="the simulated market draws a boot by its host and the host's n-th rental, not by the instance id",
        # a market from before drew by instance id: left at its schema version, it is refused (sim_store.py)
        sql="""
        ALTER TABLE sim_instances ADD COLUMN turn INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX sim_instances_host ON sim_instances(machine_id)
        """,
    ),
    Migration(
        number=28,
        name="the rows every pass reads (not destroyed, with a tunnel, killed lately) through indexes: a file's killed"
        " rows accumulate over months and each pass read them all",
        sql="""
        CREATE INDEX instances_undestroyed ON instances(uuid) WHERE destroyed_at IS NULL;
        CREATE INDEX instances_tunneled ON instances(tunnel_port) WHERE tunnel_port IS NOT NULL;
        CREATE INDEX instances_killed ON instances(killed_at) WHERE killed_at IS NOT NULL
        """,
    ),
])
