"""The demo's data pipeline on Spark: ``python3 -m example_app.pipeline`` (the ``spark`` extra).

Two jobs against the running demo (``python3 -m example_app``), both through the ``rubris`` data
source, in ``local[2]``:

- **bars** (Structured Streaming, runs until Ctrl-C): reads the ``trades`` ring as a stream,
  computes per-symbol bars (open, high, low, close, VWAP, volume, trade count) per window
  (5 s by default) and writes each bar, updated every micro-batch while its window is open, to
  ``bars.{symbol}``, which the page draws as candles. Checkpointed: stopped and started again,
  it goes on from where it stopped (trades the ring no longer holds are skipped with a warning).
- **catalog** (a batch job, first): reads the current price of every symbol from the
  ``prices.{symbol}`` snapshots with ``spark.read``, fans a catalog out into one "reprice" job per
  symbol and book (200 jobs) on the ``reprice`` work queue, tracked as one batch; the batch is
  announced on ``pipeline.batches`` and the page shows its progress as the tabs and workers
  ACK the jobs.

The demo's API token: start the demo with ``RUBRIS_API_TOKEN=...`` and give the same here
(``--token`` or the same variable); a demo started without it makes a random one and prints the
pipeline's command with it at start-up. Before Spark starts (it takes a while), one request to
the demo's API checks the URL and the token: a refused token or no demo at the URL ends the run
at once with a line saying what to do (status 2). Ctrl-C stops the stream and Spark quietly,
says where the bars' checkpoint is, and exits with status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from .market import SYMBOLS

TRADES = "id LONG, symbol STRING, price DOUBLE, qty LONG, side STRING, ts LONG"
"""The trades' JSON fields, as the source reads them."""

BOOKS = ("spot", "1m", "3m", "1y")
"""The catalog: one reprice job per symbol and book."""

DEFAULT_URL = "http://127.0.0.1:8000/rubris"
ANNOUNCE = "pipeline.batches"
"""Where the catalog's batch is announced (and the page learns of it)."""

EXIT_REFUSED = 2
"""No token, a refused token, no demo at the URL: nothing was started."""
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT), as a shell reports a command it interrupted: 128 + 2."""


def command(token: str, url: str = DEFAULT_URL) -> str:
    """The pipeline's command line for a demo with API token `token` at `url`."""
    where = "" if url == DEFAULT_URL else f" --url {shlex.quote(url)}"
    return f"RUBRIS_API_TOKEN={shlex.quote(token)} python3 -m example_app.pipeline{where}"


# ---- the demo, checked before Spark starts ------------------------------------------------------


class DemoError(Exception):
    """The demo cannot be used: not at the URL, or it refused the token. Says what to do."""


def _get(url: str, token: str, path: str, timeout: float) -> Any:
    """``GET {url}/api{path}`` with the bearer token: the httpx answer (raises httpx errors)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=timeout, verify=url.startswith("https://")) as http:
        return http.get(f"{url}/api{path}", headers=headers)


def check_demo(url: str, token: str, *, timeout: float = 5.0) -> int:
    """One request to the demo's API with the token (the head of ``pipeline.batches``, which
    the token guards as it guards every write the pipeline makes): the head's seq, or
    ``DemoError`` saying what to do instead of a Spark job that fails after half a minute."""
    import httpx

    start = "RUBRIS_API_TOKEN=demo python3 -m example_app"
    try:
        r = _get(url, token, f"/topics/{ANNOUNCE}?after={(1 << 64) - 1}", timeout)
    except httpx.ConnectError as exc:
        raise DemoError(
            f"the demo is not running at {url} ({_reason(exc)}): start it with `{start}` and "
            "run this again with the same token, or give the URL it serves with --url (its "
            f"mount, like {DEFAULT_URL})"
        ) from None
    except httpx.HTTPError as exc:
        raise DemoError(
            f"no answer from the demo at {url} ({type(exc).__name__}: {exc}): is it running, "
            f"and is --url its mount (like {DEFAULT_URL})?"
        ) from None
    if r.status_code in (401, 403):
        raise DemoError(
            f"the demo at {url} refused the API token (HTTP {r.status_code}): start the demo "
            f"with `{start}` and run `{command('demo', url)}`, or pass the token the demo printed "
            "at start-up (--token TOKEN or RUBRIS_API_TOKEN=TOKEN)"
        )
    if r.status_code != 200:
        raise DemoError(
            f"{url} is not the demo's rubris mount (GET {ANNOUNCE}: HTTP {r.status_code}): "
            f"give the demo's with --url, like {DEFAULT_URL}"
        )
    head: int = r.json()["head"]
    return head


def _reason(exc: Exception) -> str:
    """The innermost reason of a connection error: "Connection refused" rather than a chain."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = getattr(exc, "strerror", None) or str(exc)
    return text or type(exc).__name__


