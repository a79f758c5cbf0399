"""Work queues: producers, competing consumers, retries and a dead-letter queue.

Run it: ``python3 docs/examples/queues.py`` (it serves on a free port of 127.0.0.1, enqueues
thumbnail jobs from the process and over the HTTP API, works them with two consumers, one over
WebSocket with a callback and one over long-poll with ``async for``, and stops).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import Counter

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from rubris_asgi import Rubris, Server, Session
from rubris_asgi.client import Client, QueueItem

TOKEN = os.environ.get("RUBRIS_API_TOKEN", "example-token")
rubris = Rubris(api_token=TOKEN)  # the token turns on POST /rubris/api/enqueue


# each job goes to one consumer; a job that fails three times goes to "thumbnails.failed"
@rubris.queue("thumbnails", delivery_limit=3, dead_letter="thumbnails.failed")
async def thumbnails(session: Session) -> None:
    return None  # raise Reject(...) here to refuse a consumer


@rubris.queue("thumbnails.failed")
async def failed(session: Session) -> None:
    return None


app = Starlette(routes=[Mount("/rubris", rubris)], lifespan=rubris.lifespan)
done: Counter[str] = Counter()


def make_thumbnail(job: dict[str, str]) -> None:
    if job["image"] == "corrupt.png":
        raise ValueError("cannot decode corrupt.png")


def failed_once(item: QueueItem, exc: Exception, consumer: str) -> None:
    """The deliberate failure: said in one line, and NACKed, so the job is tried again (by
    either consumer) until its delivery limit sends it to the dead-letter queue."""
    print(f"{consumer}: {item.value['image']} failed on attempt {item.attempt} ({exc}): NACKed")
    item.nack(requeue=True)


async def produce(url: str) -> None:
    for i in range(10):  # in the server's process: O(1), raises QueueFull when it is full
        rubris.enqueue("thumbnails", {"image": f"cat-{i}.png"}, id=f"cat-{i}")
    rubris.enqueue("thumbnails", {"image": "corrupt.png"})
    jobs = [{"topic": "thumbnails", "data": {"image": f"dog-{i}.png"}, "id": f"dog-{i}"}]
    jobs += [
        {"topic": "thumbnails", "data": {"image": f"dog-{i}.png"}, "id": f"dog-{i}"}
        for i in range(10)
    ]  # "dog-0" twice: the id makes the second a duplicate
    async with httpx.AsyncClient() as http:  # from anywhere else: the HTTP API
        r = await http.post(
            f"{url}/api/enqueue", headers={"Authorization": f"Bearer {TOKEN}"}, json=jobs
        )
        print("HTTP answer:", r.status_code, r.json())


async def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/rubris"
    server = Server(uvicorn.Config(app, ws_per_message_deflate=False, log_level="warning"), rubris)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no "started" event)
        await asyncio.sleep(0.01)
    try:
        async with Client(url) as a, Client(url, transport="longpoll") as b:
            # ACKed when it returns (unless it settled the item itself). An exception it lets
            # out NACKs the item too, and the client logs it with its traceback: right for a
            # bug, noise for a failure it expects, which it settles itself instead
            def on_job(item: QueueItem) -> None:
                try:
                    make_thumbnail(item.value)
                except ValueError as exc:
                    failed_once(item, exc, "websocket")
                    return
                done[item.value["image"]] += 1

            await a.consume("thumbnails", on_job)

            async def worker() -> None:
                async for item in await b.consume("thumbnails", prefetch=2):
                    try:
                        make_thumbnail(item.value)
                    except ValueError as exc:
                        failed_once(item, exc, "long-poll")
                        continue
                    done[item.value["image"]] += 1
                    item.ack()

            work = asyncio.create_task(worker())
            dead = await a.consume("thumbnails.failed")
            await produce(url)
            item = await dead.get(timeout=10)  # the corrupt job, after three failures
            print(f"dead letter: {item.value} on attempt {item.attempt}")
            item.ack()
            while sum(done.values()) < 20:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            print(f"done {sum(done.values())} jobs, each once: {set(done.values()) == {1}}")
            while rubris.queue_stats("thumbnails").acked < 20:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # the last ACKs are still on their way to the server
            stats = rubris.queue_stats("thumbnails")
            print(
                f"enqueued {stats.enqueued}, duplicates {stats.duplicates}, "
                f"acked {stats.acked}, nacked {stats.nacked}, dead-lettered {stats.dead_lettered}"
            )
            work.cancel()
    finally:
        server.should_exit = True
        await task


if __name__ == "__main__":
    asyncio.run(main())
