"""Drives cella-envd's filesystem service and /files with the real E2B Python SDK.

Run by `suite::sdk::python_sdk_drives_the_filesystem`: argv = envd URL, scratch directory.
Exits non-zero (with a traceback) on the first mismatch.
"""

import asyncio
import sys
import time

from packaging.version import Version

from e2b.api.client_async import get_envd_api as get_async_envd_api
from e2b.api.client_sync import get_envd_api
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import FileNotFoundException, InvalidArgumentException
from e2b.sandbox.filesystem.filesystem import FileType
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
from e2b.sandbox_async.filesystem.filesystem import Filesystem as AsyncFilesystem
from e2b.sandbox_sync.filesystem.filesystem import Filesystem

URL, WORK = sys.argv[1], sys.argv[2]
VERSION = Version("0.6.13")
config = ConnectionConfig(api_key="e2b_" + "0" * 40, request_timeout=10)
fs = Filesystem(URL, VERSION, config, get_envd_api(config, URL))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# Writes: multipart (str/bytes default), octet-stream, gzip, several files at once.
info = fs.write(f"{WORK}/a/b.txt", "hello")
check(info.path == f"{WORK}/a/b.txt" and info.name == "b.txt" and info.type == FileType.FILE, f"write info {info}")
check(fs.read(f"{WORK}/a/b.txt") == "hello", "read text")
fs.write(f"{WORK}/a/bin", b"\x00\x01\x02" * 1000, use_octet_stream=True)
check(bytes(fs.read(f"{WORK}/a/bin", format="bytes")) == b"\x00\x01\x02" * 1000, "octet-stream round trip")
fs.write(f"{WORK}/a/gz.txt", "zipped " * 1000, gzip=True)
check(fs.read(f"{WORK}/a/gz.txt", gzip=True) == "zipped " * 1000, "gzip round trip")
many = fs.write_files([{"path": f"{WORK}/m/{i}.txt", "data": f"file {i}"} for i in range(3)])
check([w.name for w in many] == ["0.txt", "1.txt", "2.txt"], f"write_files {many}")
check(fs.read(f"{WORK}/m/2.txt") == "file 2", "multipart content")
meta = fs.write(f"{WORK}/a/meta.txt", "m", metadata={"Project": "cella"})
check(meta.metadata == {"project": "cella"}, f"write metadata {meta}")
check(fs.get_info(f"{WORK}/a/meta.txt").metadata == {"project": "cella"}, "metadata on stat")
fs.remove(f"{WORK}/a/meta.txt")
chunks = b"".join(fs.read(f"{WORK}/a/bin", format="stream"))
check(chunks == b"\x00\x01\x02" * 1000, "stream read")

# Stat, list, exists.
entry = fs.get_info(f"{WORK}/a/b.txt")
check(entry.type == FileType.FILE and entry.size == 5 and entry.name == "b.txt", f"get_info {entry}")
check(entry.permissions.startswith("-rw") and entry.mode & 0o600 == 0o600, f"permissions {entry}")
check(entry.modified_time.year >= 2024 and entry.symlink_target is None, f"modified_time {entry}")
names = sorted(e.path[len(WORK) + 1 :] for e in fs.list(WORK, depth=2))
check(names == ["a", "a/b.txt", "a/bin", "a/gz.txt", "m", "m/0.txt", "m/1.txt", "m/2.txt"], f"list {names}")
check(fs.exists(f"{WORK}/a") and not fs.exists(f"{WORK}/nope"), "exists")

# Directories, renames, removal.
check(fs.make_dir(f"{WORK}/x/y") is True, "make_dir creates")
check(fs.make_dir(f"{WORK}/x/y") is False, "make_dir reports an existing directory")
moved = fs.rename(f"{WORK}/a/b.txt", f"{WORK}/x/y/c.txt")
check(moved.path == f"{WORK}/x/y/c.txt" and moved.type == FileType.FILE, f"rename {moved}")
fs.remove(f"{WORK}/x")
check(not fs.exists(f"{WORK}/x/y/c.txt"), "remove is recursive")

# Errors map to the SDK's exceptions.
for call in (lambda: fs.read(f"{WORK}/nope"), lambda: fs.get_info(f"{WORK}/nope"), lambda: fs.list(f"{WORK}/nope")):
    try:
        call()
        raise AssertionError("expected FileNotFoundException")
    except FileNotFoundException:
        pass
try:
    fs.list(f"{WORK}/a/bin")
    raise AssertionError("expected InvalidArgumentException")
except InvalidArgumentException:
    pass

# Sync watch: CreateWatcher / GetWatcherEvents / RemoveWatcher.
handle = fs.watch_dir(WORK, recursive=True)
fs.write(f"{WORK}/m/watched.txt", "w")
seen = []
deadline = time.time() + 5
while time.time() < deadline and not any(e.name == "m/watched.txt" and e.type == FilesystemEventType.CREATE for e in seen):
    seen += handle.get_new_events()
    time.sleep(0.05)
check(any(e.name == "m/watched.txt" and e.type == FilesystemEventType.CREATE for e in seen), f"sync watch events {seen}")
handle.stop()


# Async watch: the WatchDir stream.
async def stream_watch():
    afs = AsyncFilesystem(URL, VERSION, config, get_async_envd_api(config, URL))
    got = asyncio.Queue()
    handle = await afs.watch_dir(WORK, on_event=got.put_nowait, include_entry=True)
    await afs.write(f"{WORK}/async.txt", "a")
    while True:
        event = await asyncio.wait_for(got.get(), 5)
        if event.name == "async.txt" and event.type == FilesystemEventType.CREATE:
            check(event.entry is not None and event.entry.path == f"{WORK}/async.txt", f"entry {event}")
            break
    await handle.stop()
    try:
        await afs.watch_dir(f"{WORK}/nope", on_event=lambda e: None)
        raise AssertionError("expected FileNotFoundException from watch_dir")
    except FileNotFoundException:
        pass


asyncio.run(stream_watch())
print("e2b sdk: all filesystem checks passed")
# Leave without interpreter teardown: the SDK's native HTTP client threads can abort while the
# interpreter finalizes (seen as SIGABRT after every check passed), which says nothing about envd.
import os
import sys

sys.stdout.flush()
os._exit(0)
