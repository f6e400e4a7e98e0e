-- cella store, Postgres dialect: the Agent Skills registry (issue 5). Keep in step with
-- ../sqlite/0002_skills.sql, which says why archives live in the database.

CREATE TABLE skills (
    tenant_id       TEXT COLLATE "C" NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name            TEXT COLLATE "C" NOT NULL,
    -- the number of the newest version; the next upload gets latest_version + 1
    latest_version  BIGINT NOT NULL CHECK (latest_version >= 1),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE skill_versions (
    tenant_id    TEXT COLLATE "C" NOT NULL,
    name         TEXT COLLATE "C" NOT NULL,
    version      BIGINT NOT NULL CHECK (version >= 1),
    -- lowercase hex SHA-256 of the archive bytes
    sha256       TEXT   NOT NULL,
    -- archive size in bytes
    size         BIGINT NOT NULL,
    description  TEXT   NOT NULL,
    -- the SKILL.md frontmatter properties (name, description, license, …) as a JSON object
    frontmatter  TEXT   NOT NULL,
    -- the skill's files as a JSON array of {path, size, executable}
    files        TEXT   NOT NULL,
    archive      BYTEA  NOT NULL,
    -- an api key id, or 'anonymous'
    created_by   TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, name, version),
    FOREIGN KEY (tenant_id, name) REFERENCES skills (tenant_id, name) ON DELETE CASCADE
);
