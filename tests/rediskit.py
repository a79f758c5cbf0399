"""A real ``redis-server`` for tests: started once a session, emptied before each test.

Test modules import the fixtures (``from .rediskit import redis_server, redis_url``).
Nothing is skipped when ``redis-server`` is missing: the tests fail saying so, since CI
installs it and a silently skipped store is an untested one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType

import pytest

START_TIMEOUT = 10.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _command(port: int, name: str, timeout: float) -> bytes:
    """One argument-less command in RESP, its reply's first line (no client library needed
    while the server may not be up yet, nor an event loop)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"*1\r\n${len(name)}\r\n{name}\r\n".encode())
        reply = b""
        while not reply.endswith(b"\r\n"):
            got = s.recv(256)
            if not got:
                break
            reply += got
        return reply


def _pings(port: int) -> bool:
    try:
        return _command(port, "PING", 0.5).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A ``redis-server`` on a free port of 127.0.0.1, in a temporary directory; ``url`` points
    at its database 0. A context manager: stopped on exit.

    With an append-only file (``appendonly yes``), as the queues and batches require of a
    production Redis (``RedisNotDurable`` otherwise): ``kill()`` and ``restart()`` (on the same
    port) show a client what a Redis restart is, nothing lost. Its writes reach the file at
    once but are not synced to the disk (``appendfsync no``: cheap, and a process restart
    loses nothing), unless ``persist``: then each is synced before Redis answers
    (``appendfsync always``). ``appendonly=False`` starts a Redis that loses everything on a
    restart (RDB snapshots off too), for the tests of what is refused on one; ``args`` are
    more options (``("--rename-command", "CONFIG", "")``, say)."""

    def __init__(
        self,
        executable: str = "redis-server",
        *,
        persist: bool = False,
        appendonly: bool = True,
        args: tuple[str, ...] = (),
    ) -> None:
        self.executable = executable
        self.persist = persist
        self.appendonly = appendonly
        self.args = args
        self.port = 0
        self.dir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (bench/batches.py pins it to a core)."""
        return None if self._proc is None else self._proc.pid

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        """Empty every database (FLUSHALL)."""
        reply = _command(self.port, "FLUSHALL", 10.0)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"FLUSHALL answered {reply!r}")

    def output(self) -> str:
        """What the server printed so far."""
        if self.dir is None:
            return ""
        with open(os.path.join(self.dir, "redis.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def start(self) -> None:
        exe = shutil.which(self.executable)
        if exe is None:
            raise RuntimeError(
                f"{self.executable} not found on PATH: the Redis tests need a Redis server "
                "(apt-get install redis-server)"
            )
        self.dir = tempfile.mkdtemp(prefix="rubris-redis-")
        for _ in range(3):  # another process may take the free port before the server does
            self.port = _free_port()
            failure = self._launch(exe)
            if failure is None:
                return
            if "Address already in use" not in self.output():
                break
        out = self.output()
        self.stop()
        raise RuntimeError(f"{exe} on port {self.port} {failure}; its output:\n{out}")

    def kill(self) -> None:
        """Stop the server, keeping its directory (and, with ``persist``, its data)."""
        self._halt()

    def restart(self) -> None:
        """Start it again on the same port after ``kill()``."""
        exe = shutil.which(self.executable)
        assert exe is not None and self.dir is not None
        failure = self._launch(exe)
        if failure is not None:
            raise RuntimeError(f"{exe} on port {self.port} {failure}; its output:\n{self.output()}")

    def _launch(self, exe: str) -> str | None:
        """Start the server and wait until it answers; why not, if it exits or stays silent."""
        assert self.dir is not None
        # written to a file, not a pipe, so a chatty server never blocks on a full pipe
        with open(os.path.join(self.dir, "redis.log"), "wb") as log:
            self._proc = subprocess.Popen(
                [
                    exe,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "yes" if self.appendonly else "no",
                    "--appendfsync",
                    "always" if self.persist else "no",
                    "--dir",
                    self.dir,
                    "--daemonize",
                    "no",
                    *self.args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                return f"exited with code {code} before answering PING"
            if _pings(self.port):
                return None
            time.sleep(0.02)
        self._halt()
        return f"did not answer PING within {START_TIMEOUT:.0f} s"

    def _halt(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        self._halt()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One Redis server for the whole test session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def redis_url(redis_server: RedisServer) -> AsyncIterator[str]:
    """The session's server, emptied (FLUSHALL) for this test."""
    redis_server.flush()
    yield redis_server.url
