-- cella store, SQLite dialect. Timestamps are unix milliseconds (UTC); JSON is TEXT.
-- Keep in step with ../postgres/0001_initial.sql: same tables, columns and meaning.
-- New features (jobs, skills, …) add their own numbered files; never edit an applied file.

CREATE TABLE tenants (
    id          TEXT    NOT NULL PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id              TEXT    NOT NULL PRIMARY KEY,
    tenant_id       TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    label           TEXT    NOT NULL,
    -- lowercase hex SHA-256 of the whole plaintext key; the key itself is never stored
    key_hash        TEXT    NOT NULL UNIQUE,
    display_prefix  TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    last_used_at    INTEGER,
    revoked_at      INTEGER
) STRICT;
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE sandboxes (
    id                    TEXT    NOT NULL PRIMARY KEY,
    tenant_id             TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    template_id           TEXT    NOT NULL,
    alias                 TEXT,
    state                 TEXT    NOT NULL CHECK (state IN ('running', 'paused', 'killed')),
    backend               TEXT    NOT NULL,
    backend_state         TEXT    NOT NULL,
    spec                  TEXT    NOT NULL,
    metadata              TEXT    NOT NULL,
    envd_access_token     TEXT,
    traffic_access_token  TEXT,
    cpu_count             INTEGER NOT NULL,
    memory_mb             INTEGER NOT NULL,
    disk_mb               INTEGER NOT NULL,
    started_at            INTEGER NOT NULL,
    end_at                INTEGER NOT NULL,
    ended_at              INTEGER,
    end_reason            TEXT
) STRICT;
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant_id, started_at, id);
CREATE INDEX sandboxes_live ON sandboxes (state) WHERE state <> 'killed';

-- One row per metadata pair: the index behind `metadata=k=v` filters. The JSON copy in
-- sandboxes.metadata is what reads return; both are written in one transaction.
CREATE TABLE sandbox_metadata (
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_metadata_by_pair ON sandbox_metadata (key, value);

CREATE TABLE sandbox_logs (
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    sandbox_id  TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    -- 0 debug, 1 info, 2 warn, 3 error
    level       INTEGER NOT NULL CHECK (level BETWEEN 0 AND 3),
    message     TEXT    NOT NULL,
    fields      TEXT    NOT NULL
) STRICT;
CREATE INDEX sandbox_logs_by_time ON sandbox_logs (sandbox_id, at, id);

CREATE TABLE audit_events (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    tenant_id  TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- an api key id, or 'system'
    actor      TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    target     TEXT    NOT NULL,
    detail     TEXT    NOT NULL,
    at         INTEGER NOT NULL
) STRICT;
CREATE INDEX audit_events_by_tenant ON audit_events (tenant_id, id);
