-- cella store, Postgres dialect. Timestamps are unix milliseconds (UTC) in BIGINT, JSON is TEXT
-- and ids use the "C" collation, so rows decode and sort exactly as in SQLite.
-- Keep in step with ../sqlite/0001_initial.sql: same tables, columns and meaning.
-- New features (jobs, skills, …) add their own numbered files; never edit an applied file.

CREATE TABLE tenants (
    id          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    name        TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant_id       TEXT COLLATE "C" NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    label           TEXT   NOT NULL,
    -- lowercase hex SHA-256 of the whole plaintext key; the key itself is never stored
    key_hash        TEXT   NOT NULL UNIQUE,
    display_prefix  TEXT   NOT NULL,
    created_at      BIGINT NOT NULL,
    last_used_at    BIGINT,
    revoked_at      BIGINT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE sandboxes (
    id                    TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant_id             TEXT COLLATE "C" NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    template_id           TEXT   NOT NULL,
    alias                 TEXT,
    state                 TEXT   NOT NULL CHECK (state IN ('running', 'paused', 'killed')),
    backend               TEXT   NOT NULL,
    backend_state         TEXT   NOT NULL,
    spec                  TEXT   NOT NULL,
    metadata              TEXT   NOT NULL,
    envd_access_token     TEXT,
    traffic_access_token  TEXT,
    cpu_count             BIGINT NOT NULL,
    memory_mb             BIGINT NOT NULL,
    disk_mb               BIGINT NOT NULL,
    started_at            BIGINT NOT NULL,
    end_at                BIGINT NOT NULL,
    ended_at              BIGINT,
    end_reason            TEXT
);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant_id, started_at, id);
CREATE INDEX sandboxes_live ON sandboxes (state) WHERE state <> 'killed';

-- One row per metadata pair: the index behind `metadata=k=v` filters. The JSON copy in
-- sandboxes.metadata is what reads return; both are written in one transaction.
CREATE TABLE sandbox_metadata (
    sandbox_id  TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, key)
);
CREATE INDEX sandbox_metadata_by_pair ON sandbox_metadata (key, value);

CREATE TABLE sandbox_logs (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sandbox_id  TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    at          BIGINT NOT NULL,
    -- 0 debug, 1 info, 2 warn, 3 error
    level       BIGINT NOT NULL CHECK (level BETWEEN 0 AND 3),
    message     TEXT   NOT NULL,
    fields      TEXT   NOT NULL
);
CREATE INDEX sandbox_logs_by_time ON sandbox_logs (sandbox_id, at, id);

CREATE TABLE audit_events (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  TEXT COLLATE "C" NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- an api key id, or 'system'
    actor      TEXT   NOT NULL,
    action     TEXT   NOT NULL,
    target     TEXT   NOT NULL,
    detail     TEXT   NOT NULL,
    at         BIGINT NOT NULL
);
CREATE INDEX audit_events_by_tenant ON audit_events (tenant_id, id);
