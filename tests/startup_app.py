"""The apps tests/test_startup_errors.py runs as real processes, their broker from
``RUBRIS_REDIS_URL`` (set by the test): ``app``, FastAPI with ``lifespan=rubris.lifespan``, and
``wrapped``, a plain ASGI app behind ``RubrisMiddleware``."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.applications import Starlette

from rubris_asgi import Rubris, RubrisMiddleware

rubris = Rubris(batches=False)

app = FastAPI(lifespan=rubris.lifespan)
app.mount("/rubris", rubris)

wrapped = RubrisMiddleware(Starlette(), rubris=rubris)
