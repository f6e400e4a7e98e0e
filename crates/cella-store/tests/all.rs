//! cella-store's integration tests: one behaviour suite, run against SQLite (a temp file) always
//! and against Postgres when `CELLA_TEST_POSTGRES_URL` is set (`./scripts/test` sets it).

mod suite;
