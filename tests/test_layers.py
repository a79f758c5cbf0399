"""The package's floors hold: a folder imports only the floors below it, no cycles, extras only
where used, and the client side loads nothing of the server.

The floors are docs/architecture.md's table; this test reads it, so the page and the code cannot
disagree. A module's floor is its first folder under rubris_asgi/ (or its file, at the top).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rubris_asgi"
DOC = ROOT / "docs" / "architecture.md"

# standard-library modules that make code concurrent or networked; a floor that uses one names it
CONCURRENT_STDLIB = {
    "asyncio",
    "threading",
    "concurrent",
    "multiprocessing",
    "socket",
    "selectors",
    "ssl",
    "subprocess",
}
OPTIONAL = {"redis", "prometheus_client", "pyspark", "httpx"}
SERVER_SIDE = (
    "starlette",
    "uvicorn",
    "rubris_asgi.engine",
    "rubris_asgi.server",
    "rubris_asgi.app",
)


@dataclass(frozen=True)
class Floor:
    name: str
    imports: frozenset[str]  # the floors below it that it may import
    outside: frozenset[str]  # top-level outside modules it may import ("stdlib" for the rest)


def _rows(heading: str) -> list[list[str]]:
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []  # the section's first table: its header, the rule, then rows up to a non-row
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in table[2:]]


def _floor_name(cell: str) -> str:
    """`engine/` -> engine, `config.py` -> config"""
    return cell.strip(" `").removesuffix("/").removesuffix(".py")


def _names(cell: str) -> frozenset[str]:
    if cell.startswith("every floor"):
        return frozenset({"*"})
    return frozenset(n.strip(" `") for n in cell.split(",") if n.strip() and n.strip() != "nothing")


FLOOR_ROWS = _rows("Floors")
FLOORS = {
    _floor_name(row[0]): Floor(_floor_name(row[0]), _names(row[1]), _names(row[2]))
    for row in FLOOR_ROWS
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(module: str) -> str:
    """The floor of a module: its first folder under rubris_asgi/, or its own name at the top."""
    path = MODULES[module].relative_to(PACKAGE)
    return path.parts[0] if len(path.parts) > 1 else path.stem


def imports_of(module: str) -> tuple[set[str], set[str]]:
    """(modules of the package, top-level outside modules) that ``module`` imports anywhere."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inside: set[str] = set()
    outside: set[str] = set()

    def add(name: str) -> None:
        if name == "rubris_asgi" or name.startswith("rubris_asgi."):
            # the longest prefix that is a module: `from .x import y` may name a function y
            while name not in MODULES:
                name = name.rpartition(".")[0]
            if name != module:
                inside.add(name)
        else:
            outside.add(name.split(".")[0])

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            if target == "__future__":
                continue
            submodules = [f"{target}.{a.name}" for a in node.names]
            submodules = [name for name in submodules if name in MODULES]
            for name in submodules:  # `from . import wire` imports the module wire
                add(name)
            if len(submodules) < len(node.names):
                add(target)
    return inside, outside


GRAPH = {m: imports_of(m) for m in MODULES}


def test_the_floor_table_is_complete_and_points_down() -> None:
    names = list(FLOORS)
    for i, floor in enumerate(FLOORS.values()):
        below = set(names[:i])
        if floor.imports != {"*"}:  # the table itself: a floor names only rows above its own
            assert floor.imports <= below, f"{floor.name} may import {floor.imports - below}"
    for module in MODULES:  # every module under a floor: no path outside the table
        assert floor_of(module) in FLOORS, f"{module}: no row for its floor"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    floor = FLOORS[floor_of(module)]
    inside, outside = GRAPH[module]
    for target in sorted(inside):
        target_floor = floor_of(target)
        assert (
            target_floor == floor.name or target_floor in floor.imports or "*" in floor.imports
        ), (
            f"{module} ({floor.name}) imports {target} ({target_floor}): "
            f"{floor.name} may import {sorted(floor.imports) or 'nothing'} and itself"
        )
    stdlib = set(sys.stdlib_module_names) - CONCURRENT_STDLIB
    for name in sorted(outside):
        allowed = name in floor.outside or ("stdlib" in floor.outside and name in stdlib)
        assert allowed, f"{module} ({floor.name}) imports {name}, which its floor may not use"


@pytest.mark.parametrize(
    "module", ["rubris_asgi.client", "rubris_asgi.protocol", "rubris_asgi.spark"]
)
def test_the_client_side_loads_nothing_of_the_server(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(sorted(m for m in sys.modules if m.startswith({SERVER_SIDE!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]", f"import {module} loads {out.strip()}"


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m][0]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t) :] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The checker sees the imports it must refuse (so a green run means something)."""
    inside, _ = GRAPH["rubris_asgi.server.websocket"]
    assert "rubris_asgi.server.gateway" in inside and "rubris_asgi.app" not in inside
    inside, outside = GRAPH["rubris_asgi.app.rubris"]
    assert "rubris_asgi.server.websocket" in inside and "starlette" in outside
    assert floor_of("rubris_asgi.protocol.codec") == "protocol"
    assert floor_of("rubris_asgi.client.core") == "client"
    assert floor_of("rubris_asgi.engine.queues.topic") == "engine"
    assert floor_of("rubris_asgi.app") == "app"
    assert "rubris_asgi.app" not in FLOORS["ops"].imports
    assert "rubris_asgi.protocol.wire" in GRAPH["rubris_asgi.protocol.codec"][0]


def test_import_rubris_asgi_loads_no_optional_extra() -> None:
    code = (
        "import sys, rubris_asgi\n"
        f"print(sorted(m for m in {sorted(OPTIONAL)!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


def test_the_map_names_the_browser_modules() -> None:
    text = DOC.read_text()
    modules = sorted((PACKAGE / "static" / "client").glob("*.js"))
    assert modules
    for js in modules:
        assert f"`{js.name}`" in text, f"static/client/{js.name} is not in docs/architecture.md"
