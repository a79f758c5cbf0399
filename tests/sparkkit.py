"""One local SparkSession for the whole test run, tuned for speed, with ``rubris`` registered.

``local[2,3]``: two cores, and up to three attempts per task (local mode retries nothing by
default), so a test can fail a task's first attempt and watch the retry.

One session (a session-scoped fixture): a JVM's start and the first job's warm-up (Spark's
Python workers, its code generation) take 20-40 s on two cores, paid once by whichever test
uses Spark first; every test after it finds the session warm.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from rubris_asgi.spark import register

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("rubris-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.ui.showConsoleProgress", "false")  # a bar a stage in every test's log
        # the JIT's first tier only: short jobs, each plan run a few times, on two cores that
        # the tests share with servers and Chromium; the C2 compiler's work never pays back
        # (tests/test_spark_*.py: 117 s instead of 126-133 s)
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


async def blocking(spark: Any, fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking Spark call in a thread, the server's event loop going on meanwhile.

    PySpark pins each Python thread to a JVM thread of its own, and a new JVM thread has no
    active session: a Python data source registered on ``spark`` would not be found there
    (DATA_SOURCE_NOT_FOUND) unless the thread makes ``spark`` its active session first.
    """

    def run() -> T:
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        return fn(*args)

    return await asyncio.to_thread(run)
