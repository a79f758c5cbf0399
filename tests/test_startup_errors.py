"""A start-up failure of rubris's own is one line that says what to do, and exit code 3
(issue 36, item 4).

The demo runs as a user runs it (``python3 -m example_app``, one process and ``--workers 2``)
against a Redis that is not there and against one without ``appendonly yes``: it exits with
code 3 after exactly one ERROR line naming the Redis and the fix, and prints no traceback (the
report: a 74-line traceback, 144 with two workers). The same for several workers without a
broker; ``RubrisMiddleware`` logs the one line in-process and under ``serve``; under the plain
uvicorn CLI, which rubris does not drive, the traceback is short and ends with the line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from uvicorn.lifespan.on import LifespanOn

from rubris_asgi import BrokerUnavailable, Rubris, RubrisMiddleware
from rubris_asgi.errors import BrokerStartupError, StartupError
from rubris_asgi.serving import StartupLifespan

from .netkit import free_port
from .rediskit import RedisServer

ROOT = Path(__file__).resolve().parents[1]
RUN_S = 60.0
"""Seconds a demo may take to fail (it imports FastAPI, redis-py and the demo: 1-3 s)."""
FIX_UNREACHABLE = "start redis-server there or fix RUBRIS_REDIS_URL"


def nowhere() -> str:
    """A Redis URL where nothing listens."""
    return f"redis://127.0.0.1:{free_port()}/0"


def run(argv: list[str], redis_url: str | None) -> tuple[int, list[str]]:
    """Run ``python argv`` from the repository as a user would; its exit code and the lines it
    printed (stdout and stderr together)."""
    drop = ("RUBRIS_REDIS_URL", "RUBRIS_STATS_DIR", "PROMETHEUS_MULTIPROC_DIR", "RUBRIS_BATCHES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if redis_url is not None:
        env["RUBRIS_REDIS_URL"] = redis_url
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=RUN_S,
        check=False,
    )
    return done.returncode, done.stdout.decode(errors="replace").splitlines()


def demo(workers: int, redis_url: str) -> tuple[int, list[str]]:
    argv = ["-m", "example_app", "--port", str(free_port()), "--workers", str(workers)]
    return run(argv, redis_url)


def the_error(lines: list[str]) -> str:
    """The one ERROR line of the output, and no traceback."""
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    errors = [line for line in lines if "ERROR" in line or "rubris:" in line]
    assert len(errors) == 1, text
    return errors[0]


@pytest.mark.slow  # a process started (the demo, a server): seconds
@pytest.mark.parametrize("workers", [1, 2])
def test_demo_without_redis_says_what_to_do_in_one_line(workers: int) -> None:
    url = nowhere()
    code, lines = demo(workers, url)
    assert code == 3, lines
    assert the_error(lines) == (
        f"ERROR:    rubris: cannot reach Redis at {url} (Connection refused): {FIX_UNREACHABLE}"
    )


@pytest.mark.redis
@pytest.mark.parametrize("workers", [1, 2])
def test_demo_on_a_redis_without_appendonly_says_how_to_turn_it_on(workers: int) -> None:
    with RedisServer(appendonly=False) as server:
        code, lines = demo(workers, server.url)
    assert code == 3, lines
    line = the_error(lines)
    assert line.startswith(
        f"ERROR:    rubris: work-queue items kept in Redis at {server.url} would be lost on a "
        "Redis restart (appendonly no, "
    ), line
    assert f"run `redis-cli -p {server.port} config set appendonly yes`" in line
    assert "start redis-server with --appendonly yes" in line
    assert line.endswith("or pass allow_volatile=True to accept the loss"), line


@pytest.mark.redis
def test_a_password_refused_says_where_to_give_it() -> None:
    import redis

    with RedisServer() as server:  # it must answer PING to be taken for started
        with redis.Redis.from_url(server.url) as r:
            r.config_set("requirepass", "secret")
        code, lines = demo(1, server.url)
    assert code == 3, lines
    assert the_error(lines) == (
        f"ERROR:    rubris: Redis at {server.url} refused this node's credentials "
        "(Authentication required.): put the right user and password in RUBRIS_REDIS_URL "
        "(redis://USER:PASSWORD@HOST:PORT/DB)"
    )


@pytest.mark.slow  # a process started (the demo, a server): seconds
def test_several_workers_without_a_broker_say_so_in_one_line() -> None:
    script = (
        "from rubris_asgi import serve; "
        f"serve('tests.startup_app:app', port={free_port()}, workers=2)"
    )
    code, lines = run(["-c", script], None)
    assert code == 3, lines
    assert the_error(lines) == (
        "ERROR:    rubris: 2 workers without a broker would each serve their own topics: set "
        "RUBRIS_REDIS_URL=redis://HOST:6379/0 (or Rubris(broker=...)), or run one worker"
    )


@pytest.mark.slow  # a process started (the demo, a server): seconds
def test_the_middleware_under_serve_says_it_in_one_line() -> None:
    url = nowhere()
    script = (
        "from rubris_asgi import serve; from tests.startup_app import rubris, wrapped; "
        f"serve(wrapped, rubris, port={free_port()})"
    )
    code, lines = run(["-c", script], url)
    assert code == 3, lines
    assert (
        the_error(lines)
        == f"rubris: cannot reach Redis at {url} (Connection refused): {FIX_UNREACHABLE}"
    )


@pytest.mark.slow  # a process started (the demo, a server): seconds
def test_plain_uvicorn_prints_a_short_traceback_ending_with_the_line() -> None:
    """``uvicorn app:app``: uvicorn logs the traceback Starlette sends; no chain of redis-py's
    causes under it, and its last line is the message with the fix."""
    url = nowhere()
    argv = ["-m", "uvicorn", "tests.startup_app:app", "--port", str(free_port())]
    code, lines = run(argv, url)
    assert code == 3, lines
    text = "\n".join(lines)
    assert text.count("Traceback") == 1 and "During handling" not in text, text
    assert "direct cause" not in text and len(lines) < 20, text
    failed = lines.index("ERROR:    Application startup failed. Exiting.")
    assert [line for line in lines[:failed] if line][-1] == (
        "rubris_asgi.errors.BrokerStartupError: cannot reach Redis at "
        f"{url} (Connection refused): {FIX_UNREACHABLE}"
    )


async def startup(lifespan: LifespanOn) -> list[dict[str, Any]]:
    """``lifespan``'s startup, run; what the app sent it."""
    received: list[dict[str, Any]] = []
    send = lifespan.send

    async def spy(message: Any) -> None:
        received.append(dict(message))
        await send(message)

    lifespan.send = spy  # type: ignore[method-assign]
    await asyncio.wait_for(lifespan.startup(), 10)
    assert lifespan.should_exit
    return received


