# cella's Python driver for the code interpreter (run by cella-envd as `python3 -c`).
#
# Protocol (the same for every language's driver): one JSON command per line on fd 4
# ({"code": str, "env_vars": {str: str}}); events as JSON lines on fd 3 (stdout/stderr text from
# a kernel, result mime bundles, error, number_of_executions, ready, end); the cell's own output
# on fds 1 and 2. A cell ends with the marker from CELLA_INTERP_MARKER written to fds 1 and 2,
# then {"type": "end"} on fd 3. SIGINT interrupts the running cell.
#
# With ipykernel and jupyter_client importable (unless CELLA_PYTHON_KERNEL=builtin) cells run in a
# real Jupyter kernel; otherwise in this process, notebook-style: globals persist, the last
# expression's value is the result, matplotlib figures come back as PNG.

import json
import os
import signal
import sys

MARKER = os.environ.pop("CELLA_INTERP_MARKER", "")
EVENTS = os.fdopen(3, "w", buffering=1, encoding="utf-8")
COMMANDS = os.fdopen(4, "r", encoding="utf-8")
DRIVER_FILE = sys._getframe().f_code.co_filename
# Whole lines per write (a print is one chunk of output), flushed at every newline.
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)


def emit(event):
    EVENTS.write(json.dumps(event) + "\n")
    EVENTS.flush()


def end_cell():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
            stream.write(MARKER)
            stream.flush()
        except Exception:
            pass
    emit({"type": "end"})


def commands():
    while True:
        try:
            line = COMMANDS.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            yield json.loads(line)
        except ValueError:
            continue


class Env:
    """Per-cell environment variables, restored after the cell."""

    def __init__(self, env_vars):
        self.env_vars = env_vars or {}
        self.saved = {}

    def __enter__(self):
        for k, v in self.env_vars.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, old in self.saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


# --- the built-in driver -------------------------------------------------------------------------

REPR_METHODS = [
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
]


def mime_bundle(value):
    import base64

    data = {}
    bundle = getattr(value, "_repr_mimebundle_", None)
    if callable(bundle) and not isinstance(value, type):
        try:
            got = bundle()
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                data.update(got)
        except Exception:
            pass
    for mime, name in REPR_METHODS:
        if mime in data:
            continue
        method = getattr(value, name, None)
        if not callable(method) or isinstance(value, type):
            continue
        try:
            got = method()
        except Exception:
            continue
        if isinstance(got, tuple):
            got = got[0]
        if got is None:
            continue
        if isinstance(got, bytes):
            got = base64.b64encode(got).decode("ascii")
        data[mime] = got
    if "text/plain" not in data:
        try:
            import pprint

            data["text/plain"] = pprint.pformat(value)
        except Exception as e:
            data["text/plain"] = "<unprintable %s: %s>" % (type(value).__name__, e)
    return data


def display(*values, **_kwargs):
    """Like IPython's display(): each value becomes a (non-main) result of the cell."""
    for value in values:
        sys.stdout.flush()
        emit({"type": "result", "is_main_result": False, "data": mime_bundle(value)})


