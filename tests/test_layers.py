"""The package's layout holds: arrows only downward, no cycles, extras only where used.

The layers and the module map are docs/architecture.md's tables; this test reads them, so the
page and the code cannot disagree.
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

# standard-library modules that make code concurrent or networked; a layer that uses one names it
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


@dataclass(frozen=True)
class Layer:
    name: str
    imports: frozenset[str]  # the layers below it that it may import
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


def _names(cell: str) -> frozenset[str]:
    return frozenset(n.strip(" `") for n in cell.split(",") if n.strip() and n.strip() != "nothing")


LAYERS = {row[0]: Layer(row[0], _names(row[1]), _names(row[2])) for row in _rows("Layers")}
MAP = {row[0].strip("`"): (row[1], "*coming" in row[2]) for row in _rows("Module map")}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of a module: its own row, else the row of the nearest package that holds it."""
    path = MODULES[module].relative_to(PACKAGE).as_posix()
    if path in MAP:
        return MAP[path][0]
    parts = path.split("/")[:-1]
    while parts:
        key = "/".join(parts) + "/"
        if key in MAP:
            return MAP[key][0]
        parts.pop()
    raise KeyError(f"{path} is not in docs/architecture.md's module map")


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


def test_the_doc_tables_are_complete() -> None:
    assert set(LAYERS) >= {"foundation", "core", "runtime", "asgi", "client"}
    for layer in LAYERS.values():
        assert layer.imports <= set(LAYERS), f"{layer.name} names an unknown layer"
    for path, (layer, _coming) in MAP.items():
        assert layer in LAYERS, f"{path}: unknown layer {layer!r}"
    for module in MODULES:
        layer_of(module)  # raises for a module missing from the map
    # a row that says *coming* must not describe a module that exists (update the row)
    for path, (_layer, coming) in MAP.items():
        if coming and not path.endswith("/"):
            assert not (PACKAGE / path).exists(), f"{path} exists: its map row still says coming"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    layer = LAYERS[layer_of(module)]
    inside, outside = GRAPH[module]
    for target in sorted(inside):
        target_layer = layer_of(target)
        assert target_layer == layer.name or target_layer in layer.imports, (
            f"{module} ({layer.name}) imports {target} ({target_layer}): "
            f"{layer.name} may import {sorted(layer.imports) or 'nothing'} and itself"
        )
    stdlib = set(sys.stdlib_module_names) - CONCURRENT_STDLIB
    for name in sorted(outside):
        allowed = name in layer.outside or ("stdlib" in layer.outside and name in stdlib)
        assert allowed, f"{module} ({layer.name}) imports {name}, which its layer may not use"


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
    inside, _ = GRAPH["rubris_asgi.transports.websocket"]
    assert "rubris_asgi.transports.gateway" in inside and "rubris_asgi.app" not in inside
    inside, outside = GRAPH["rubris_asgi.app"]
    assert "rubris_asgi.transports.websocket" in inside and "starlette" in outside
    assert layer_of("rubris_asgi.protocol.codec") == "core"
    assert layer_of("rubris_asgi.client.core") == "client"
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
