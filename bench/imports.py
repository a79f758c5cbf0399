"""Import-time benchmark: what ``import`` of each entry point costs a fresh interpreter.

Not a test. For each statement below it starts fresh interpreters (``python -c``) that time the
one statement with ``time.perf_counter`` around it, so the interpreter's own start-up is not
counted, and prints the median in milliseconds (wall clock; with, for a loaded machine, the
process's CPU time beside it) and whether Starlette was loaded:

- ``client``: ``import rubris_asgi.client`` (a worker process: the asyncio client, no server);
- ``protocol``: ``import rubris_asgi.protocol`` (the wire alone);
- ``spark``: ``import rubris_asgi.spark`` (a Spark executor: the data source, pyspark included);
- ``root``: ``import rubris_asgi`` (the lazy package root: its names load on first use);
- ``rubris``: ``from rubris_asgi import Rubris`` (a server: the app and every floor below it).

Bytecode is what an installed package runs from, so the children write and read theirs in a
cache of this run's own (``-X pycache_prefix``; the environment may forbid writing bytecode,
and a module compiled from source at every import would be timed with its compilation). A
first, untimed child per statement fills that cache. The statements take turns, run after run,
so that a burst of load elsewhere on the machine falls on all of them alike.

    python3 bench/imports.py            # last line: client_ms=N protocol_ms=N spark_ms=N ...
    python3 bench/imports.py --runs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STATEMENTS = {
    "client": "import rubris_asgi.client",
    "protocol": "import rubris_asgi.protocol",
    "spark": "import rubris_asgi.spark",
    "root": "import rubris_asgi",
    "rubris": "from rubris_asgi import Rubris",
}

# what each child runs: the statement timed alone, then "<ms> <cpu ms> <starlette loaded>"
_CHILD = """\
import sys, time
c = time.process_time()
t = time.perf_counter()
{statement}
ms = (time.perf_counter() - t) * 1000
cpu = (time.process_time() - c) * 1000
print(ms, cpu, any(m == "starlette" or m.startswith("starlette.") for m in sys.modules))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the children keep bytecode, in their own cache
    # this checkout first, whatever is installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _once(statement: str, cache: str, env: dict[str, str]) -> tuple[float, float, bool]:
    """One fresh interpreter: (milliseconds, CPU milliseconds, whether Starlette was loaded)."""
    proc = subprocess.run(
        [sys.executable, "-X", f"pycache_prefix={cache}", "-c", _CHILD.format(statement=statement)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{statement!r} failed: {tail[0]}")
    ms, cpu, starlette = proc.stdout.split()
    return float(ms), float(cpu), starlette == "True"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7, help="fresh interpreters per statement")
    args = ap.parse_args()
    env = _env()
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    cpu: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    starlette: dict[str, bool] = dict.fromkeys(STATEMENTS, False)
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rubris-imports-") as cache:
        for name, statement in STATEMENTS.items():  # untimed: fills the bytecode cache
            try:
                _once(statement, cache, env)
            except RuntimeError as exc:  # e.g. pyspark not installed: the others still run
                failed[name] = str(exc)
        for _ in range(args.runs):
            for name, statement in STATEMENTS.items():
                if name in failed:
                    continue
                ms, cpu_ms, loaded = _once(statement, cache, env)
                times[name].append(ms)
                cpu[name].append(cpu_ms)
                starlette[name] |= loaded
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, median of {args.runs} runs")
    figures = []
    for name, statement in STATEMENTS.items():
        if name in failed:
            print(f"{statement:34s}  {failed[name]}")
            figures.append(f"{name}_ms=NA")
            continue
        median = statistics.median(times[name])
        spread = f"{min(times[name]):.0f}-{max(times[name]):.0f}"
        cpu_ms = statistics.median(cpu[name])
        loads = "loads starlette" if starlette[name] else "no starlette"
        print(f"{statement:34s} {median:7.1f} ms  (runs {spread}; CPU {cpu_ms:.1f})  {loads}")
        figures.append(f"{name}_ms={median:.0f}")
    print(" ".join(figures))


if __name__ == "__main__":
    main()
