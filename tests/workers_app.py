"""The app ``tests/test_metrics_workers.py`` runs under ``uvicorn --workers 2``: every worker
imports this module and builds its own engine; they meet in ``$RUBRIS_STATS_DIR``."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Mount, Route

from rubris_asgi import Rubris, Session
from rubris_asgi.ops.metrics import Metrics

TOKEN = "workers-test"

rubris = Rubris(api_token=TOKEN, ops=True, batches=False)


@rubris.shared("ticks", ring=16)
async def ticks(session: Session) -> None:
    return None


app = Starlette(
    routes=[Route("/metrics", Metrics(rubris)), Mount("/rubris", rubris)],
    lifespan=rubris.lifespan,
)