def announcements(url: str, token: str, after: int, *, timeout: float = 5.0) -> list[Any]:
    """What ``pipeline.batches`` announced after seq `after`, oldest first."""
    r = _get(url, token, f"/topics/{ANNOUNCE}?after={after}", timeout)
    r.raise_for_status()
    return [m["data"] for m in r.json()["messages"]]


def spark_session(master: str = "local[2]", name: str = "rubris-demo-pipeline") -> Any:
    """A local SparkSession, UI off, few shuffle partitions, ``rubris`` registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from rubris_asgi.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # a bar a stage drowns the log
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def bars_query(
    spark: Any,
    url: str,
    token: str,
    *,
    window: str = "5 seconds",
    checkpoint: str | None = None,
    trigger: str = "0 seconds",
) -> BarsStream:
    """Start the bars stream: ``trades`` → bars per symbol and window → ``bars.{symbol}``.

    Update mode: every micro-batch writes the bars its trades changed, so a candle grows on the
    page while its window is open (through ``foreachBatch``: Spark gives a Python data source's
    streaming writes append mode only); the watermark (10 s) lets Spark drop windows that can no
    longer change. Each bar: symbol, start and end (ms), open, high, low, close, vwap, volume,
    trades, and ``last_ts``: the time of its newest trade (the bench measures latency from it).
    """
    from pyspark.sql import functions as F

    trades = (
        spark.readStream.format("rubris")
        .option("url", url)
        .option("token", token)
        .option("topic", "trades")
        .option("failOnDataLoss", "false")  # a demo restarted after a while skips what is gone
        .schema(TRADES)
        .load()
        .where(F.col("price").isNotNull() & F.col("qty").isNotNull())
        .withColumn("time", F.timestamp_millis("ts"))
    )
    bars = (
        trades.withWatermark("time", "10 seconds")
        .groupBy(F.window("time", window), "symbol")
        .agg(
            F.min_by("price", "ts").alias("open"),
            F.max("price").alias("high"),
            F.min("price").alias("low"),
            F.max_by("price", "ts").alias("close"),
            (F.sum(F.col("price") * F.col("qty")) / F.sum("qty")).alias("vwap"),
            F.sum("qty").alias("volume"),
            F.count(F.lit(1)).alias("trades"),
            F.max("ts").alias("last_ts"),
        )
        .select(
            "symbol",
            F.unix_millis(F.col("window.start")).alias("start"),
            F.unix_millis(F.col("window.end")).alias("end"),
            "open",
            "high",
            "low",
            "close",
            F.round("vwap", 4).alias("vwap"),
            "volume",
            "trades",
            "last_ts",
        )
    )
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="rubris-bars-")
    return BarsStream(bars, url, token, checkpoint=checkpoint, trigger=trigger)


class BatchStopped(Exception):
    """A micro-batch's write broken by the stream's stop (it is written again on resume)."""


class BarsStream:
    """The bars query, started; ``stop()`` stops it between two writes.

    Spark's ``query.stop()`` cancels the jobs the query runs. A micro-batch's write (through
    ``foreachBatch``, a Python function) cancelled half-way fails inside Python, and Spark, to
    tell that failure from a real one, matches its long Python traceback with a regular
    expression that overflows the stack: the query thread dies printing a
    ``StackOverflowError`` of hundreds of lines (seen on Ctrl-C). So a stop waits for the write
    in progress to end, and a write that begins while the stop is asked waits until the query
    is marked stopped before it writes: the query ends after it, nothing cancelled mid-way.
    Either way the batch's bars are written whole: none is left out of a resume. A write the
    stop breaks all the same (a batch begun in the instant before the stop, CI saw one in
    about ten Ctrl-Cs) fails in one short line (:class:`BatchStopped`): the batch is not
    committed, a resume writes it, and Spark's match has nothing long to overflow on.
    """

    STOP_WAIT_S = 30.0  # a write in progress, at most (a demo that stopped answering)

    def __init__(self, bars: Any, url: str, token: str, *, checkpoint: str, trigger: str) -> None:
        self._url = url
        self._token = token
        self._writing = threading.Lock()
        self._stopping = threading.Event()
        self.query = (
            bars.writeStream.outputMode("update")
            .foreachBatch(self._write)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger)
            .queryName("bars")
            .start()
        )

    def _write(self, changed: Any, micro_batch: int) -> None:
        try:
            self._write_batch(changed)
        except Exception:
            if not self._stopping.is_set():
                raise
            # a write the stop broke after all (a batch begun as it came): not committed, so
            # a resume writes it again. Said in one short line: Spark matches the message of a
            # failed foreachBatch (the whole Python traceback, Java's stack trace in it) with
            # a regular expression that overflows the thread's stack on a long one
            stopped = f"batch {micro_batch} stopped before its bars were written"
            raise BatchStopped(stopped) from None

    def _write_batch(self, changed: Any) -> None:
        # Spark's streaming writes to a Python data source take append mode only; update mode
        # goes through foreachBatch, each micro-batch's changed bars written as a batch
        with self._writing:
            if not self._stopping.is_set():
                self._save(changed)
                return
        # begun while the stop was asked: once the query is marked stopped its jobs are no
        # longer cancelled, and it ends when this returns
        deadline = time.monotonic() + self.STOP_WAIT_S
        while self.query.isActive and time.monotonic() < deadline:
            time.sleep(0.05)
        self._save(changed)

    def _save(self, changed: Any) -> None:
        (
            changed.write.format("rubris")
            .option("url", self._url)
            .option("token", self._token)
            .option("topic", "bars.{symbol}")
            .mode("append")
            .save()
        )

    def stop(self) -> None:
        self._stopping.set()
        if self._writing.acquire(timeout=self.STOP_WAIT_S):  # the write in progress ends first
            self._writing.release()
        self.query.stop()

    # What the callers read of the query (tests, bench/spark.py), as Spark's StreamingQuery has it
    @property
    def isActive(self) -> bool:  # noqa: N802 (StreamingQuery's name)
        return bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.query.status)

    @property
    def lastProgress(self) -> dict[str, Any] | None:  # noqa: N802
        return self.query.lastProgress  # type: ignore[no-any-return]

    @property
    def recentProgress(self) -> list[Any]:  # noqa: N802
        return list(self.query.recentProgress)

    def exception(self) -> Any:
        return self.query.exception()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        return self.query.awaitTermination(timeout)  # type: ignore[no-any-return]


def catalog_job(spark: Any, url: str, token: str, *, run: str | None = None) -> str:
    """Fan the catalog out into "reprice" jobs, tracked as one batch announced on
    ``pipeline.batches``; returns when the write is done (the jobs are worked after), with the
    run's id.

    Each job's idempotency key is ``catalog-{run}:{symbol}:{book}``: the same for a retried
    task (which so enqueues nothing twice), new for each run (`run`, random by default). The
    server remembers keys for its dedup window (10 minutes): with keys that were the same on
    every run (the job numbers, as they once were), a second run within it enqueued nothing,
    and its batch, sealed with no item, showed "0/0 done".
    """
    from pyspark.sql import functions as F

    run = run or uuid.uuid4().hex[:12]

    prices = (
        spark.read.format("rubris")
        .option("url", url)
        .option("token", token)
        .option("topics", ",".join(f"prices.{s}" for s in SYMBOLS))
        .schema("symbol STRING, last DOUBLE")
        .load()
        .coalesce(2)  # one task a topic otherwise: 50 tiny tasks holding both cores
        .groupBy("symbol")
        .agg(F.last("last").alias("last"))
    )
    catalog = spark.createDataFrame(
        [(s, book) for s in SYMBOLS for book in BOOKS], "symbol STRING, book STRING"
    )
    jobs = (
        catalog.join(prices, "symbol", "left")
        .withColumn("job", 1_000_000 + F.monotonically_increasing_id())
        .withColumn("key", F.concat_ws(":", F.lit(f"catalog-{run}"), "symbol", "book"))
        .select("key", "job", "symbol", "book", F.coalesce("last", F.lit(100.0)).alias("last"))
        .repartition(2)
    )
    (
        jobs.write.format("rubris")
        .option("url", url)
        .option("token", token)
        .option("mode", "enqueue")
        .option("topic", "reprice")
        .option("idColumn", "key")
        .option("columns", "job,symbol,book,last")  # the job; its key is not in it
        .option("track", "true")
        .option("announce", ANNOUNCE)
        .mode("append")
        .save()
    )
    return run


class Stopper:
    """Ctrl-C (SIGINT) asks for a stop instead of raising ``KeyboardInterrupt`` wherever the
    main thread is: inside a py4j call, that is what printed screens of tracebacks (PySpark's
    own handler cancels the jobs, then raises there). The main thread never blocks long in a
    Spark call (``run`` waits for one in another thread, the stream is awaited half a second at
    a time), so the request is seen at once. A second Ctrl-C while stopping exits at once."""

    def __init__(self) -> None:
        self.requested = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        if self.requested.is_set():
            os._exit(EXIT_INTERRUPTED)
        self.requested.set()

    def run(self, spark: Any, fn: Callable[[], object]) -> None:
        """``fn()``, a Spark job, in a thread of its own; its exception raised here. On a stop
        request its jobs are cancelled and it is given a while to end."""
        failure: list[BaseException] = []

        def job() -> None:
            # a new JVM thread has no active session: the rubris data source would be unknown
            spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
            try:
                fn()
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=job, name="spark-job", daemon=True)
        thread.start()
        while thread.is_alive() and not self.requested.is_set():
            thread.join(0.25)
        for _ in range(4):  # stopping: cancel what it runs (Spark's stop ends the rest)
            if not thread.is_alive():
                break
            with contextlib.suppress(Exception):
                spark.sparkContext.cancelAllJobs()
            thread.join(0.5)
        if failure:
            raise failure[0]


class SparkOutput:
    """What Spark and the processes it starts print, relayed to this process's stderr until
    the pipeline stops, then dropped.

    The JVM is started with this process's stderr, and the Python workers Spark starts (the
    ``trades`` stream's reader among them) print through it. Stopping the stream and Spark
    breaks their connections, and a worker whose socket is reset as it waits prints a
    traceback of its own (CI saw one in about ten Ctrl-Cs) that no log level reaches. So the
    JVM gets a pipe for its stderr instead, read by a thread that copies it here while the
    pipeline runs (Spark's warnings stay visible) and drops it once the stop begins. The pipe
    is drained to the end either way: a full pipe would block the JVM's writes."""

    def __init__(self) -> None:
        self._quiet = threading.Event()
        self._read, self._write = os.pipe()
        self._out = os.dup(2)  # where this process's stderr was: the relay's destination
        threading.Thread(target=self._relay, name="spark-output", daemon=True).start()

    @contextlib.contextmanager
    def given(self) -> Iterator[None]:
        """Meanwhile, fd 2 is the pipe: a process started now (the JVM) keeps it as its
        stderr; this process's own writes meanwhile are relayed as well."""
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(self._write, 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            os.close(self._write)  # the JVM holds its own copy

    def quiet(self) -> None:
        self._quiet.set()

    def _relay(self) -> None:
        while chunk := os.read(self._read, 65536):
            if not self._quiet.is_set():
                with contextlib.suppress(OSError):
                    os.write(self._out, chunk)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile: a Ctrl-C is delivered when the block ends, to
    the handler then in place (the threads started meanwhile, py4j's, keep it blocked)."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _cause(exc: BaseException) -> str:
    """One line of a Spark failure: the rubris error in it (a refusal, an unreachable server),
    else its first line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith(("rubris_asgi.", "SinkError", "SourceError", "DataLossError")):
            return line
    return lines[0] if lines else type(exc).__name__


def _quiet_stop(spark: Any, query: Any) -> None:
    """Stop the stream, then Spark, saying nothing: what breaks as they stop is expected."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    logging.getLogger("rubris_asgi").setLevel(logging.CRITICAL)
    if spark is not None:
        # PySpark's accumulator server reads until Spark closes its connection; a close that
        # comes before the server is shut down is an EOFError its thread prints as a traceback
        server = getattr(spark.sparkContext, "_accumulatorServer", None)
        if server is not None:
            server.handle_error = lambda _request, _address: None
    if spark is not None:
        # what the stop breaks in Spark's own threads is logged at ERROR: we are quitting
        with contextlib.suppress(Exception):
            spark.sparkContext.setLogLevel("OFF")
    if query is not None:
        try:
            query.stop()
        except Exception:  # already stopped or failed; Spark stops below all the same
            pass
    if spark is not None:
        try:
            spark.stop()
        except Exception:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the demo's Spark pipeline: bars and a catalog")
    ap.add_argument("--url", default=DEFAULT_URL, help="the demo's rubris mount")
    ap.add_argument(
        "--token",
        default=os.environ.get("RUBRIS_API_TOKEN"),
        help="the demo's API token (default: RUBRIS_API_TOKEN)",
    )
    ap.add_argument("--window", default="5 seconds", help="the bars' window, e.g. '1 second'")
    ap.add_argument("--checkpoint", default=None, help="the bars' checkpoint directory")
    ap.add_argument("--no-catalog", action="store_true", help="only the bars stream")
    args = ap.parse_args(argv)
    url = args.url.rstrip("/")
    if not args.token:
        print(
            "pipeline: no API token: start the demo with `RUBRIS_API_TOKEN=demo python3 -m "
            f"example_app` and run `{command('demo', url)}`, or pass the token the demo printed "
            "at start-up (--token TOKEN or RUBRIS_API_TOKEN=TOKEN)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    try:
        head = check_demo(url, args.token)
    except DemoError as exc:
        print(f"pipeline: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per callback otherwise
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="rubris-bars-")
    stopper = Stopper()
    stopper.install()
    output = SparkOutput()
    spark = query = None
    phase = "Spark"
    try:
        with _sigint_held(), output.given():  # PySpark puts its own SIGINT handler in place
            spark = spark_session()
            stopper.install()
        if not args.no_catalog and not stopper.requested.is_set():
            # first: on two cores its tasks would hold up the stream's
            phase = "the catalog job"
            stopper.run(spark, lambda: catalog_job(spark, url, args.token))
            if not stopper.requested.is_set():
                print(catalog_report(url, args.token, head))
        if not stopper.requested.is_set():
            phase = "the bars stream"
            query = bars_query(spark, url, args.token, window=args.window, checkpoint=checkpoint)
            print(f"bars: {args.window} windows of 'trades' -> 'bars.{{symbol}}' (Ctrl-C to stop)")
            while not stopper.requested.is_set() and not query.awaitTermination(0.5):
                pass
    except KeyboardInterrupt:  # a Ctrl-C before the handler was in place
        stopper.requested.set()
    except Exception as exc:
        if not stopper.requested.is_set():  # else: what the stop broke
            output.quiet()
            _quiet_stop(spark, query)
            print(f"pipeline: {phase} failed: {_cause(exc)}", file=sys.stderr)
            return EXIT_FAILED
    output.quiet()
    _quiet_stop(spark, query)
    if not stopper.requested.is_set():  # the query ended without an error and without Ctrl-C
        return 0
    again = f"run again with --checkpoint {shlex.quote(checkpoint)} to go on from there"
    print(f"stopped; the bars' checkpoint is at {checkpoint}: {again}", flush=True)
    return EXIT_INTERRUPTED


def catalog_report(url: str, token: str, head: int, *, wait: float = 3.0) -> str:
    """What the catalog's write did, as its batch's announcement on ``pipeline.batches`` (after
    seq `head`) says: the jobs the batch tracks are the ones really enqueued (a duplicate id
    adds none). The announcement goes through the server's intake: it is waited for a moment."""
    rows = len(SYMBOLS) * len(BOOKS)
    deadline = time.monotonic() + wait
    while True:
        try:
            sealed = [a for a in announcements(url, token, head) if "rows" in a]
        except Exception as exc:  # the report only: the write was done
            return f"catalog: {rows} rows written (its batch's announcement unread: {exc})"
        if sealed:
            break
        if time.monotonic() > deadline:
            return f"catalog: {rows} rows written; no batch of it announced on {ANNOUNCE}"
        time.sleep(0.05)
    a = sealed[-1]
    line = f"catalog: {a['total']} reprice jobs enqueued as batch {a['batch']} ({ANNOUNCE})"
    if a["total"] != a["rows"]:
        line += f"; {a['rows'] - a['total']} of its {a['rows']} rows were already enqueued"
    return line


if __name__ == "__main__":
    sys.exit(main())
