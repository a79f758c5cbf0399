"""``Rubris``: the ASGI app users mount (:mod:`.rubris`: registration, routes, lifespan), and
what the application calls on it to publish and send (:mod:`.publishing`).

>>> from rubris_asgi import Rubris
>>> rubris = Rubris(compress_at=512)
>>> @rubris.shared("prices.{symbol}", snapshot=True)
... async def prices(session, symbol: str):
...     return {"symbol": symbol, "bid": 1.0}
>>> # app = FastAPI(lifespan=rubris.lifespan); app.mount("/rubris", rubris)
"""

from .rubris import Rubris

__all__ = ["Rubris"]
