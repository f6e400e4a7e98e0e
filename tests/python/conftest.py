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


# The SDK's native HTTP client threads can abort while the interpreter finalizes, after every
# test has passed; leave right after pytest has printed its summary, with its own exit status.
_exit_status = 0


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config):
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)
