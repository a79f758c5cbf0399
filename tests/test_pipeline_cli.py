"""``python3 -m example_app.pipeline`` as a first-time user runs it, against the demo started as
a subprocess (``python3 -m example_app``, as the README says).

- The demo prints the pipeline's command with its own API token (random unless
  ``RUBRIS_API_TOKEN`` is set), and that token is the one the pipeline's check accepts.
- A refused token, no token, or no demo at the URL: the pipeline says in one line what to do
  and exits with status 2 at once, before Spark starts (it once failed after half a minute with
  a Spark traceback whose cause, a 401, was on its last line).
- Ctrl-C (SIGINT to the process group, as a terminal sends it) on a running pipeline: it stops
  the stream and Spark quietly, says where the bars' checkpoint is, and exits with 130.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from example_app.cluster import new_token
from example_app.market import SYMBOLS
from example_app.pipeline import BarsStream, BatchStopped, DemoError, check_demo, command

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "cli-test-token"
START_S = 20.0  # the demo's start, at most
REFUSED_S = 15.0  # a run refused before Spark: Python's start and one request (a loaded box)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_without_token(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RUBRIS_API_TOKEN"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@contextlib.contextmanager
def demo(log: Path, token: str | None) -> Iterator[str]:
    """``python3 -m example_app --port P`` (``RUBRIS_API_TOKEN=token`` unless None): its URL."""
    port = free_port()
    env = env_without_token(**({} if token is None else {"RUBRIS_API_TOKEN": token}))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "example_app", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, f"the demo exited:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"the demo did not start:\n{log.read_text()}"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def run_pipeline(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "example_app.pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, time.monotonic() - began


def assert_refused_at_once(done: subprocess.CompletedProcess[str], took: float) -> str:
    """Status 2, within REFUSED_S, nothing on stdout, one line on stderr (returned)."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert took < REFUSED_S, f"{took:.1f} s: was Spark started?\n{done.stderr}"
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeline: "), done.stderr
    return lines[0]


def test_the_demo_prints_the_command_with_its_token_and_a_wrong_one_ends_at_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "demo.log"
    with demo(log, token=None) as url:  # the README's first command: a random token
        mount = f"{url}/rubris"
        printed = log.read_text()
        found = re.search(
            r"^  RUBRIS_API_TOKEN=(\S+) python3 -m example_app\.pipeline --url (\S+)$",
            printed,
            re.M,
        )
        assert found, printed
        token, printed_url = found.groups()
        assert printed_url == mount
        assert found.group(0).strip() == command(token, mount)
        assert token != "demo" and len(token) >= 16
        assert check_demo(mount, token) == 0  # the printed token is the one the demo takes

        # The README's pipeline command against this demo: refused at once, saying what to do.
        done, took = run_pipeline("--url", mount, env=env_without_token(RUBRIS_API_TOKEN="demo"))
        line = assert_refused_at_once(done, took)
        assert line == (
            f"pipeline: the demo at {mount} refused the API token (HTTP 401): start the demo "
            "with `RUBRIS_API_TOKEN=demo python3 -m example_app` and run "
            f"`RUBRIS_API_TOKEN=demo python3 -m example_app.pipeline --url {mount}`, or pass "
            "the token the demo printed at start-up (--token TOKEN or RUBRIS_API_TOKEN=TOKEN)"
        )
        with pytest.raises(DemoError, match=r"refused the API token \(HTTP 401\)"):
            check_demo(mount, "wrong")

        # No token at all: the same advice, without a request.
        done, took = run_pipeline("--url", mount, env=env_without_token())
        line = assert_refused_at_once(done, took)
        assert line.startswith("pipeline: no API token: start the demo with "), line
        assert "--token TOKEN or RUBRIS_API_TOKEN=TOKEN" in line, line

        # Not the demo's mount: a 404, said so.
        with pytest.raises(DemoError, match=r"is not the demo's rubris mount .*HTTP 404"):
            check_demo(f"{url}/elsewhere", token)

    # The demo stopped: nothing listens at the URL.
    done, took = run_pipeline("--url", mount, "--token", token, env=env_without_token())
    line = assert_refused_at_once(done, took)
    assert line == (
        f"pipeline: the demo is not running at {mount} (Connection refused): start it with "
        "`RUBRIS_API_TOKEN=demo python3 -m example_app` and run this again with the same "
        "token, or give the URL it serves with --url (its mount, like "
        "http://127.0.0.1:8000/rubris)"
    )


