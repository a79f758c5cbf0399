"""A simulated market: random-walk prices, trades, order books and fills.

Deterministic for a given seed, so tests and screenshots are repeatable.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field

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

    def step(self, symbol: str) -> dict[str, object]:
        """Move one symbol's price; returns its new quote."""
        q = self.quotes[symbol]
        q.last = max(1.0, q.last * (1 + self.rng.gauss(0, 0.0008)))
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

    def book(self, symbol: str, levels: int = 50) -> dict[str, object]:
        """An order book around the current price: large, repetitive JSON that deflates well."""
        q = self.quotes[symbol]
        tick = 0.01 if q.last < 100 else 0.05
        rng = self.rng
        bids = [[round(q.bid - i * tick, 2), rng.randrange(1, 50) * 100] for i in range(levels)]
        asks = [[round(q.ask + i * tick, 2), rng.randrange(1, 50) * 100] for i in range(levels)]
        return {"symbol": symbol, "bids": bids, "asks": asks, "ts": now_ms()}

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
