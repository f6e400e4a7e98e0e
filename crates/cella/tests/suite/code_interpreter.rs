//! The unmodified `e2b-code-interpreter` Python SDK (pinned in tests/python/requirements.txt)
//! against a real `cella serve`: tests/python/test_code_interpreter.py, with a real Jupyter kernel
//! and with cella's built-in Python driver, plus JavaScript and bash contexts. Needs the base
//! template's /usr to have python3-ipykernel, matplotlib, pandas and nodejs (./scripts/test
//! installs them).

use std::process::Command;

use super::e2b_sdk::{free_port, start_server};
use super::support::sdk_python;
use crate::require_root;

#[test]
fn e2b_code_interpreter_sdk_against_cella_serve() {
    require_root!();
    let Some(python) = sdk_python() else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (_server, key) = start_server(data.path(), port);
    let url = format!("http://127.0.0.1:{port}");
    let test = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python/test_code_interpreter.py");
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(&test)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &key)
        .env("CELLA_OTHER_TENANT_KEY", "unused")
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "the e2b-code-interpreter SDK suite failed:\n{text}"
    );
    assert!(
        text.contains(" passed") && !text.contains("skipped"),
        "{text}"
    );
}
