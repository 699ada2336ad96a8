"""Curio's tables in a schema of one's choosing (`{s}`), with the columns and types its migrations leave:
harmony/harmonydb/sql/20230719-harmony.sql, 20231217-sdr-pipeline.sql and the later ALTERs, timestamps
timestamptz since 20240522."""

from __future__ import annotations

CURIO_TABLES = """
CREATE TABLE {s}.harmony_machines (
    id SERIAL PRIMARY KEY NOT NULL,
    last_contact TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    host_and_port varchar(300) NOT NULL,
    cpu INTEGER NOT NULL,
    ram BIGINT NOT NULL,
    gpu FLOAT NOT NULL,
    unschedulable BOOLEAN DEFAULT FALSE,
    restart_request TIMESTAMP WITH TIME ZONE
);
CREATE TABLE {s}.harmony_task (
    id SERIAL PRIMARY KEY NOT NULL,
    initiated_by INTEGER,
    update_time TIMESTAMPTZ NOT NULL DEFAULT current_timestamp,
    posted_time TIMESTAMPTZ NOT NULL,
    owner_id INTEGER REFERENCES {s}.harmony_machines (id) ON DELETE SET NULL,
    added_by INTEGER NOT NULL,
    previous_task INTEGER,
    name varchar(16) NOT NULL,
    retries BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE {s}.harmony_task_history (
    id SERIAL PRIMARY KEY NOT NULL,
    task_id INTEGER NOT NULL,
    name VARCHAR(16) NOT NULL,
    posted TIMESTAMPTZ NOT NULL,
    work_start TIMESTAMPTZ NOT NULL,
    work_end TIMESTAMPTZ NOT NULL,
    result BOOLEAN NOT NULL,
    err varchar,
    completed_by_host_and_port varchar(300) NOT NULL
);
CREATE TABLE {s}.sectors_sdr_pipeline (
    sp_id bigint not null,
    sector_number bigint not null,
    create_time timestamptz not null default current_timestamp,
    reg_seal_proof int not null,
    ticket_epoch bigint,
    ticket_value bytea,
    task_id_sdr bigint,
    after_sdr bool not null default false,
    tree_d_cid text,
    task_id_tree_d bigint,
    after_tree_d bool not null default false,
    task_id_tree_c bigint,
    after_tree_c bool not null default false,
    tree_r_cid text,
    task_id_tree_r bigint,
    after_tree_r bool not null default false,
    precommit_msg_cid text,
    task_id_precommit_msg bigint,
    after_precommit_msg bool not null default false,
    seed_epoch bigint,
    precommit_msg_tsk bytea,
    after_precommit_msg_success bool not null default false,
    seed_value bytea,
    task_id_porep bigint,
    porep_proof bytea,
    after_porep bool not null default false,
    task_id_finalize bigint,
    after_finalize bool not null default false,
    task_id_move_storage bigint,
    after_move_storage bool not null default false,
    commit_msg_cid text,
    task_id_commit_msg bigint,
    after_commit_msg bool not null default false,
    commit_msg_tsk bytea,
    after_commit_msg_success bool not null default false,
    failed bool not null default false,
    failed_at timestamptz,
    failed_reason varchar(20) not null default '',
    failed_reason_msg text not null default '',
    task_id_synth bigint,
    after_synth bool not null default false,
    user_sector_duration_epochs BIGINT DEFAULT NULL,
    precommit_ready_at TIMESTAMPTZ,
    commit_ready_at TIMESTAMPTZ,
    start_epoch BIGINT DEFAULT NULL,
    primary key (sp_id, sector_number)
);
"""