def test_the_demo_started_with_a_token_prints_that_token(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    with demo(log, token="demo") as url:
        expected = f"  RUBRIS_API_TOKEN=demo python3 -m example_app.pipeline --url {url}/rubris"
        assert expected in log.read_text().splitlines()
    assert command("demo") == "RUBRIS_API_TOKEN=demo python3 -m example_app.pipeline"
    assert command("a b", "http://h:1/rubris") == (
        "RUBRIS_API_TOKEN='a b' python3 -m example_app.pipeline --url http://h:1/rubris"
    )


def bars_written(url: str) -> int:
    """Bars the pipeline has written to the demo, over every symbol's ``bars.{symbol}``."""
    total = 0
    with httpx.Client(timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for symbol in SYMBOLS:
            r = http.get(f"{url}/rubris/api/topics/bars.{symbol}?after=0&limit=1")
            r.raise_for_status()
            total += r.json()["head"]
    return total


@pytest.mark.spark
@pytest.mark.timeout(240)  # a JVM of its own and the stream's first micro-batches
def test_ctrl_c_stops_the_running_pipeline_quietly(tmp_path: Path) -> None:
    """The bars stream alone (``--no-catalog``: the catalog as ``main`` runs it, in a thread
    and reported, is test_browser_pipeline.py's, on the session's SparkSession)."""
    checkpoint = tmp_path / "bars-checkpoint"
    out_path = tmp_path / "pipeline.log"
    with demo(tmp_path / "demo.log", token=TOKEN) as url, out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "example_app.pipeline", "--url", f"{url}/rubris"]
            + ["--window", "1 second", "--checkpoint", str(checkpoint), "--no-catalog"],
            cwd=ROOT,
            env=env_without_token(RUBRIS_API_TOKEN=TOKEN),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, which a terminal's Ctrl-C hits
        )
        try:
            # Running: the stream started and writing bars.
            deadline = time.monotonic() + 180
            while "bars: " not in out_path.read_text() or not bars_written(url):
                assert proc.poll() is None, f"the pipeline exited:\n{out_path.read_text()}"
                assert time.monotonic() < deadline, f"no bars:\n{out_path.read_text()}"
                time.sleep(0.5)
            before = out_path.read_text()
            assert "catalog: " not in before, before

            os.killpg(proc.pid, signal.SIGINT)
            sent = time.monotonic()
            status = proc.wait(30)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    text = out_path.read_text()
    after = text[len(before) :].splitlines()
    assert status == 130, (status, text[-3000:])
    assert took < 15, f"{took:.1f} s to stop"
    assert "Traceback" not in text, text[-5000:]
    assert len(after) < 5, after
    assert after[-1] == (
        f"stopped; the bars' checkpoint is at {checkpoint}: run again with --checkpoint "
        f"{checkpoint} to go on from there"
    ), after
    assert sorted(p.name for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def test_a_made_up_token_is_never_read_as_an_option() -> None:
    """A demo's random token goes on a command line (``--token TOKEN``): it never starts with
    ``-`` (a URL-safe token did one time in 64, and argparse then took it for an option)."""
    tokens = {new_token() for _ in range(2000)}
    assert len(tokens) == 2000
    assert all(re.fullmatch(r"[0-9a-f]{32}", token) for token in tokens)


def test_a_write_the_stop_breaks_fails_in_one_short_line() -> None:
    """What a stop breaks reaches Spark as one short line, never the long traceback whose
    match overflowed Spark's stack on Ctrl-C; any other failure is the real error."""
    import threading

    stream = BarsStream.__new__(BarsStream)
    stream._stopping = threading.Event()
    stream._writing = threading.Lock()
    java = "py4j.protocol.Py4JJavaError: An error occurred\n" + "\tat org.apache.spark.X\n" * 500

    def broken(_changed: object) -> None:
        raise RuntimeError(java)

    stream._write_batch = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="Py4JJavaError"):
        stream._write(None, 7)  # not stopping: the failure as it is
    stream._stopping.set()
    with pytest.raises(BatchStopped) as stopped:
        stream._write(None, 7)
    assert str(stopped.value) == "batch 7 stopped before its bars were written"
    assert stopped.value.__suppress_context__  # no chained traceback in what Spark reads


SPARK_OUTPUT_SCRIPT = r"""
import subprocess, sys
from example_app.pipeline import SparkOutput

output = SparkOutput()
child = (
    "import sys; print('spark warns', file=sys.stderr, flush=True); input(); "
    "print('worker traceback', file=sys.stderr, flush=True)"
)
with output.given():  # as the JVM is started
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, text=True)
input()  # the test has seen the warning: the stop begins
output.quiet()
proc.communicate("\n")
print("pipeline: own line", file=sys.stderr, flush=True)
"""


def test_what_spark_prints_is_relayed_until_the_stop_then_dropped() -> None:
    """The JVM's stderr (and its workers') is a pipe relayed to the pipeline's stderr while it
    runs; what they print once the stop began (a worker's traceback as its socket is reset)
    is dropped, and the pipeline's own lines still reach its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SPARK_OUTPUT_SCRIPT],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stderr is not None
    try:
        assert proc.stderr.readline() == "spark warns\n"  # relayed while running
        proc.stdin.write("\n")
        proc.stdin.close()
        rest = proc.stderr.read()
        assert proc.wait(30) == 0, rest
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert rest == "pipeline: own line\n"
