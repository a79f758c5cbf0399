"""Long-poll requests left out of uvicorn's access log, with a summary line a minute instead.

A long-poll tab makes two or more requests a second (each poll answered as soon as a frame is
ready, each batch of its messages a POST): one tab wrote about 1,500 access-log lines in 15-20 s
and buried everything else in the terminal. The filter drops the access-log records of the
long-poll routes that succeeded (status below 400) and counts them; refusals and errors stay.
At most once a minute, when some were left out, it writes one line to uvicorn's own log:
``long-poll: 1,532 requests answered in the last 60 s (not in the access log; errors are)``.
``Rubris(quiet_polls=False)`` keeps every request in the access log.

It knows the long-poll routes by the paths the transport saw (``learn``), so a route of the
app's own that happens to end in ``/lp`` is never hidden.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

ACCESS_LOGGER = "uvicorn.access"
SUMMARY_LOGGER = "uvicorn.error"  # uvicorn's general log: where a user sees "Started server"
SUMMARY_EVERY = 60.0


class QuietPolls(logging.Filter):
    """A filter for uvicorn's access logger; ``install()`` / ``remove()`` put it on and off."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, every: float = SUMMARY_EVERY
    ) -> None:
        super().__init__()
        self.clock = clock
        self.every = every
        self.prefixes: set[str] = set()
        """Where the long-poll routes are: each mount's path followed by ``/lp``."""
        self.hidden = 0
        """Requests left out since the last summary."""
        self.hidden_total = 0
        self._since = clock()
        self._told = False

    def learn(self, path: str) -> None:
        """A long-poll request came to ``path`` (``.../lp`` or ``.../lp/{session}``)."""
        end = path.rfind("/lp")
        if end >= 0:
            self.prefixes.add(path[: end + 3])

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client address, method, path with query, HTTP version,
        # status); anything else passes untouched
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        path, status = args[2], args[4]
        if not isinstance(path, str) or not isinstance(status, int) or status >= 400:
            return True
        path = path.partition("?")[0]
        if path not in self.prefixes and path.rpartition("/")[0] not in self.prefixes:
            return True
        self.hidden += 1
        self.hidden_total += 1
        now = self.clock()
        if not self._told:
            self._told = True
            self._since = now
            logging.getLogger(SUMMARY_LOGGER).info(
                "long-poll requests that succeed are left out of the access log (a summary "
                "each minute; Rubris(quiet_polls=False) logs every one)"
            )
        elif now - self._since >= self.every:
            logging.getLogger(SUMMARY_LOGGER).info(
                "long-poll: %s requests answered in the last %.0f s (not in the access log; "
                "errors are)",
                f"{self.hidden:,}",
                now - self._since,
            )
            self.hidden = 0
            self._since = now
        return False

    def install(self) -> None:
        logging.getLogger(ACCESS_LOGGER).addFilter(self)

    def remove(self) -> None:
        logging.getLogger(ACCESS_LOGGER).removeFilter(self)
