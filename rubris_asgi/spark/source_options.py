"""The source's options, read and checked once on the driver (``SourceOptions.parse``), its
errors, and the offsets a query starts from.

An offset is ``{topic: {"epoch": E, "seq": S}}``, S the last seq read (source.py's docstring
tells how the readers use them). Options are matched without regard to case, with the checks
the sink's options use (options.py); a mistake raises ``SourceOptionError`` when the query is
defined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from .options import OptionError, flag, lower_keys, number

Offset = dict[str, int]
"""One topic's position: ``{"epoch": E, "seq": S}``, S the last seq read."""
Offsets = dict[str, Offset]


class SourceOptionError(OptionError):
    """An option the source cannot work with."""


class RubrisSourceError(RuntimeError):
    """The server refused a read, could not be reached, or sent what the schema cannot take."""


class DataLossError(RubrisSourceError):
    """Messages between a query's offsets are no longer held (``failOnDataLoss=true``)."""


@dataclass(frozen=True)
class SourceOptions:
    """What ``spark.read(Stream).format("rubris")`` was told, checked on the driver."""

    url: str
    token: str | None
    topics: tuple[str, ...]
    starting: str | Offsets
    """``"latest"``, ``"earliest"`` or given offsets."""
    fail_on_data_loss: bool
    max_per_trigger: int | None
    timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = lower_keys(options)
        url = opts.get("url", "").strip()
        if not url.startswith(("http://", "https://")):
            raise SourceOptionError(
                "option url is required: the rubris mount URL, like http://127.0.0.1:8000/rubris"
            )
        topic, listed = opts.get("topic"), opts.get("topics")
        if (topic is None) == (listed is None):
            raise SourceOptionError("give one of the options topic (a name) or topics (a list)")
        names = [topic.strip()] if topic is not None else (listed or "").split(",")
        topics = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
        if not topics:
            raise SourceOptionError("options topic/topics name no topic")
        max_per_trigger = None
        text = opts.get("maxmessagespertrigger")
        if text is not None:
            if not text.strip().isdigit() or int(text) < 1:
                raise SourceOptionError(
                    f"option maxMessagesPerTrigger is an integer of at least 1, not {text!r}"
                )
            max_per_trigger = int(text)
        return cls(
            url=url.rstrip("/"),
            token=opts.get("token") or None,
            topics=topics,
            starting=_starting(opts.get("startingoffsets", "latest"), topics),
            fail_on_data_loss=flag(opts, "failOnDataLoss", True, error=SourceOptionError),
            max_per_trigger=max_per_trigger,
            timeout=number(opts, "timeout", 30.0, 0.1, error=SourceOptionError),
        )


def _starting(text: str, topics: tuple[str, ...]) -> str | Offsets:
    word = text.strip().lower()
    if word in ("latest", "earliest"):
        return word
    why = (
        'option startingOffsets is latest, earliest or JSON {"topic": {"epoch": E, "seq": S}} '
        "naming every topic read"
    )
    try:
        given = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise SourceOptionError(f"{why}, not {text[:200]!r}") from None
    if not isinstance(given, dict) or set(given) != set(topics):
        raise SourceOptionError(f"{why}; got {text[:200]}")
    offsets: Offsets = {}
    for name in topics:
        offset = given[name]
        if not isinstance(offset, dict) or set(offset) != {"epoch", "seq"}:
            raise SourceOptionError(f"{why}; {name!r} has {offset!r}")
        if not all(type(offset[k]) is int and offset[k] >= 0 for k in ("epoch", "seq")):
            raise SourceOptionError(f"{why}; {name!r}: epoch and seq are integers from 0")
        offsets[name] = {"epoch": offset["epoch"], "seq": offset["seq"]}
    return offsets
