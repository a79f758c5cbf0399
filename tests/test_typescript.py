"""The browser client as an npm package with TypeScript declarations, kept true by a real check.

tests/typescript is a small npm project that depends on the package (``rubris-client``, from
rubris_asgi/static) and compiles check.ts with ``strict``: it imports every public name of the
client, types included. A declaration that the client does not match, or a use of the API the
declarations do not allow, fails the compilation; tsconfig.declarations.json type-checks the
declarations themselves. The compiled check then runs in Node against a real server
(tests/ts_app.py on uvicorn, in the test's own event loop) over WebSocket and long-poll, and the
test asserts on the JSON summary it prints and on the server's own counters.

Needs Node.js 18 or later and npm (CI installs them: a missing one fails the test, it is not
skipped). ``npm ci`` runs when tests/typescript/node_modules is missing or older than
package-lock.json.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rubris_asgi.server.assets import STATIC, Assets

from .server import run_server
from .ts_app import make_app

pytestmark = pytest.mark.node

PROJECT = Path(__file__).resolve().parent / "typescript"
TRANSPORTS = ["websocket", "longpoll"]
CHECK_TIMEOUT = 40.0  # the check bounds itself at 25 s


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: the TypeScript check needs Node.js 18 or later and npm "
            "(apt-get install nodejs npm)",
            pytrace=False,
        )
    return path


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=PROJECT, capture_output=True, text=True, timeout=timeout, check=False
    )


def ensure_node_modules() -> None:
    """``npm ci`` unless node_modules is there and newer than package-lock.json."""
    npm = tool("npm")
    installed = PROJECT / "node_modules" / ".package-lock.json"  # npm writes it on install
    lock = PROJECT / "package-lock.json"
    if installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return
    done = run([npm, "ci", "--no-audit", "--no-fund"], timeout=300)
    assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def compiled() -> Path:
    """dist/check.js, compiled from check.ts (strict) once the declarations type-check."""
    node = tool("node")
    version = run([node, "--version"], timeout=10).stdout.strip()
    assert int(version.lstrip("v").split(".")[0]) >= 18, f"Node.js 18 or later needed: {version}"
    ensure_node_modules()
    tsc = str(PROJECT / "node_modules" / "typescript" / "bin" / "tsc")
    for config in ("tsconfig.declarations.json", "tsconfig.json"):
        done = run([node, tsc, "-p", config, "--pretty", "false"], timeout=120)
        assert done.returncode == 0, f"tsc -p {config}:\n{done.stdout}{done.stderr}"
    return PROJECT / "dist" / "check.js"


def test_the_package_is_the_served_client_and_ships_only_it() -> None:
    package = json.loads((STATIC / "package.json").read_text())
    pyproject = (STATIC.parent.parent / "pyproject.toml").read_text()
    assert f'version = "{package["version"]}"' in pyproject
    assert package["exports"]["."] == {"types": "./client.d.ts", "default": "./client.js"}
    assert package["type"] == "module" and package["types"] == "./client.d.ts"
    assert "dependencies" not in package
    assert package["files"] == ["client.js", "client.d.ts", "client/*.js"]
    # the plugin serves the modules only, not the package's other files
    assert all(name.endswith(".js") for name in Assets().files)
    # the project under test uses the package from the source tree, not a copy
    lock = json.loads((PROJECT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/rubris-client"] == {
        "resolved": "../../rubris_asgi/static",
        "link": True,
    }


def test_the_declarations_name_every_export_and_the_check_uses_them_all(compiled: Path) -> None:
    """What tsc cannot see: an export of client.js missing from client.d.ts, or a declared
    name check.ts does not import (and so does not check)."""
    script = 'import("rubris-client").then((m) => console.log(JSON.stringify(Object.keys(m))))'
    done = run([tool("node"), "--input-type=module", "-e", script], timeout=30)
    assert done.returncode == 0, done.stderr
    exported = set(json.loads(done.stdout))
    declarations = (STATIC / "client.d.ts").read_text()
    values = set(re.findall(r"^export declare (?:const|class|function) (\w+)", declarations, re.M))
    assert values == exported
    types = set(re.findall(r"^export (?:type|interface) (\w+)", declarations, re.M))
    block = re.search(
        r"import \{(.*?)\} from \"rubris-client\"", (PROJECT / "check.ts").read_text(), re.S
    )
    assert block is not None
    imported = {name.strip().removeprefix("type ") for name in block[1].split(",") if name.strip()}
    assert imported == values | types


async def test_check_ts_compiles_and_runs_against_a_live_server(compiled: Path) -> None:
    rubris, app = make_app()
    async with run_server(app) as base:
        proc = await asyncio.create_subprocess_exec(
            tool("node"),
            str(compiled),
            f"{base}/rubris",
            *TRANSPORTS,
            cwd=PROJECT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CHECK_TIMEOUT)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            proc.kill()
            await proc.wait()
            raise
        lines = out.decode().strip().splitlines()
        assert lines, f"no output; stderr:\n{err.decode()}"
        summary: dict[str, Any] = json.loads(lines[-1])
        assert summary["ok"], f"{summary.get('error')}\n{summary.get('stack')}\n{err.decode()}"
        assert proc.returncode == 0, err.decode()

        for transport in TRANSPORTS:
            tag = "WS" if transport == "websocket" else "LP"
            r = summary["runs"][transport]
            assert r["transport"] == transport
            assert r["states"][0] == "open" and r["states"][-1] == "closed", r["states"]
            assert r["sockets"] >= (1 if transport == "websocket" else 0)
            assert r["snapshot"]["info"]["mode"] == 1 and r["snapshot"]["info"]["codec"] == 0
            assert r["snapshot"]["values"][0] == {"symbol": tag, "px": 100.0}
            assert r["snapshot"]["values"][-1] == {"symbol": tag, "px": 101.5}
            assert r["ring"]["info"]["mode"] == 2 and r["ring"]["values"] == [2, 3, 4, 5]
            assert r["private"] == {"mode": 3, "values": [0, 1, 2]}
            assert r["queueSubscribed"]["meta"]["attempt"] == 1
            assert r["compressed"] in (True, "unsupported")
            assert r["call"] == {"symbol": tag, "side": "buy", "qty": 10}
            assert r["stream"] == [0, 1, 2] and r["streamIter"] == [0, 1, 2, 3]
            assert r["errors"] == {
                "call": 10,
                "unknownMethod": 3,
                "subscribe": 10,
                "streamIter": 10,
                "unknownBatch": 3,
                "watchBatchTimeout": "timeout",
                "consumeNotAQueue": 3,
            }
            assert r["refusal"] == {"code": 10, "reason": "unknown symbol"}
            final = {"state": "complete", "total": 4, "done": 4, "failed": 0, "completed": True}
            assert r["batch"]["final"] == final and r["batch"]["updates"][-1] == final
            stats = r["consumer"]["stats"]
            counts = [stats[k] for k in ("received", "taken", "acked", "nacked", "buffered")]
            assert counts == [5, 5, 4, 1, 0], stats
            assert sorted(r["consumer"]["attempts"]) == [1, 1, 1, 1, 2]
            assert r["loop"]["values"] == [0, 1]
            table = r["table"]
            assert table["info"]["mode"] == 5 and table["info"]["name"] == f"book.{tag}"
            assert table["equal"] == [True] * 6, table  # the Map equals the server's table
            # the first table, 2 sets, 2 patches (as PATCH or SET on the wire), 1 delete
            assert table["ops"].get("synced") == 1 and table["ops"].get("delete") == 1
            assert table["ops"].get("patch", 0) >= 1, table["ops"]
            assert sum(table["ops"].get(op, 0) for op in ("set", "patch")) == 5, table["ops"]
            assert table["keys"] == ["101", "102"] and table["rated"] == 1
            assert rubris.entries(f"book.{tag}")["101"]["flags"] == {"hot": True}
            presence = table["presence"]
            assert presence["joined"] == 1 and presence["left"] == 1 and presence["count"] == 1
            assert presence["member"] == {"sessions": 1, "info": None}
            assert table["counts"][0] == {"members": 1, "sessions": 1}
            assert table["counts"][-1] == {"members": 0, "sessions": 0}
            assert r["stats"]["messages"] > 0 and isinstance(r["stats"]["rttMs"], int)
            assert r["events"]["error"] == []
            assert r["afterClose"] == {"state": "closed", "call": "closed", "subscribe": "closed"}

            # what the server saw of it
            jobs = rubris.queue_stats(f"jobs.{tag}")
            assert (jobs.enqueued, jobs.acked, jobs.nacked, jobs.requeued) == (4, 4, 1, 1)
            assert jobs.outstanding == 0 and jobs.waiting == 0
            looped = rubris.queue_stats(f"jobs.{tag}loop")
            assert (looped.acked, looped.waiting, looped.outstanding) == (2, 0, 0)
            batch = await rubris.batches.status(r["batch"]["id"])
            assert batch.to_json()["state"] == "complete" and batch.done == 4
