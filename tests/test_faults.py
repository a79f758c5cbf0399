"""The fault suite: what each everyday fault costs two real nodes on one real Redis, counted.

Each test is one scenario of tests/faultkit.py (the machinery and what is counted are
described there): a fresh ``redis-server`` with its append-only file, two uvicorn nodes of
tests/fault_app.py, the project's Python client behind tests/lbkit.py's balancer, a steady
load of ring publishes, private ``send_to`` and work items through node B, the fault in the
middle. Every test asserts the same promises (protocol.md section 5, docs/operations.md
"Failures and what each costs"):

- every ring seq of every client received exactly once or inside a GAP it was told of, and
  every accepted publish numbered;
- every private message whose ``send_to`` returned received exactly once, and every one whose
  ``send_to`` raised a *refused* error (``SessionClosed``, ``QueueFull``, ``ProtocolError``,
  ``BrokerUnavailable``) never received;
- every accepted work item handled and ACKed (nothing left in Redis), any second delivery
  marked with a higher ``attempt``;
- every client whose connection the fault dropped resumed its session while its node lives.

The counts are small (20 to 200 clients) so that each test takes 10 to 30 s; bench/faults.py
runs the same scenarios with 1,000 sessions.
"""

from __future__ import annotations

import pytest

from .faultkit import Scale, Tally, raise_nofile, scenario

pytestmark = [pytest.mark.timeout(90), pytest.mark.redis]


def report(t: Tally) -> str:
    fields = {k: v for k, v in vars(t).items() if k != "notes"}
    return "\n".join([f"{t.name}: {fields}", *t.notes])


def exercised(t: Tally) -> None:
    """The scenario really carried traffic of every kind (no promise kept by doing nothing)."""
    assert t.ring_expected > 0 and t.publishes_accepted > 0, report(t)
    assert t.private_ok > 0 and t.queue_accepted > 0, report(t)


async def test_every_session_of_a_node_reset_at_once_resumes_on_the_other_losing_nothing() -> None:
    """TCP RST on every connection to node A during the load; the clients come back through
    the balancer to B and resume their sessions on A. The ring goes on from what each client
    holds (a message written to a connection as it was reset is replayed, not skipped)."""
    t = await scenario("reset", Scale(clients=40))
    exercised(t)
    assert t.problems() == [], report(t)
    assert t.reconnected == 40 and t.new_sessions == 0, report(t)


async def test_a_dead_path_noticed_late_loses_nothing_without_a_gap() -> None:
    """The paths to node A go dead (nothing forwarded, nothing closed); each client notices by
    its heartbeat (2 to 3 s), reconnects to B and resumes: what A wrote into the dead path in
    those seconds is replayed, or named by a GAP, never skipped."""
    t = await scenario("blackhole", Scale(clients=20, after_s=4.0))
    exercised(t)
    assert t.problems() == [], report(t)
    assert 1.5 < t.reconnect_s < 10, report(t)  # noticed by the heartbeat, not by a close


async def test_a_killed_node_costs_its_sessions_but_no_work_item_and_no_ring_message() -> None:
    """SIGKILL of node A while its consumers hold work items: its clients start new sessions
    on B (told by resumed=0) and recover their rings from Redis; the items A held come back
    after ``node_timeout`` as redeliveries (attempt 2), none lost. The private messages not yet
    acknowledged to A's sessions went with A (documented, and the client was told by a new
    session): counted apart, not as a loss."""
    t = await scenario("kill", Scale(clients=30))
    exercised(t)
    assert t.problems() == [], report(t)
    assert t.new_sessions == 30, report(t)
    assert t.queue_redelivered > 0, report(t)  # the items A held really came back


async def test_a_redis_restart_with_persistence_loses_and_doubles_nothing() -> None:
    """Redis stopped and started again (append-only file) during the load: publishes, sends
    and enqueues are refused while it is away and nothing accepted is lost or doubled."""
    t = await scenario("redis_restart", Scale(clients=30, after_s=4.0))
    exercised(t)
    assert t.problems() == [], report(t)
    assert t.ring_restarted == 0, report(t)  # the numbering survived: no new epoch


async def test_a_redis_stall_past_node_timeout_loses_nothing_and_refuses_only_truly() -> None:
    """Redis answers nobody for ``node_timeout`` + 1.5 s (DEBUG SLEEP): a ``send_to`` that
    raised a refusal was really not delivered, and nothing accepted is lost or doubled."""
    t = await scenario("redis_stall", Scale(clients=30, after_s=7.0))
    exercised(t)
    assert t.problems() == [], report(t)


async def test_200_concurrent_resumes_and_200_concurrent_send_to_all_succeed() -> None:
    """200 sessions of node A reset at once and resumed through B (200 resumes at once), then
    one ``send_to`` from B to each of them, all at once: every resume succeeds and every send
    is delivered once (nothing here is a reason to refuse one)."""
    raise_nofile()
    t = await scenario("burst", Scale(clients=200, sends_per_tick=20, items_per_tick=2))
    exercised(t)
    assert t.burst_sends == 200, report(t)
    assert t.problems() == [], report(t)


