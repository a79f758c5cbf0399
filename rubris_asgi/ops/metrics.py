"""Prometheus metrics (``pip install 'rubris-asgi[metrics]'``): a collector read at scrape time.

Nothing is counted for Prometheus as it happens: the collector turns each worker's snapshot
(observer.py) into metric families when a scrape arrives, so the hot path pays nothing, and
with several workers (workers.py) any one of them answers for all, each series labelled with
its ``worker`` (``host:pid``). docs/operations.md, "Metrics", lists every metric.

>>> from starlette.applications import Starlette
>>> from starlette.routing import Mount, Route
>>> from rubris_asgi import Rubris
>>> from rubris_asgi.metrics import Metrics
>>> rubris = Rubris()
>>> app = Starlette(
...     routes=[Route("/metrics", Metrics(rubris)), Mount("/rubris", rubris)],
...     lifespan=rubris.lifespan,
... )
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from .workers import WorkerBoard

Snapshot = dict[str, Any]


class Reported(Protocol):
    """What the endpoint reads of a ``Rubris``: the board of its workers' snapshots."""

    @property
    def board(self) -> WorkerBoard: ...


# (name, help): one plain counter each, rubris_{name}_total from the snapshot's counters[name]
_COUNTERS = (
    ("sessions_opened", "Sessions opened (a resume is not a new session)."),
    ("sessions_resumed", "Sessions resumed by a new connection."),
    ("topics_retired", "Shared topics forgotten because nobody needed them any more."),
    ("published_messages", "Messages published to shared topics."),
    ("messages_delivered", "Messages put into frames, of every kind."),
    ("frames", "Frames handed to transports."),
    ("cycles", "Scheduler cycles run."),
    ("sent_bytes", "Bytes of frames handed to transports (after compression)."),
    ("compression_saved_bytes", "Bytes not sent thanks to compressions that were kept."),
    ("gaps", "GAP messages: ring subscribers lapped by their topic."),
    ("deferred_messages", "Messages that did not fit a full frame and waited for the next cycle."),
    ("pool_exhausted", "Frames not started because their size class had no lease free."),
    ("pool_shared", "Frames sharing the lease of the same bytes written to another session."),
    ("pool_refused", "Messages refused as larger than the largest frame."),
    ("blocked_writes", "Frames the socket could not take at once."),
    ("failed_sends", "Blocked writes that took longer than blocked_after (each earns a penalty)."),
    ("penalty_seconds", "Seconds of penalty given to slow writers."),
    ("naks_received", "NAK messages received from clients."),
    ("flow_sent", "FLOW messages sent to publishing sessions."),
    ("intake_accepted", "Messages taken into the intake."),
    ("intake_refused", "Messages refused because the intake was full."),
    ("intake_conflated", "Snapshot values replaced in the intake before they reached their topic."),
)

_GAUGES = (
    ("intake_fill_ratio", "How full the intake is, 0 to 1 (the larger of count and bytes)."),
    ("intake_messages", "Messages waiting in the intake."),
    ("intake_bytes", "Payload bytes waiting in the intake."),
    ("sessions_paced", "Sessions paced by their NAKs now."),
    ("sessions_penalised", "Sessions held back by a slow-writer penalty now."),
    ("writes_blocked", "Sessions with a frame stuck in their socket now."),
)

_QUEUE_COUNTERS = (
    ("enqueued", "Items enqueued."),
    ("delivered", "Item deliveries (ITEM messages)."),
    ("acked", "Items acknowledged."),
    ("nacked", "Items negatively acknowledged."),
    ("redelivered", "Items given back to the head (NACK with requeue, lost consumer)."),
    ("revoked", "Deliveries taken back by server-side CoDel (REVOKE)."),
    ("late_acked", "Revoked items whose ACK came before they were delivered again (settled)."),
    ("flows", "FLOW messages sent to the queue's PUBLISH producers (its fill)."),
    ("dead_lettered", "Items past the delivery limit or NACKed without requeue."),
    ("dropped", "Dead-lettered items with nowhere to go."),
    ("duplicates", "Items refused as duplicates of an id seen in the dedup window."),
)

