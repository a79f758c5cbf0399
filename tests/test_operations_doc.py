"""docs/operations.md documents every setting, with the default the code really has."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from rubris_asgi import Config, FlowConfig, Limits, PoolConfig, Timing, WriterConfig
from rubris_asgi.config import BatchConfig

DOC = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()


@pytest.mark.parametrize(
    "cls", [Limits, Timing, WriterConfig, FlowConfig, PoolConfig, BatchConfig, Config]
)
def test_every_setting_is_documented(cls: type) -> None:
    nested = {"limits", "timing", "pool", "writer", "flow", "batches"}  # Config's sections
    missing = [f.name for f in fields(cls) if f.name not in nested and f"`{f.name}`" not in DOC]
    assert missing == [], f"{cls.__name__} settings missing from operations.md: {missing}"


def _row(name: str) -> str:
    m = re.search(rf"^\| `{name}` \| ([^|]+) \|", DOC, re.MULTILINE)
    assert m, f"no table row for {name}"
    return m.group(1).strip()


def _number(cell: str) -> float:
    """The first number of a cell, in bytes when it names KiB/MiB."""
    m = re.match(r"([\d.]+(?: \d{3})*) ?(KiB|MiB|s|bytes)?", cell)
    assert m, cell
    value = float(m.group(1).replace(" ", ""))
    return value * {"KiB": 1024, "MiB": 1024 * 1024}.get(m.group(2) or "", 1)


@pytest.mark.parametrize("cls", [Limits, Timing, WriterConfig, BatchConfig])
def test_table_defaults_match_the_code(cls: type) -> None:
    for f in fields(cls):
        assert f.default is not MISSING
        if isinstance(f.default, bool):  # a switch: its cell says True or False
            assert _row(f.name) == str(f.default), f.name
            continue
        if f.default is None:  # off unless set
            assert _row(f.name) == "None", f.name
            continue
        assert _number(_row(f.name)) == pytest.approx(float(f.default)), f.name  # type: ignore[arg-type]


def test_queue_settings_are_documented_with_their_defaults() -> None:
    from rubris_asgi.engine.queues import QueueSettings

    for f in fields(QueueSettings):
        cell = _row(f.name)
        if f.default is None:
            assert cell == "None", f.name
            continue
        value = _number(cell)
        if cell.endswith("ms"):
            value /= 1000
        assert value == pytest.approx(float(f.default)), f.name  # type: ignore[arg-type]


def test_pool_and_flow_numbers_match_the_code() -> None:
    p = PoolConfig()
    assert f"`block_size` = {p.block_size // 1024} KiB" in DOC
    assert f"`blocks` = {p.blocks}" in DOC
    assert f"`large_blocks` = {p.large_blocks}" in DOC
    assert f"`unpooled` = {p.unpooled}" in DOC
    assert f"`large_scale` = {p.large_scale}" in DOC
    assert f"`max_scale` = {p.max_scale}" in DOC
    assert f"`block_size * large_scale` = {p.large_size // 2**20} MiB" in DOC
    assert f"`block_size * max_scale` = {p.max_size // 2**20} MiB" in DOC
    fl = FlowConfig()
    assert f"`base_interval`\n({fl.base_interval * 1000:.0f} ms)" in DOC
    assert f"`window` ({fl.window * 1000:.0f} ms)" in DOC
    assert f"`recover_step` ({fl.recover_step * 1000:.0f} ms)" in DOC
    c = Config()
    assert f"| `compress_at` | {c.compress_at} bytes |" in DOC
    assert f"| `ring_size` | {c.ring_size} |" in DOC
    assert f"| `private_queue` | {c.private_queue} |" in DOC


def test_every_metric_is_documented() -> None:
    """Each family the collector makes has a row in the metrics table, with its type."""
    from rubris_asgi import Rubris
    from rubris_asgi.ops.metrics import families

    rubris = Rubris(batches=False)
    made = set()
    for family in families([rubris.observer.snapshot()]):
        name = family.name + ("_total" if family.type == "counter" else "")
        made.add(f"{name} ({family.type})")
    rows = re.findall(r"^\| `(rubris_\w+)` \| (\w+) \|", DOC, re.MULTILINE)
    assert made == {f"{name} ({kind})" for name, kind in rows}
