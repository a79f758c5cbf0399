"""A simulated market: random-walk prices, trades, order books and fills.

An order book (``Book``) moves as real ones do: between two steps a few of its 100 levels change
(the sizes near the top most often), and when the quote moves the book follows it a tick or two
at a time, levels leaving at one end and arriving at the other. Each step is a list of changes,
what the keyed topic ``book.{symbol}`` sends (a PATCH for a size that changed).

Deterministic for a given seed, so tests and screenshots are repeatable.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

SYMBOLS: dict[str, str] = {
    "AAPL": "Apple Inc.",
    "MSFT": "Microsoft Corp.",
    "GOOG": "Alphabet Inc.",
    "AMZN": "Amazon.com Inc.",
    "NVDA": "NVIDIA Corp.",
    "META": "Meta Platforms",
    "TSLA": "Tesla Inc.",
    "BRK": "Berkshire Hathaway",
    "JPM": "JPMorgan Chase",
    "V": "Visa Inc.",
    "JNJ": "Johnson & Johnson",
    "WMT": "Walmart Inc.",
    "PG": "Procter & Gamble",
    "MA": "Mastercard Inc.",
    "UNH": "UnitedHealth Group",
    "HD": "Home Depot",
    "XOM": "Exxon Mobil",
    "BAC": "Bank of America",
    "KO": "Coca-Cola Co.",
    "PEP": "PepsiCo Inc.",
    "CVX": "Chevron Corp.",
    "ABBV": "AbbVie Inc.",
    "COST": "Costco Wholesale",
    "AVGO": "Broadcom Inc.",
    "MRK": "Merck & Co.",
    "ADBE": "Adobe Inc.",
    "CRM": "Salesforce Inc.",
    "NFLX": "Netflix Inc.",
    "AMD": "Advanced Micro Devices",
    "INTC": "Intel Corp.",
    "CSCO": "Cisco Systems",
    "ORCL": "Oracle Corp.",
    "DIS": "Walt Disney Co.",
    "NKE": "Nike Inc.",
    "MCD": "McDonald's Corp.",
    "T": "AT&T Inc.",
    "VZ": "Verizon",
    "IBM": "IBM Corp.",
    "QCOM": "Qualcomm Inc.",
    "TXN": "Texas Instruments",
    "BA": "Boeing Co.",
    "CAT": "Caterpillar Inc.",
    "GS": "Goldman Sachs",
    "MS": "Morgan Stanley",
    "SBUX": "Starbucks Corp.",
    "PYPL": "PayPal Holdings",
    "UBER": "Uber Technologies",
    "SHOP": "Shopify Inc.",
    "SQ": "Block Inc.",
    "PFE": "Pfizer Inc.",
}


@dataclass
class Quote:
    symbol: str
    open: float
    last: float
    bid: float
    ask: float
    history: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=200))
    step: int = 0
    """The price moves so far: one more on every ``prices.{symbol}`` message of one market
    (with several workers, the one whose lease runs it: example_app/cluster.py)."""

    def as_dict(self, ts: int) -> dict[str, object]:
        change = self.last - self.open
        return {
            "symbol": self.symbol,
            "bid": round(self.bid, 2),
            "ask": round(self.ask, 2),
            "last": round(self.last, 2),
            "change": round(change, 2),
            "change_pct": round(change / self.open * 100, 2),
            "ts": ts,
            "step": self.step,
        }


def now_ms() -> int:
    return int(time.time() * 1000)


class Market:
    """Prices move by small random steps; each step may print a trade."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.quotes: dict[str, Quote] = {}
        for sym in SYMBOLS:
            price = round(self.rng.uniform(20, 900), 2)
            spread = max(0.01, round(price * 0.0004, 2))
            self.quotes[sym] = Quote(sym, price, price, price - spread / 2, price + spread / 2)
        self.trade_id = 0
        self.order_id = 0
        self.books: dict[str, Book] = {}

    def step(self, symbol: str) -> dict[str, object]:
        """Move one symbol's price; returns its new quote."""
        q = self.quotes[symbol]
        q.last = max(1.0, q.last * (1 + self.rng.gauss(0, 0.0003)))
        spread = max(0.01, q.last * 0.0004)
        q.bid, q.ask = q.last - spread / 2, q.last + spread / 2
        q.step += 1
        ts = now_ms()
        q.history.append((ts, round(q.last, 2)))
        return q.as_dict(ts)

    def trade(self, symbol: str) -> dict[str, object]:
        q = self.quotes[symbol]
        self.trade_id += 1
        side = "buy" if self.rng.random() < 0.5 else "sell"
        return {
            "id": self.trade_id,
            "symbol": symbol,
            "price": round(q.ask if side == "buy" else q.bid, 2),
            "qty": self.rng.choice((10, 25, 50, 100, 200, 500, 1000)),
            "side": side,
            "ts": now_ms(),
        }

    def book(self, symbol: str) -> Book:
        """The order book of ``symbol``, made around its quote at the first ask."""
        b = self.books.get(symbol)
        if b is None:
            q = self.quotes[symbol]
            b = self.books[symbol] = Book(symbol, q.bid, random.Random(self.rng.random()))
        return b

    def fill(self, symbol: str, side: str, qty: int) -> dict[str, object]:
        q = self.quotes[symbol]
        self.order_id += 1
        return {
            "order_id": self.order_id,
            "symbol": symbol,
            "side": side,
            "qty": qty,
            "price": round(q.ask if side == "buy" else q.bid, 2),
            "ts": now_ms(),
        }


