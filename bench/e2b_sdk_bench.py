"""Times create -> commands.run("true") -> kill through the unmodified `e2b` SDK.

Run by `cella bench e2b` (which starts the server and sets E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY); usable by hand against any E2B-compatible endpoint:

    python bench/e2b_sdk_bench.py --runs 50 --concurrency 1 --template base

Prints one JSON object: {"concurrency": C, "ms": [...], "wall_s": W, "errors": [...]}.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import time

from e2b import Sandbox


def one(template: str) -> float:
    start = time.perf_counter()
    sandbox = Sandbox.create(template=template, timeout=120)
    try:
        result = sandbox.commands.run("true")
        if result.exit_code != 0:
            raise RuntimeError(f"`true` exited with {result.exit_code}")
    finally:
        sandbox.kill()
    return (time.perf_counter() - start) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--template", default="base")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.warmup):
        one(args.template)
    samples, errors = [], []
    wall = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        futures = [pool.submit(one, args.template) for _ in range(args.runs)]
        for f in futures:
            try:
                samples.append(f.result())
            except Exception as e:  # reported, not hidden: the driver fails the run on errors
                errors.append(f"{type(e).__name__}: {e}")
    wall = time.perf_counter() - wall
    print(json.dumps({"concurrency": args.concurrency, "ms": samples, "wall_s": wall, "errors": errors}))
    sys.stdout.flush()
    # The SDK's native HTTP threads can abort during interpreter teardown; the result is out.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
