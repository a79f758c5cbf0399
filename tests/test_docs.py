"""The docs' runnable example runs and says what the guide says it does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str, timeout: float = 60) -> str:
    """Run docs/examples/<name>.py as a reader would; its standard output."""
    return run_example_fully(name, timeout).stdout


def run_example_fully(name: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run docs/examples/<name>.py as a reader would; its output on both streams."""
    path = ROOT / "docs" / "examples" / f"{name}.py"
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, check=True
    )


@pytest.mark.slow
def test_quickstart_runs() -> None:
    out = run_example("quickstart")
    for transport in ("websocket", "longpoll"):
        assert f"[{transport}] refused: code 10, unknown symbol 'NOPE'" in out
        assert f"[{transport}] order: {{'status': 'accepted'}}" in out
        assert f"[{transport}] fill: {{'symbol': 'AAPL', 'qty': 5}}" in out
        assert f"[{transport}] stream: [3, 2, 1]" in out


@pytest.mark.slow
def test_publishing_example_runs() -> None:
    out = run_example("publishing")
    assert "HTTP answer: 200 {'accepted': 1, 'duplicates': 0, 'fill': 0} Rubris-Fill: 0" in out
    assert "Publisher sent 3 in 1 request(s)" in out
    assert "trades.AAPL #1: {'px': 189.1, 'via': 'HTTP'}" in out
    assert "trades.AAPL #4: {'px': 191.2, 'via': 'Publisher'}" in out
    assert "trades.MSFT #3: {'px': 412, 'via': 'SyncPublisher'}" in out


@pytest.mark.slow
def test_queues_example_runs() -> None:
    run = run_example_fully("queues")
    out = run.stdout
    # its deliberate failures say so in one line each, not in a traceback a reader takes for a
    # crash of the example
    assert "Traceback" not in out + run.stderr, run.stderr
    failures = [line for line in out.splitlines() if "corrupt.png failed on attempt" in line]
    assert [line.split(" on attempt ")[1][0] for line in failures] == ["1", "2", "3"], out
    assert all(line.endswith("(cannot decode corrupt.png): NACKed") for line in failures), out
    assert "HTTP answer: 200 {'accepted': 11, 'duplicates': 1, 'fill': 0}" in out
    assert "dead letter: {'image': 'corrupt.png'} on attempt 4" in out
    assert "done 20 jobs, each once: True" in out
    assert "enqueued 21, duplicates 1, acked 20, nacked 3, dead-lettered 1" in out


@pytest.mark.slow
def test_batches_example_runs() -> None:
    out = run_example("batches")
    assert "enqueued: {'accepted': 20, 'duplicates': 0, 'fill': 0}" in out
    assert "sealed: {'state': 'sealed', 'total': 20, 'done': 0, 'failed': 0" in out
    final = "{'state': 'complete', 'total': 20, 'done': 19, 'failed': 1, 'completed': True}"
    assert f"final: {final}" in out
    assert "status: {'state': 'complete', 'total': 20, 'done': 19, 'failed': 1" in out
    # a complete batch is never printed as not completed (the status' "completed" flag is
    # True only in the answer that completed it: the example leaves it out of later ones)
    assert "status: {'state': 'complete', 'total': 20, 'done': 19, 'failed': 1}\n" in out
    for line in out.splitlines():
        assert not ("'complete'" in line and "'completed': False" in line), line


@pytest.mark.spark
def test_spark_example_runs() -> None:
    out = run_example("spark", timeout=110)  # a SparkSession of its own: about 20 s alone
    done = "{'state': 'complete', 'total': 20, 'done': 20, 'failed': 0, 'completed': True}"
    assert f"worked 20 jobs; batch: {done}" in out
    assert """read: [(1, '{"px":189.0,"qty":100}'), (2, '{"px":189.01,"qty":101}')]""" in out
    assert "micro-batch 0: [(1, 189.0, 100), (2, 189.01, 101), (3, 189.02, 102)," in out
    assert "micro-batch 1: [(6, 190.0, 7)]" in out


@pytest.mark.slow
def test_metrics_example_runs() -> None:
    out = run_example("metrics")
    assert "rubris_sessions {'state': 'connected', 'transport': 'websocket'} 1" in out
    assert "rubris_published_messages_total {} 5" in out
    assert "rubris_publish_to_frame_seconds_count {} 5" in out
    assert "ops/stats without the token: 401" in out
    assert "ops/stats: this worker True {'connected': 1, 'detached': 0, 'closing': 0}" in out


@pytest.mark.slow
def test_tables_example_runs_and_prints_what_the_guide_shows() -> None:
    out = run_example("tables")
    guide = (ROOT / "docs" / "guide.md").read_text()
    shown = guide.split("(`python3 docs/examples/tables.py`). It prints:\n\n```\n", 1)[1]
    assert out == shown.split("```", 1)[0]
