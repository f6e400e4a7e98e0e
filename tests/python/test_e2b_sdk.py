"""The unmodified `e2b` Python SDK against `cella serve`."""

import json
import os
import time
import urllib.error
import urllib.request

import pytest
from e2b import PtySize, Sandbox, SandboxQuery
from e2b.exceptions import (
    AuthenticationException,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
)
from e2b.sandbox.commands.command_handle import CommandExitException
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

API = os.environ.get("E2B_API_URL", "")


def test_create_with_metadata_and_envs_then_commands():
    sb = Sandbox.create(metadata={"suite": "sdk", "case": "create"}, envs={"GREETING": "hi"}, timeout=60)
    try:
        r = sb.commands.run("echo $GREETING; echo oops >&2; id -un")
        assert r.stdout == "hi\nuser\n"
        assert r.stderr == "oops\n"
        assert r.exit_code == 0
        with pytest.raises(CommandExitException) as e:
            sb.commands.run("exit 3")
        assert e.value.exit_code == 3
        assert sb.commands.run("whoami", user="root").stdout.strip() == "root"
        info = sb.get_info()
        assert info.metadata == {"suite": "sdk", "case": "create"}
        assert info.sandbox_id == sb.sandbox_id
    finally:
        sb.kill()


def test_output_streams_while_the_command_runs(sandbox):
    seen = []
    started = time.time()
    sandbox.commands.run("echo first; sleep 1.5; echo second", on_stdout=lambda line: seen.append((time.time() - started, line)))
    assert [line.strip() for _, line in seen] == ["first", "second"]
    assert seen[0][0] < seen[1][0] - 1.0, seen


def test_background_commands_kill_and_connect(sandbox):
    handle = sandbox.commands.run("echo started; sleep 60", background=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert handle.pid in pids
    again = sandbox.commands.connect(handle.pid)
    assert again.pid == handle.pid
    assert handle.kill()
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def test_send_stdin(sandbox):
    handle = sandbox.commands.run("head -n 1", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "typed line\n")
    result = handle.wait()
    assert result.stdout == "typed line\n"


def test_pty_create_send_resize(sandbox):
    out = bytearray()
    term = sandbox.pty.create(size=PtySize(rows=24, cols=80))
    sandbox.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(term.pid, b"stty size; exit\n")
    term.wait(on_pty=out.extend)
    assert b"30 100" in bytes(out), bytes(out)


def test_files_text_bytes_list_exists_mkdir_rename_remove(sandbox):
    f = sandbox.files
    f.write("/home/user/notes/a.txt", "hello")
    assert f.read("/home/user/notes/a.txt") == "hello"
    blob = os.urandom(50 * 1024 * 1024)
    f.write("/home/user/big.bin", blob)
    assert f.read("/home/user/big.bin", format="bytes") == blob
    names = {e.name for e in f.list("/home/user")}
    assert {"notes", "big.bin"} <= names
    assert f.exists("/home/user/notes/a.txt")
    assert not f.exists("/home/user/nope")
    assert f.make_dir("/home/user/d1/d2")
    assert not f.make_dir("/home/user/d1/d2")
    f.rename("/home/user/notes/a.txt", "/home/user/d1/b.txt")
    assert f.read("/home/user/d1/b.txt") == "hello"
    f.remove("/home/user/d1")
    assert not f.exists("/home/user/d1")
    with pytest.raises(NotFoundException):
        f.read("/home/user/missing.txt")


def test_watch_dir_events(sandbox):
    sandbox.files.make_dir("/home/user/w")
    handle = sandbox.files.watch_dir("/home/user/w")
    sandbox.files.write("/home/user/w/new.txt", "x")
    time.sleep(0.5)
    events = handle.get_new_events()
    handle.stop()
    assert any(e.name == "new.txt" and e.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE) for e in events), events


def test_upload_and_download_urls(sandbox):
    up = sandbox.upload_url("/home/user/up.txt")
    req = urllib.request.Request(up, data=b"via url", method="POST", headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(req).read()
    assert sandbox.files.read("/home/user/up.txt") == "via url"
    down = sandbox.download_url("/home/user/up.txt")
    assert urllib.request.urlopen(down).read() == b"via url"
    # A tampered signature is refused.
    bad = down.replace("signature=v1_", "signature=v1_x")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad)
    assert e.value.code == 401


def test_list_with_metadata_filter_and_paging():
    tag = str(time.time())
    boxes = [Sandbox.create(metadata={"batch": tag, "i": str(i)}, timeout=60) for i in range(3)]
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"batch": tag}), limit=2)
        first = paginator.next_items()
        assert len(first) == 2 and paginator.has_next
        second = paginator.next_items()
        assert len(second) == 1 and not paginator.has_next
        ids = {s.sandbox_id for s in first + second}
        assert ids == {b.sandbox_id for b in boxes}
        none = Sandbox.list(query=SandboxQuery(metadata={"batch": "no-such-batch"})).next_items()
        assert none == []
    finally:
        for b in boxes:
            b.kill()


def test_set_timeout_and_expiry():
    sb = Sandbox.create(timeout=60)
    sb.set_timeout(2)
    time.sleep(3.5)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    assert not sb.is_running()


def test_pause_resume_keeps_files_and_processes():
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.write("/home/user/keep.txt", "kept")
        counter = sb.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done", background=True)
        time.sleep(0.5)
        assert sb.pause()
        assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
        resumed = Sandbox.connect(sb.sandbox_id)
        assert resumed.files.read("/home/user/keep.txt") == "kept"
        a = int(resumed.files.read("/tmp/n"))
        time.sleep(0.6)
        b = int(resumed.files.read("/tmp/n"))
        assert b > a, "the background process did not survive pause/resume"
        assert counter.pid in [p.pid for p in resumed.commands.list()]
    finally:
        sb.kill()


def test_kill():
    sb = Sandbox.create(timeout=60)
    assert sb.kill()
    assert not Sandbox.kill(sb.sandbox_id)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sb.sandbox_id)


def test_other_tenant_cannot_see_or_use(sandbox, other_key):
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=other_key)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id, api_key=other_key)
    assert not Sandbox.kill(sandbox.sandbox_id, api_key=other_key)
    listed = Sandbox.list(api_key=other_key).next_items()
    assert sandbox.sandbox_id not in [s.sandbox_id for s in listed]
    # The gateway refuses requests without the sandbox's access token.
    req = urllib.request.Request(
        API + "/filesystem.Filesystem/ListDir",
        data=json.dumps({"path": "/home/user"}).encode(),
        headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 401
    assert sandbox.commands.run("echo still mine").stdout == "still mine\n"


def test_bad_input_gets_the_right_error():
    with pytest.raises(SandboxException) as e:
        Sandbox.create(template="no-such-template")
    assert "unknown template" in str(e.value)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    key = os.environ["E2B_API_KEY"]
    for body, status in ((b"{not json", 400), (json.dumps({"templateID": "base", "timeout": -5}).encode(), 400), (json.dumps({"timeout": 5}).encode(), 400)):
        req = urllib.request.Request(API + "/sandboxes", data=body, headers={"Content-Type": "application/json", "X-API-Key": key}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == status
        payload = json.loads(err.value.read())
        assert payload["code"] == status and payload["message"]
    with pytest.raises(NotFoundException):
        Sandbox.connect("..%2F..%2Fetc")
    with pytest.raises(NotFoundException):
        Sandbox.get_info("../../etc/passwd")