class Records(logging.Handler):
    """What a logger logged, whatever handlers and propagation earlier tests left on it."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.logger = logging.getLogger(name)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> Records:
        self.level_was = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_was)


@pytest.mark.parametrize("server", ["uvicorn", "serve"])
async def test_the_middleware_logs_one_line_and_the_traceback_at_debug(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, under uvicorn's own lifespan driver and under serve()'s: one ERROR record,
    ``rubris: ...`` without a traceback (that is at DEBUG); the server is told the startup
    failed and has nothing to log again."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    url = nowhere()
    monkeypatch.setenv("RUBRIS_REDIS_URL", url)
    rubris = Rubris(batches=False)
    app = RubrisMiddleware(Starlette(), rubris=rubris)
    config = uvicorn.Config(app, lifespan="on", log_config=None)
    lifespan = LifespanOn(config) if server == "uvicorn" else StartupLifespan(config)
    with Records("rubris_asgi") as ours, Records("uvicorn.error") as uvicorns:
        received = await startup(lifespan)
    assert received == [{"type": "lifespan.startup.failed", "message": ""}]
    assert not rubris.started
    errors = [r for r in ours.records if r.levelno >= logging.ERROR]
    said = f"rubris: cannot reach Redis at {url} (Connection refused): {FIX_UNREACHABLE}"
    assert [r.getMessage() for r in errors] == [said] and errors[0].exc_info is None
    theirs = [r.getMessage() for r in uvicorns.records if r.levelno >= logging.ERROR]
    # uvicorn's own line after ours: not rubris's to drop there
    assert theirs == (["Application startup failed. Exiting."] if server == "uvicorn" else [])
    causes = [r.exc_info[1] for r in ours.records if r.levelno == logging.DEBUG and r.exc_info]
    assert any(isinstance(c, BrokerStartupError) for c in causes)  # where rubris raised it
    assert any(isinstance(c, RedisConnectionError) for c in causes)  # what redis-py raised


async def test_a_start_failure_is_a_startup_error_and_still_a_broker_unavailable() -> None:
    rubris = Rubris(broker=nowhere(), batches=False)
    with pytest.raises(StartupError) as failed:
        await rubris.start()
    assert isinstance(failed.value, BrokerUnavailable)
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert "fix the Redis URL given to rubris" in str(failed.value)
    assert not rubris.started


@pytest.mark.parametrize("kind", ["no directory", "not a database"])
async def test_a_batch_store_that_cannot_be_opened_fails_the_start(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened at start where it exists; a file not made yet is still made by the first batch
    only, not by the start."""
    monkeypatch.delenv("RUBRIS_REDIS_URL", raising=False)
    fresh = tmp_path / "fresh.sqlite3"
    async with Rubris(batches=str(fresh)):
        pass
    assert not fresh.exists()
    path = tmp_path / "missing" / "batches.sqlite3"
    if kind == "not a database":
        path = tmp_path / "batches.sqlite3"
        path.write_bytes(b"this is no SQLite file" * 100)
    rubris = Rubris(batches=str(path))
    with pytest.raises(StartupError) as failed:
        await rubris.start()
    message = str(failed.value)
    assert message.startswith(f"cannot open the batch store {path} ("), message
    assert message.endswith(
        "give Rubris(batches=...) a SQLite file this process can create or write (or batches=False)"
    )
    assert ("no directory" if kind == "no directory" else "not a database") in message
    assert not rubris.started