_QUEUE_GAUGES = (
    ("depth", "waiting", "Items waiting in the queue."),
    ("unacked", "outstanding", "Items delivered and not yet acknowledged."),
    ("consumers", "consumers", "Consumers subscribed."),
)


def families(snapshots: Iterable[Snapshot]) -> Iterator[Metric]:
    """The metric families of some workers' snapshots, each sample labelled ``worker``."""
    snaps = list(snapshots)
    w = "worker"

    info = GaugeMetricFamily(
        "rubris_worker_info",
        "A worker serving rubris (always 1).",
        labels=[w, "host", "pid", "version"],
    )
    for s in snaps:
        info.add_metric([s["worker"], s["host"], str(s["pid"]), s["version"]], 1)
    yield info

    g = GaugeMetricFamily(
        "rubris_sessions", "Sessions by transport and state.", labels=[w, "transport", "state"]
    )
    for s in snaps:
        for transport, states in s["sessions"].items():
            for state, n in states.items():
                g.add_metric([s["worker"], transport, state], n)
    yield g

    for name, key, doc in (
        ("rubris_subscriptions", "subscriptions", "Subscriptions by kind of topic."),
        ("rubris_topics", "topics", "Topics alive by kind."),
    ):
        g = GaugeMetricFamily(name, doc, labels=[w, "kind"])
        for s in snaps:
            for kind, n in s[key].items():
                g.add_metric([s["worker"], kind], n)
        yield g

    for name, doc in _GAUGES:
        g = GaugeMetricFamily(f"rubris_{name}", doc, labels=[w])
        for s in snaps:
            g.add_metric([s["worker"]], s["gauges"][name])
        yield g

    for name, doc in _COUNTERS:
        c = CounterMetricFamily(f"rubris_{name}", doc, labels=[w])
        for s in snaps:
            c.add_metric([s["worker"]], s["counters"][name])
        yield c

    c = CounterMetricFamily(
        "rubris_compressions",
        "Payloads deflated, by whether the result was kept (at most half the size).",
        labels=[w, "result"],
    )
    for s in snaps:
        c.add_metric([s["worker"], "kept"], s["counters"]["compressions_kept"])
        c.add_metric([s["worker"], "discarded"], s["counters"]["compressions_discarded"])
    yield c

    c = CounterMetricFamily(
        "rubris_slow_consumer_closes",
        "Sessions ended as slow consumers (GOODBYE 7), by why.",
        labels=[w, "reason"],
    )
    for s in snaps:
        c.add_metric([s["worker"], "blocked"], s["counters"]["slow_consumer_closes_blocked"])
        c.add_metric([s["worker"], "backlog"], s["counters"]["slow_consumer_closes_backlog"])
    yield c

    in_use = GaugeMetricFamily(
        "rubris_pool_leases_in_use", "Writer-pool leases held now.", labels=[w, "size_class"]
    )
    limit = GaugeMetricFamily(
        "rubris_pool_leases_limit", "Writer-pool leases there are.", labels=[w, "size_class"]
    )
    taken = CounterMetricFamily(
        "rubris_pool_leases",
        "Frames started by writer-pool size class (a lease each if its write must wait).",
        labels=[w, "size_class"],
    )
    for s in snaps:
        for size_class, p in s["pool"].items():
            in_use.add_metric([s["worker"], size_class], p["in_use"])
            limit.add_metric([s["worker"], size_class], p["limit"])
            taken.add_metric([s["worker"], size_class], p["leases"])
    yield from (in_use, limit, taken)

    for name, doc in _QUEUE_COUNTERS:
        c = CounterMetricFamily(f"rubris_queue_{name}", doc, labels=[w, "queue"])
        for s in snaps:
            for q in s["queues"]:
                c.add_metric([s["worker"], q["name"]], q[name])
        yield c
    for name, key, doc in _QUEUE_GAUGES:
        g = GaugeMetricFamily(f"rubris_queue_{name}", doc, labels=[w, "queue"])
        for s in snaps:
            for q in s["queues"]:
                g.add_metric([s["worker"], q["name"]], q[key])
        yield g

    c = CounterMetricFamily(
        "rubris_errors",
        "Protocol errors sent, by kind (goodbye, rejected, result, http) and code.",
        labels=[w, "kind", "code"],
    )
    for s in snaps:
        for e in s["errors"]:
            c.add_metric([s["worker"], e["kind"], str(e["code"])], e["count"])
    yield c
    c = CounterMetricFamily(
        "rubris_api_refusals", "HTTP API requests refused, by status.", labels=[w, "status"]
    )
    for s in snaps:
        for e in s["api_refusals"]:
            c.add_metric([s["worker"], str(e["status"])], e["count"])
    yield c

    for name, doc in (
        ("cycle_duration_seconds", "How long scheduler cycles take."),
        (
            "publish_to_frame_seconds",
            "How long a shared topic's message waits from its publish to the frame that "
            "carries it to a WebSocket session (sampled, weighted to stand for every delivery).",
        ),
        (
            "longpoll_publish_to_frame_seconds",
            "The same for long-poll sessions: it includes the wait for the client's next poll.",
        ),
        (
            "longpoll_ready_to_frame_seconds",
            "The server's part of long-poll publish to frame: from the later of the publish "
            "and the poll's arrival to the frame.",
        ),
    ):
        h = HistogramMetricFamily(f"rubris_{name}", doc, labels=[w])
        for s in snaps:
            data = s["histograms"].get(name)
            if data is None:  # another worker of an older version
                continue
            cumulative = 0
            buckets = []
            for bound, n in zip([*data["bounds"], float("inf")], data["counts"], strict=True):
                cumulative += n
                buckets.append(
                    ("+Inf" if bound == float("inf") else repr(float(bound)), cumulative)
                )
            h.add_metric([s["worker"]], buckets, data["sum"])
        yield h


