-- Jobs: agent runs queued by `POST /v1/jobs`, claimed by a node's runner, and their events.
-- Keep in step with ../sqlite/0003_jobs.sql: same tables, columns and meaning.

CREATE TABLE jobs (
    id                TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant_id         TEXT COLLATE "C" NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    status            TEXT   NOT NULL
                      CHECK (status IN ('pending', 'running', 'complete', 'error', 'cancelled')),
    task              TEXT   NOT NULL,
    strategy          TEXT   NOT NULL,
    model             TEXT,
    template          TEXT   NOT NULL,
    -- JSON array of skill names
    skills            TEXT   NOT NULL,
    -- JSON object (steps, tokens, timeout, cost)
    limits            TEXT   NOT NULL,
    -- JSON object of strings
    metadata          TEXT   NOT NULL,
    -- higher runs first
    priority          BIGINT NOT NULL,
    -- times a runner claimed it
    attempts          BIGINT NOT NULL,
    created_at        BIGINT NOT NULL,
    started_at        BIGINT,
    finished_at       BIGINT,
    last_event_at     BIGINT,
    -- JSON (tokens, cost) of the last run
    usage             TEXT,
    final_answer      TEXT,
    error             TEXT,
    sandbox_id        TEXT,
    -- the node whose runner holds it, and until when its lease is good
    node              TEXT,
    lease_expires_at  BIGINT,
    -- seq of the newest event (events are numbered 1, 2, 3… per job)
    last_seq          BIGINT NOT NULL DEFAULT 0,
    -- set by a cancel request; the owning runner stops the run
    cancel_reason     TEXT
);
CREATE INDEX jobs_by_tenant ON jobs (tenant_id, created_at, id);
CREATE INDEX jobs_queue ON jobs (priority DESC, created_at, id) WHERE status = 'pending';
CREATE INDEX jobs_running ON jobs (tenant_id, node) WHERE status = 'running';

CREATE TABLE job_events (
    job_id      TEXT COLLATE "C" NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    -- 1, 2, 3… per job: the SSE event id
    seq         BIGINT NOT NULL,
    type        TEXT   NOT NULL,
    payload     TEXT   NOT NULL,
    -- the words of the payload's string values, space-separated (what full-text search sees)
    words       TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    search      TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, words)) STORED,
    PRIMARY KEY (job_id, seq)
);
CREATE INDEX job_events_search ON job_events USING GIN (search);
