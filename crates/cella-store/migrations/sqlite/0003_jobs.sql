-- Jobs: agent runs queued by `POST /v1/jobs`, claimed by a node's runner, and their events.
-- Keep in step with ../postgres/0003_jobs.sql: same tables, columns and meaning.

CREATE TABLE jobs (
    id                TEXT    NOT NULL PRIMARY KEY,
    tenant_id         TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    status            TEXT    NOT NULL
                      CHECK (status IN ('pending', 'running', 'complete', 'error', 'cancelled')),
    task              TEXT    NOT NULL,
    strategy          TEXT    NOT NULL,
    model             TEXT,
    template          TEXT    NOT NULL,
    -- JSON array of skill names
    skills            TEXT    NOT NULL,
    -- JSON object (steps, tokens, timeout, cost)
    limits            TEXT    NOT NULL,
    -- JSON object of strings
    metadata          TEXT    NOT NULL,
    -- higher runs first
    priority          INTEGER NOT NULL,
    -- times a runner claimed it
    attempts          INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER,
    last_event_at     INTEGER,
    -- JSON (tokens, cost) of the last run
    usage             TEXT,
    final_answer      TEXT,
    error             TEXT,
    sandbox_id        TEXT,
    -- the node whose runner holds it, and until when its lease is good
    node              TEXT,
    lease_expires_at  INTEGER,
    -- seq of the newest event (events are numbered 1, 2, 3… per job)
    last_seq          INTEGER NOT NULL DEFAULT 0,
    -- set by a cancel request; the owning runner stops the run
    cancel_reason     TEXT
) STRICT;
CREATE INDEX jobs_by_tenant ON jobs (tenant_id, created_at, id);
CREATE INDEX jobs_queue ON jobs (priority DESC, created_at, id) WHERE status = 'pending';
CREATE INDEX jobs_running ON jobs (tenant_id, node) WHERE status = 'running';

CREATE TABLE job_events (
    job_id      TEXT    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    -- 1, 2, 3… per job: the SSE event id
    seq         INTEGER NOT NULL,
    type        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    -- the words of the payload's string values, space-separated (what full-text search sees)
    words       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (job_id, seq)
) STRICT;

-- Full-text index of job_events.words (recall over a job's history), an external-content FTS5
-- table kept in step by triggers; its rowid is job_events' rowid.
CREATE VIRTUAL TABLE job_events_fts USING fts5 (
    words, content = 'job_events', tokenize = 'unicode61'
);
CREATE TRIGGER job_events_fts_insert AFTER INSERT ON job_events BEGIN
    INSERT INTO job_events_fts (rowid, words) VALUES (new.rowid, new.words);
END;
CREATE TRIGGER job_events_fts_delete AFTER DELETE ON job_events BEGIN
    INSERT INTO job_events_fts (job_events_fts, rowid, words) VALUES ('delete', old.rowid, old.words);
END;
