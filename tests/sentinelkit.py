"""A Redis that fails over: a master, a replica and three Sentinels, all real, on 127.0.0.1.

``SentinelSet`` starts a master (append-only file), replicas of it, and three ``redis-sentinel``
processes watching it as ``mymaster`` (quorum 2, a master unanswered for 1 s is down, so a
failover takes a few seconds); ``url`` is the ``redis+sentinel://`` URL a node is given.
``crash_master()`` kills the master with SIGKILL; ``wait_failover()`` waits until the Sentinels
name the replica as the master. Everything is stopped on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from types import TracebackType

import redis as redis_sync

from .rediskit import START_TIMEOUT, RedisServer, _command, _free_port, _pings

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000


class SentinelSet:
    def __init__(self, sentinels: int = 3, replicas: int = 1) -> None:
        self.master = RedisServer()
        self.replicas: list[RedisServer] = []
        self.count = sentinels
        self.replica_count = replicas
        self.ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self.dir = ""

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        exe = shutil.which("redis-sentinel")
        if exe is None:
            raise RuntimeError(
                "redis-sentinel not found on PATH: the failover tests need it "
                "(apt-get install redis-sentinel)"
            )
        self.master.start()
        for _ in range(self.replica_count):
            replica = RedisServer(args=("--replicaof", "127.0.0.1", str(self.master.port)))
            self.replicas.append(replica)
            replica.start()
            self._until_replicating(replica)
        self.dir = tempfile.mkdtemp(prefix="rubris-sentinel-")
        for i in range(self.count):
            port = _free_port()
            conf = os.path.join(self.dir, f"sentinel-{i}.conf")
            with open(conf, "w") as f:  # Sentinel rewrites its file: one each, writable
                f.write(
                    f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SERVICE} 10000\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
            log = open(os.path.join(self.dir, f"sentinel-{i}.log"), "wb")  # noqa: SIM115
            with log:
                self._procs.append(
                    subprocess.Popen([exe, conf], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
                )
            self.ports.append(port)
        deadline = time.monotonic() + START_TIMEOUT
        while not all(_pings(p) for p in self.ports):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinels did not answer:\n{self.output()}")
            time.sleep(0.05)
        # each Sentinel must know the others (their hello messages, every 2 s) to elect a leader
        deadline = time.monotonic() + 20
        while not self._sentinels_know_each_other():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinels did not find each other:\n{self.output()}")
            time.sleep(0.2)

    @property
    def replica(self) -> RedisServer:
        """The first replica."""
        return self.replicas[0]

    def _until_replicating(self, replica: RedisServer) -> None:
        r = redis_sync.Redis(port=replica.port, socket_timeout=5)
        try:
            deadline = time.monotonic() + 20
            while r.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not catch up with its master")
                time.sleep(0.05)
        finally:
            r.close()

    def _sentinels_know_each_other(self) -> bool:
        for port in self.ports:
            r = redis_sync.Redis(port=port, socket_timeout=2)
            try:
                if len(r.sentinel_sentinels(SERVICE)) < self.count - 1:
                    return False
            finally:
                r.close()
        return True

    def master_port(self) -> int:
        """The port of the master the Sentinels name now."""
        r = redis_sync.Redis(port=self.ports[0], socket_timeout=2)
        try:
            host, port = r.sentinel_get_master_addr_by_name(SERVICE)
            return int(port)
        finally:
            r.close()

    def crash_master(self) -> None:
        """SIGKILL the master: no goodbye, no last write to its file."""
        proc = self.master._proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.master._proc = None

    def wait_failover(self, timeout: float = 30.0) -> float:
        """Seconds until the Sentinels name a replica as the master (and it takes writes)."""
        began = time.monotonic()
        ports = {r.port for r in self.replicas}
        while time.monotonic() - began < timeout:
            port = self.master_port()
            if port in ports and b"master" in _command(port, "ROLE", 2.0):
                return time.monotonic() - began
            time.sleep(0.05)
        raise AssertionError(f"no failover within {timeout} s:\n{self.output()}")

    def output(self) -> str:
        out = []
        for i in range(len(self.ports)):
            path = os.path.join(self.dir, f"sentinel-{i}.log")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    out.append(f.read().decode(errors="replace")[-2000:])
        return "\n".join(out)

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs = []
        for replica in self.replicas:
            replica.stop()
        self.master.stop()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelSet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