def flush_figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import base64
    import io

    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            emit(
                {
                    "type": "result",
                    "is_main_result": False,
                    "data": {
                        "text/plain": repr(fig),
                        "image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                    },
                }
            )
        plt.close("all")
    except Exception as e:
        print("capturing matplotlib figures failed: %s" % e, file=sys.stderr)


def user_traceback(e):
    import traceback

    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == DRIVER_FILE:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def run_builtin():
    import ast
    import asyncio
    import builtins
    import inspect
    import linecache
    import warnings

    os.environ.setdefault("MPLBACKEND", "Agg")
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    builtins.display = display
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    count = 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    emit({"type": "ready", "kernel": "builtin"})
    for cmd in commands():
        count += 1
        emit({"type": "number_of_executions", "execution_count": count})
        code = cmd.get("code", "")
        filename = "<cell %d>" % count
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        with Env(cmd.get("env_vars")):
            # SIGINT interrupts the cell only while it runs; between cells it is ignored, so an
            # interrupt cannot tear the driver's own protocol writes (envd repeats it meanwhile).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                tree = ast.parse(code, filename, "exec")
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
                    last = ast.Expression(tree.body.pop().value)
                flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
                result = eval(compile(tree, filename, "exec", flags=flags), namespace)
                if inspect.iscoroutine(result):
                    asyncio.run(result)
                if last is not None:
                    value = eval(compile(last, filename, "eval", flags=flags), namespace)
                    if inspect.iscoroutine(value):
                        value = asyncio.run(value)
                    if value is not None:
                        namespace["_"] = value
                        sys.stdout.flush()
                        emit({"type": "result", "is_main_result": True, "data": mime_bundle(value)})
            except BaseException as e:  # noqa: B036 - KeyboardInterrupt and SystemExit included
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                sys.stdout.flush()
                sys.stderr.flush()
                emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": user_traceback(e)})
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                flush_figures()
            except KeyboardInterrupt:
                pass
        end_cell()


# --- the Jupyter driver ----------------------------------------------------------------------------


def run_jupyter():
    import queue

    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=os.getcwd(), env=dict(os.environ))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)

    def kernel_group():
        provisioner = getattr(km, "provisioner", None)
        pid = getattr(provisioner, "pid", None) if provisioner is not None else None
        if pid is None and getattr(km, "kernel", None) is not None:
            pid = km.kernel.pid
        return pid

    def interrupt(*_args):
        pid = kernel_group()
        if pid:
            try:
                os.killpg(pid, signal.SIGINT)
            except OSError:
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass

    signal.signal(signal.SIGINT, interrupt)

    def run_silently(code):
        msg_id = kc.execute(code, silent=True, store_history=False)
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not km.is_alive():
                    return
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    # Figures: inline PNGs, as in a notebook.
    run_silently("try:\n    get_ipython().run_line_magic('matplotlib', 'inline')\nexcept Exception:\n    pass\n")
    emit({"type": "ready", "kernel": "jupyter"})
    try:
        for cmd in commands():
            env_vars = cmd.get("env_vars") or {}
            if env_vars:
                run_silently("import os as __cella_os\n__cella_os.environ.update(%r)\ndel __cella_os\n" % (env_vars,))
            msg_id = kc.execute(cmd.get("code", ""), store_history=True, allow_stdin=False, stop_on_error=True)
            while True:
                try:
                    msg = kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    if not km.is_alive():
                        process = getattr(getattr(km, "provisioner", None), "process", None)
                        code = getattr(process, "returncode", None)
                        why = " (killed: the sandbox may be out of memory)" if code == -9 else ""
                        emit({"type": "error", "name": "KernelDied", "value": "the Python kernel exited with status %s%s" % (code, why), "traceback": ""})
                        end_cell()
                        return
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    emit({"type": content.get("name", "stdout"), "text": content.get("text", "")})
                elif kind == "execute_input":
                    emit({"type": "number_of_executions", "execution_count": content.get("execution_count")})
                elif kind in ("display_data", "update_display_data"):
                    emit({"type": "result", "is_main_result": False, "data": content.get("data", {})})
                elif kind == "execute_result":
                    emit({"type": "result", "is_main_result": True, "data": content.get("data", {})})
                elif kind == "error":
                    emit({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""), "traceback": "\n".join(content.get("traceback", []))})
                elif kind == "status" and content.get("execution_state") == "idle":
                    break
            if env_vars:
                restore = {k: os.environ.get(k) for k in env_vars}
                run_silently(
                    "import os as __cella_os\n"
                    "for __k, __v in %r.items():\n"
                    "    if __v is None: __cella_os.environ.pop(__k, None)\n"
                    "    else: __cella_os.environ[__k] = __v\n"
                    "del __cella_os, __k, __v\n" % (restore,)
                )
            end_cell()
    finally:
        try:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        except Exception:
            pass


def jupyter_available():
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("ipykernel", "jupyter_client"))


def main():
    choice = os.environ.get("CELLA_PYTHON_KERNEL", "auto")
    if choice == "jupyter" or (choice == "auto" and jupyter_available()):
        run_jupyter()
    else:
        run_builtin()


main()