class RubrisCollector(Collector):
    """Every worker's rubris metrics, read when Prometheus scrapes."""

    def __init__(self, rubris: Reported) -> None:
        self.board = rubris.board

    def collect(self) -> Iterator[Metric]:
        return families(self.board.snapshots())

    def describe(self) -> Iterable[Metric]:
        return ()  # no walk at registration; names are checked at scrape


class _Both(Collector):
    def __init__(self, *collectors: Collector | CollectorRegistry) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for c in self.collectors:
            yield from c.collect()

    def describe(self) -> Iterable[Metric]:
        return ()


class Metrics:
    """An ASGI endpoint answering Prometheus scrapes: rubris' metrics and ``registry``'s.

    Args:
        rubris: the engine to report.
        registry: the application's own metrics, exposed alongside. By default the
            prometheus-client default registry (process, GC and your metrics) when this worker
            is alone; with several workers (``stats_dir``) that registry would describe only
            the worker that happens to answer, so then only prometheus-client's multiprocess
            collector is added, when ``PROMETHEUS_MULTIPROC_DIR`` is set. Pass ``False`` for
            rubris' metrics alone.
    """

    def __init__(
        self, rubris: Reported, *, registry: CollectorRegistry | bool | None = None
    ) -> None:
        extra: list[Collector | CollectorRegistry] = []
        if registry is None:
            if rubris.board.directory is None:
                extra.append(REGISTRY)
            elif os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                extra.append(_multiprocess())
        elif isinstance(registry, CollectorRegistry):
            extra.append(registry)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Both(RubrisCollector(rubris), *extra))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if scope["type"] != "http" or request.method not in ("GET", "HEAD"):
            response: Response = PlainTextResponse("method not allowed", 405, {"Allow": "GET"})
        else:
            encoder, content_type = choose_encoder(request.headers.get("accept", ""))
            body = encoder(self.registry)
            response = Response(
                b"" if request.method == "HEAD" else body,
                headers={"Content-Type": content_type, "Cache-Control": "no-store"},
            )
        await response(scope, receive, send)


def _multiprocess() -> CollectorRegistry:
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


__all__ = ["Metrics", "RubrisCollector", "families"]