# ------------------------------------------------------------- past the common faults (issue 35)


def no_freeze(t: Tally) -> None:
    """Every node answered a request within ``FROZEN_S`` all along (a loop that spins without
    awaiting after a long stall froze one for good, on redis-py 8)."""
    assert t.frozen == 0, report(t)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("seconds", [12, 30])
async def test_a_redis_stall_past_the_socket_timeout_freezes_no_node_and_loses_nothing(
    seconds: int,
) -> None:
    """Redis answers nobody for 12 s and 30 s (past the nodes' 5 s socket timeout, so every
    command in flight fails and every connection made meanwhile hangs in its handshake): no
    node freezes, nothing accepted is lost or doubled, publishing comes back."""
    t = await scenario(f"redis_stall_{seconds}", Scale(clients=30, after_s=seconds + 4.0))
    exercised(t)
    no_freeze(t)
    assert t.problems() == [], report(t)


@pytest.mark.timeout(150)
async def test_a_redis_restart_then_200_resumes_and_200_send_to_at_once_all_succeed() -> None:
    """Redis away 3 s, then every one of 200 sessions resumes through the other node at once,
    then one ``send_to`` to each at once: the pools came back whole from the outage, so every
    resume succeeds and every send is delivered (no "Too many connections", no PoolBusy)."""
    raise_nofile()
    t = await scenario("restart_burst", Scale(clients=200, sends_per_tick=20, items_per_tick=2))
    exercised(t)
    no_freeze(t)
    assert t.burst_sends == 200, report(t)
    assert t.problems() == [], report(t)
    assert t.new_sessions == 0, report(t)


@pytest.mark.timeout(150)
async def test_a_path_to_redis_that_forwards_nothing_for_15_s_loses_nothing() -> None:
    """The TCP path between the nodes and Redis stops forwarding for 15 s without closing
    anything (a stalled switch), then carries on: the nodes time out, reconnect once it
    forwards again, and nothing accepted is lost or doubled."""
    t = await scenario("relay_stall", Scale(clients=30, after_s=19.0))
    exercised(t)
    no_freeze(t)
    assert t.problems() == [], report(t)


async def test_redis_out_of_memory_refuses_writes_truly_and_loses_nothing() -> None:
    """Redis refuses every write for 4 s (``maxmemory``, ``noeviction``): publishes, sends and
    items are refused meanwhile saying so, and nothing accepted is lost or doubled."""
    t = await scenario("redis_oom", Scale(clients=30, after_s=7.0))
    exercised(t)
    no_freeze(t)
    assert t.problems() == [], report(t)
    assert t.publishes_refused > 0, report(t)  # the fault was felt, and refused truly


async def test_redis_killing_every_node_connection_loses_nothing() -> None:
    """``CLIENT KILL`` of every normal and pub/sub connection, twice: the nodes reconnect,
    subscribe again and read what they missed; nothing lost or doubled."""
    t = await scenario("client_kill", Scale(clients=30, after_s=5.0))
    exercised(t)
    no_freeze(t)
    assert t.problems() == [], report(t)


@pytest.mark.timeout(150)
async def test_a_publish_flood_never_passes_the_outbox_nor_starves_the_apps_publishes() -> None:
    """Four publishers flood node B's API (500 messages a request, as fast as answered) for
    8 s while Redis stands still for 3 s: the outbox never holds more than its bound, every
    message the API accepted is numbered, and none of the application's own publishes is
    refused for the outbox (its share)."""
    t = await scenario("flood", Scale(clients=20, after_s=10.0))
    exercised(t)
    no_freeze(t)
    assert t.flood_accepted > 0, report(t)
    assert t.problems() == [], report(t)


@pytest.mark.timeout(150)
async def test_a_node_paused_past_node_timeout_resumes_its_sessions_and_owns_no_stale_item() -> (
    None
):
    """Node A stopped (SIGSTOP) for 15 s with its clients and their work items, then continued:
    meanwhile its clients reconnect through B, which cannot reach A and closes with 1013 (the
    sessions kept, not replaced), and B takes A for dead and gives its items back (attempt 2).
    Once A runs again every session resumes there, and A, told by its heartbeat that it was
    taken for dead, revokes what its consumers held and gives back, where it still holds them,
    the items it had: nothing lost, every second run marked. The load's ring rate (10 a
    second) keeps the 15 s within the ring (256): no GAP needed."""
    t = await scenario("node_pause", Scale(clients=30, tick=0.1, after_s=19.0))
    exercised(t)
    no_freeze(t)
    assert t.problems() == [], report(t)
    assert t.resumed == t.resumes_expected == 30 and t.new_sessions == 0, report(t)
    assert t.ring_gapped == 0, report(t)
