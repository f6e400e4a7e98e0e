-- cella store, SQLite dialect: the Agent Skills registry (issue 5). Keep in step with
-- ../postgres/0002_skills.sql.
--
-- A skill is a tenant's name; each upload of that name adds a version (1, 2, …) and older versions
-- stay retrievable until the skill is deleted (which removes every version). The uploaded zip is
-- kept here, in the version row, so the registry is one transactional unit (no file without its
-- row, no row without its file) and a server sharing a Postgres store sees the same archives;
-- the data directory only caches extracted trees, keyed by sha256, rebuilt from these bytes.

CREATE TABLE skills (
    tenant_id       TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name            TEXT    NOT NULL,
    -- the number of the newest version; the next upload gets latest_version + 1
    latest_version  INTEGER NOT NULL CHECK (latest_version >= 1),
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, name)
) STRICT, WITHOUT ROWID;

CREATE TABLE skill_versions (
    tenant_id    TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    version      INTEGER NOT NULL CHECK (version >= 1),
    -- lowercase hex SHA-256 of the archive bytes
    sha256       TEXT    NOT NULL,
    -- archive size in bytes
    size         INTEGER NOT NULL,
    description  TEXT    NOT NULL,
    -- the SKILL.md frontmatter properties (name, description, license, …) as a JSON object
    frontmatter  TEXT    NOT NULL,
    -- the skill's files as a JSON array of {path, size, executable}
    files        TEXT    NOT NULL,
    archive      BLOB    NOT NULL,
    -- an api key id, or 'anonymous'
    created_by   TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, name, version),
    FOREIGN KEY (tenant_id, name) REFERENCES skills (tenant_id, name) ON DELETE CASCADE
) STRICT;