Level = dict[str, Any]
"""One price level: ``{"side", "px", "qty", "orders"}``."""
Change = tuple[str, str, Level | None]
"""``("set", key, level)`` or ``("delete", key, None)``."""


def tick_size(price: float) -> float:
    """A price step of about 2 basis points, rounded to 1, 2 or 5 in its decade."""
    raw = price * 0.0002
    decade = 10 ** math.floor(math.log10(raw))
    return float(min((m * decade for m in (1, 2, 5, 10)), key=lambda t: abs(t - raw)))


class Book:
    """A 50 + 50 level order book that follows a quote: its keyed topic's entries.

    Keys are ``"bid 101.25"`` and ``"ask 101.30"`` (side, then the price with the tick's
    decimals), values ``{"side", "px", "qty", "orders"}``.
    """

    LEVELS = 50
    FOLLOW = 2
    """Ticks the book moves at most in one step towards its quote."""

    def __init__(self, symbol: str, bid: float, rng: random.Random) -> None:
        self.symbol = symbol
        self.rng = rng
        self.tick = tick_size(bid)
        self.decimals = max(0, -math.floor(math.log10(self.tick) + 1e-9))
        self.best = round(bid / self.tick)
        """The best bid, in ticks (the best ask is one tick above it)."""
        self.levels: dict[str, Level] = {}
        for i in range(self.LEVELS):
            self._put("bid", self.best - i, i)
            self._put("ask", self.best + 1 + i, i)

    def key(self, side: str, ticks: int) -> str:
        return f"{side} {ticks * self.tick:.{self.decimals}f}"

    def _put(self, side: str, ticks: int, depth: int) -> tuple[str, Level]:
        rng = self.rng
        orders = rng.randrange(1, 4 + depth // 3)
        level: Level = {
            "side": side,
            "px": round(ticks * self.tick, self.decimals),
            "qty": orders * rng.randrange(1, 10) * 100,
            "orders": orders,
        }
        key = self.key(side, ticks)
        self.levels[key] = level
        return key, level

    def step(self, bid: float) -> list[Change]:
        """One step: towards ``bid`` by at most ``FOLLOW`` ticks, then a few sizes changed.
        Returns the changes, in order."""
        changes: list[Change] = []
        target = round(bid / self.tick)
        shift = max(-self.FOLLOW, min(self.FOLLOW, target - self.best))
        for _ in range(abs(shift)):
            changes += self._shift(1 if shift > 0 else -1)
        rng = self.rng
        for _ in range(rng.randrange(1, 4)):
            depth = min(self.LEVELS - 1, int(rng.expovariate(0.35)))  # the top most often
            side = "bid" if rng.random() < 0.5 else "ask"
            ticks = self.best - depth if side == "bid" else self.best + 1 + depth
            level = dict(self.levels[self.key(side, ticks)])
            if rng.random() < 0.3:  # an order joins or leaves; else one is modified or filled
                level["orders"] = max(1, level["orders"] + rng.choice((-1, 1)))
            level["qty"] = max(
                level["orders"] * 100, level["qty"] + rng.choice((-3, -1, 1, 2)) * 100
            )
            key = self.key(side, ticks)
            self.levels[key] = level
            changes.append(("set", key, level))
        return changes

    def _shift(self, d: int) -> list[Change]:
        """The book moves one tick up (``d`` 1) or down: the best of one side becomes the
        other's, a level leaves each side's far end and one arrives at the near end."""
        out: list[Change] = []
        if d > 0:  # the best ask is taken: it becomes the best bid
            gone = [self.key("ask", self.best + 1), self.key("bid", self.best - self.LEVELS + 1)]
            self.best += 1
            born = [self._put("bid", self.best, 0), self._put("ask", self.best + self.LEVELS, 49)]
        else:
            gone = [self.key("bid", self.best), self.key("ask", self.best + self.LEVELS)]
            self.best -= 1
            born = [self._put("ask", self.best + 1, 0), self._put("bid", self.best - 49, 49)]
        for key in gone:
            del self.levels[key]
            out.append(("delete", key, None))
        out += [("set", key, level) for key, level in born]
        return out

    def table(self) -> dict[str, Level]:
        """The whole book, key to level (what a keyed topic's replace takes)."""
        return dict(self.levels)

    def snapshot(self) -> dict[str, object]:
        """The whole book as one value, ``{"symbol", "bids", "asks", "ts"}`` (levels as
        ``[px, qty, orders]``, best first): what a snapshot topic would send at every step."""
        levels = self.levels.values()
        bids = sorted(
            ([v["px"], v["qty"], v["orders"]] for v in levels if v["side"] == "bid"), reverse=True
        )
        asks = sorted([v["px"], v["qty"], v["orders"]] for v in levels if v["side"] == "ask")
        return {"symbol": self.symbol, "bids": bids, "asks": asks, "ts": now_ms()}
