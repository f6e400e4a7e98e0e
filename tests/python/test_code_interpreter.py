"""The unmodified `e2b-code-interpreter` SDK against `cella serve` (run by
crates/cella/tests/suite/code_interpreter.rs). The Python tests run twice: with a real Jupyter
kernel (the base template's /usr has ipykernel) and with cella's built-in driver
(CELLA_PYTHON_KERNEL=builtin)."""

import base64
import json
import os
import re
import time
import urllib.error
import urllib.request

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

GATEWAY = os.environ.get("E2B_SANDBOX_URL", "")


def plain(text):
    """A traceback without terminal colours (Jupyter's are coloured, as on E2B)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture(scope="module", params=["jupyter", "builtin"])
def python_sandbox(request):
    envs = {"CELLA_PYTHON_KERNEL": "builtin"} if request.param == "builtin" else {}
    sb = Sandbox.create(template="base", timeout=600, envs=envs)
    sb.kernel = request.param
    yield sb
    try:
        sb.kill()
    except Exception:
        pass


@pytest.fixture
def context(python_sandbox):
    """A fresh Python context, removed afterwards (each one is a kernel: a 512 MB sandbox holds
    only a few)."""
    ctx = python_sandbox.create_code_context()
    yield ctx
    python_sandbox.remove_code_context(ctx)


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox.create(template="base", timeout=600)
    yield sb
    try:
        sb.kill()
    except Exception:
        pass


def test_the_kernel_is_the_one_asked_for(python_sandbox):
    ex = python_sandbox.run_code("import sys\n'ipykernel' in sys.modules")
    assert ex.error is None, ex.error
    assert ex.text == ("True" if python_sandbox.kernel == "jupyter" else "False")


def test_state_persists_and_the_last_expression_is_the_result(python_sandbox, context):
    ctx = context
    ex = python_sandbox.run_code("x = 41\nprint('hello')\nx + 1", context=ctx)
    assert ex.error is None, ex.error
    assert ex.text == "42"
    assert ex.logs.stdout == ["hello\n"]
    assert ex.execution_count == 1
    ex = python_sandbox.run_code("def double(v):\n    return v * 2\ndouble(x)", context=ctx)
    assert ex.text == "82"
    assert ex.execution_count == 2
    ex = python_sandbox.run_code("'a string'", context=ctx)
    assert ex.text == "a string"
    ex = python_sandbox.run_code("import sys\nprint('err', file=sys.stderr)\nx = None", context=ctx)
    assert ex.results == [] and ex.logs.stderr == ["err\n"]


def test_errors_carry_name_value_and_traceback(python_sandbox):
    ex = python_sandbox.run_code("def f():\n    return 1 / 0\nf()")
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    tb = plain(ex.error.traceback)
    assert "ZeroDivisionError" in tb and "return 1 / 0" in tb, tb
    ex = python_sandbox.run_code("def broken(:\n    pass")
    assert ex.error.name == "SyntaxError"
    # The context still works after an error.
    assert python_sandbox.run_code("1 + 1").text == "2"


def test_matplotlib_figures_come_back_as_png(python_sandbox, context):
    ex = python_sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()",
        context=context,
    )
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1, ex.results
    data = base64.b64decode(pngs[0])
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_rich_reprs_pandas_html(python_sandbox, context):
    ex = python_sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})", context=context)
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result][0]
    assert "<table" in main.html and "a" in main.text


def test_restart_clears_state(python_sandbox, context):
    ctx = context
    assert python_sandbox.run_code("secret = 7\nsecret", context=ctx).text == "7"
    python_sandbox.restart_code_context(ctx)
    ex = python_sandbox.run_code("secret", context=ctx)
    assert ex.error is not None and ex.error.name == "NameError"


def test_an_infinite_loop_is_interrupted_at_its_timeout(python_sandbox, context):
    ctx = context
    python_sandbox.run_code("kept = 'still here'", context=ctx)
    started = time.time()
    with pytest.raises(TimeoutException):
        python_sandbox.run_code("while True:\n    pass", context=ctx, timeout=3)
    assert time.time() - started < 30
    # The next cell runs in the same (interrupted, not restarted) context.
    ex = python_sandbox.run_code("kept", context=ctx, timeout=60)
    assert ex.error is None, ex.error
    assert ex.text == "still here"


def test_per_cell_environment_variables(python_sandbox):
    ex = python_sandbox.run_code("import os\nos.environ.get('CELL_VAR')", envs={"CELL_VAR": "set"})
    assert ex.text == "set"
    ex = python_sandbox.run_code("import os\nos.environ.get('CELL_VAR', 'gone')")
    assert ex.text == "gone"


def test_contexts_are_listed_and_removed(sandbox):
    sandbox.files.make_dir("/home/user/project")
    ctx = sandbox.create_code_context(cwd="/home/user/project")
    assert ctx.language == "python" and ctx.cwd == "/home/user/project"
    assert sandbox.run_code("import os\nos.getcwd()", context=ctx).text == "/home/user/project"
    assert ctx.id in [c.id for c in sandbox.list_code_contexts()]
    sandbox.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(Exception) as e:
        sandbox.run_code("1", context=ctx)
    assert "not found" in str(e.value)


def test_javascript_context(sandbox):
    ctx = sandbox.create_code_context(language="js")
    assert ctx.language == "javascript"
    ex = sandbox.run_code("const xs = [1, 2, 3];\nconsole.log('sum');\nxs.reduce((a, b) => a + b, 0)", context=ctx)
    assert ex.error is None, ex.error
    assert ex.text == "6" and ex.logs.stdout == ["sum\n"]
    assert sandbox.run_code("xs.length * 10", context=ctx).text == "30"
    ex = sandbox.run_code("null.x", context=ctx)
    assert ex.error.name == "TypeError" and "null" in ex.error.value
    assert sandbox.run_code("await Promise.resolve(5)", context=ctx).error is None
    # The default JavaScript context by language.
    assert sandbox.run_code("globalThis.k = 2; k + 1", language="javascript").text == "3"
    with pytest.raises(TimeoutException):
        sandbox.run_code("for (;;) {}", context=ctx, timeout=3)
    assert sandbox.run_code("xs[0]", context=ctx, timeout=60).text == "1"


def test_bash_context(sandbox):
    ctx = sandbox.create_code_context(language="bash")
    ex = sandbox.run_code("GREETING=hi\ncd /tmp\necho $GREETING from $(pwd)", context=ctx)
    assert ex.error is None, ex.error
    assert ex.logs.stdout == ["hi from /tmp\n"]
    ex = sandbox.run_code("echo $GREETING; pwd", context=ctx)
    assert "".join(ex.logs.stdout) == "hi\n/tmp\n"
    ex = sandbox.run_code("ls /nonexistent", context=ctx)
    assert ex.error is not None and ex.error.value == "2"
    assert "No such file" in "".join(ex.logs.stderr)
    with pytest.raises(TimeoutException):
        sandbox.run_code("sleep 100", context=ctx, timeout=3)
    assert sandbox.run_code("echo $GREETING", context=ctx, timeout=60).logs.stdout == ["hi\n"]


def test_unsupported_languages_are_refused(sandbox):
    with pytest.raises(Exception) as e:
        sandbox.create_code_context(language="cobol")
    assert "unsupported language" in str(e.value)


def test_execute_needs_the_envd_access_token(sandbox):
    assert sandbox._envd_access_token
    req = urllib.request.Request(
        GATEWAY + "/execute",
        data=json.dumps({"code": "1"}).encode(),
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 401
