"""A free port on 127.0.0.1, and stopping a server process, for tests that start one."""

from __future__ import annotations

import asyncio
import signal
import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stop_process(proc: asyncio.subprocess.Process, timeout: float = 20) -> None:
    """SIGTERM (a server drains on it), then SIGKILL if it is still there after ``timeout``."""
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
