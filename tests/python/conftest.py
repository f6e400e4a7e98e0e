"""Fixtures for the e2b SDK tests: they run against a real `cella serve` started by the Rust
test harness (crates/cella/tests/suite/e2b_sdk.rs), which exports E2B_API_URL,
E2B_SANDBOX_URL, E2B_API_KEY and CELLA_OTHER_TENANT_KEY."""

import os

import pytest
from e2b import Sandbox


@pytest.fixture
def sandbox():
    sb = Sandbox.create(timeout=120)
    yield sb
    try:
        sb.kill()
    except Exception:
        pass


@pytest.fixture
def other_key():
    return os.environ["CELLA_OTHER_TENANT_KEY"]
