"""The tasks a started ``Rubris`` runs: the scheduler's loop, CoDel ticks, housekeeping.

The scheduler's loop runs a cycle whenever there is work and sleeps on an event otherwise (the
scheduler calls ``wake`` when work arrives while it is idle), waking for the next hold timer. A
cycle that paused on its asynchronous-write window (granian: writes completed on the server's
own threads) is resumed once half the window is done, the loop idle meanwhile (``settle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..cluster import Broker
from ..config import Config
from ..engine.engine import Engine
from ..engine.scheduler import Scheduler
from .direct import Outbox
from .longpoll import LongPollTransport
from .websocket import WebSocketTransport

log = logging.getLogger("rubris_asgi")

BROKER_SWEEP = 5.0
"""Seconds between the broker's upkeep (topics left without subscribers, the position check)."""
RETIRE_EVERY = 1.0
"""Seconds between walks of the topics without subscribers (``Engine.retire``)."""
QUEUE_TICK = 0.005
"""Seconds between server-side CoDel checks: well under CoDel's interval / sqrt(count) steps."""
NO_QUEUE_TICK = 0.25
"""Seconds between looks for a first queue topic, while there is none: 200 wake-ups a second
for nothing were about 1 % of the server's CPU at 10,000 deliveries a second."""
SETTLE = 0.002
"""At most this long a paused cycle waits for its asynchronous writes (``settle``)."""


async def run_scheduler(engine: Engine, wake: asyncio.Event, outbox: Outbox) -> None:
    """Run cycles while there is work; sleep until ``wake`` or the next hold timer. The
    frames a cycle wrote directly are written at its end, before anything else runs."""
    sched = engine.scheduler
    clock = engine.clock

    def cycle() -> None:
        try:
            sched.run_cycle()
        except Exception:  # a bug must not silently stop all delivery
            log.exception("scheduler cycle failed")
        finally:
            outbox.flush()

    while True:
        if sched.has_work():
            cycle()
            if sched.paused:
                await settle(sched)
            else:
                # let transports write and handlers publish before the next cycle
                await asyncio.sleep(0)
            continue
        wake.clear()
        sched.idle = True
        timer = sched.next_timer()
        timeout = None if timer is None else max(0.0, timer - clock())
        if timeout == 0.0:
            sched.idle = False
            cycle()
            await asyncio.sleep(0)
            continue
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)
        sched.idle = False


async def settle(sched: Scheduler) -> None:
    """A cycle paused with ``async_window`` writes out on the server's threads (granian):
    wait, the loop idle, until half are done (at most ``SETTLE`` s), then go on."""
    if sched.writes_out > sched.async_window // 2:
        settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not settled.done():
                settled.set_result(None)

        before, sched.settled = sched.settled, done
        try:
            await asyncio.wait_for(settled, SETTLE)
        except asyncio.TimeoutError:
            pass  # slow clients' writes: they hold up this slice only
        finally:
            sched.settled = before
    sched.next_slice()


async def queue_ticks(engine: Engine) -> None:
    """Server-side CoDel and round-trip probes: every ``QUEUE_TICK`` while there are queues."""
    while True:
        await asyncio.sleep(QUEUE_TICK if engine.queues else NO_QUEUE_TICK)
        if engine.queues:
            engine.queue_tick()


async def housekeeping(
    engine: Engine,
    config: Config,
    longpoll: LongPollTransport,
    websocket: WebSocketTransport,
    broker: Broker,
) -> None:
    """Expire detached sessions and idle long-poll sessions; end sessions blocked too long;
    close WebSockets silent for twice the heartbeat; retire the topics nobody needs, and forget
    the keyed topics' tombstones past ``Timing.tombstones``, every ``RETIRE_EVERY`` seconds; the
    broker's upkeep every ``BROKER_SWEEP`` seconds."""
    timing = config.timing
    writer = config.writer
    swept = retired = engine.clock()
    while True:
        await asyncio.sleep(min(0.25, timing.session_timeout / 4, writer.max_blocked / 4))
        now = engine.clock()
        engine.expire()
        longpoll.expire(now)
        await websocket.close_blocked(now)
        websocket.close_silent(now)
        if now - retired >= RETIRE_EVERY:
            retired = now
            engine.retire(now, broker.follows)
            engine.forget_tombstones(now)
        if now - swept >= BROKER_SWEEP:
            swept = now
            broker.sweep(now)


async def reauthentication(websocket: WebSocketTransport, every: float) -> None:
    """``Timing.reauthenticate``: every connected session's user checked again this often."""
    while True:
        await asyncio.sleep(every)
        await websocket.reauthenticate()
