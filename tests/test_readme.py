"""The commands a new user copies from README.md and docs/guide.md, run exactly as written.

A copy of the working tree, a fresh virtual environment made by the README's own first line, the
package installed from PyPI by its second (issue 27: `.[example]` once lacked httpx, so the
worker command and every docs example failed right after the install the README gives). Then,
in that environment: the demo is started and fetched, the README's worker command works a
reprice job, and the guide's first command (the quick start) runs to its end. Needs PyPI (or
pip's cache); about a minute, most of it the install.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rubris_asgi.client import Client

pytestmark = [pytest.mark.install, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
DEMO = "http://127.0.0.1:8000"
"""Where the README's demo command serves (its --port 8000)."""


def bash_block(doc: Path, heading: str) -> str:
    """The first ```bash block after ``heading`` in ``doc``."""
    text = doc.read_text()
    start = text.index(heading)
    m = re.compile(r"```bash\n(.*?)```", re.S).search(text, start)
    assert m is not None, f"no bash block after {heading!r} in {doc.name}"
    return m.group(1)


def inline_command(doc: Path, prefix: str) -> str:
    """The inline `...` command of ``doc`` that starts with ``prefix``."""
    m = re.search(r"`(" + re.escape(prefix) + r"[^`]*)`", doc.read_text())
    assert m is not None, f"no `{prefix}...` command in {doc.name}"
    return m.group(1)


def working_tree(dest: Path) -> Path:
    """A copy of the files git knows of or would add (what a clone plus this change holds)."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        src = ROOT / raw.decode()
        if src.is_file():
            target = dest / raw.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


@contextlib.contextmanager
def started(script: str, cwd: Path, log: Path) -> Iterator[subprocess.Popen[str]]:
    """``script`` in bash, in its own process group (stopped with SIGINT, as Ctrl-C would),
    its output in ``log`` (a file: pip's output would fill a pipe nobody reads yet)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        )
    proc.__dict__["log"] = log
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def output(proc: subprocess.Popen[str]) -> str:
    log: Path = proc.__dict__["log"]
    return log.read_text()


async def test_the_readme_and_guide_commands_run_as_written_in_a_fresh_venv(
    tmp_path: Path,
) -> None:
    readme, guide = ROOT / "README.md", ROOT / "docs" / "guide.md"
    demo = bash_block(readme, "## Run the example app")
    worker = inline_command(readme, "python3 -m example_app.worker")
    quickstart = bash_block(guide, "# The rubris_asgi guide").strip()
    assert demo.startswith("python3 -m venv .venv && . .venv/bin/activate\n"), demo
    assert "--port 8000" in demo
    assert port_free(8000), "port 8000 is taken: the README's demo command serves there"
    repo = working_tree(tmp_path / "rubris")

    with started("set -e\n" + demo, repo, tmp_path / "demo.log") as server:
        # the install, then the demo answering
        deadline = time.monotonic() + 420
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"the README's demo command ended ({server.returncode}):\n{output(server)}"
                )
            with contextlib.suppress(OSError):
                if get(DEMO + "/")[0] == 200:
                    break
            assert time.monotonic() < deadline, "the demo did not answer within 7 minutes"
            await asyncio.sleep(0.5)
        status, body = get(DEMO + "/rubris/client.js")
        assert status == 200 and b"export" in body

        # the worker command: it works the demo's reprice jobs (results on reprice.results)
        results: list[Any] = []
        async with Client(DEMO + "/rubris") as watcher:
            await watcher.subscribe("reprice.results", lambda v, *_: results.append(v))
            with started(
                ". .venv/bin/activate && " + worker, repo, tmp_path / "worker.log"
            ) as work:
                deadline = time.monotonic() + 30
                while not any(str(r.get("worker", "")).startswith("python-") for r in results):
                    if work.poll() is not None:
                        pytest.fail(
                            f"the worker command ended ({work.returncode}):\n{output(work)}"
                        )
                    assert time.monotonic() < deadline, "the worker worked no job in 30 s"
                    await asyncio.sleep(0.2)
            said = output(work)
        assert "Traceback" not in said, said
        assert "working reprice jobs" in said, said

        # the guide's first command, in the same environment
        run = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", ". .venv/bin/activate && " + quickstart],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
    said = output(server)
    assert "Traceback" not in said, said
