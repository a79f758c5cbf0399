"""The public surface is exactly what ``__all__`` says."""

from __future__ import annotations

import rubris_asgi


def test_all_is_exactly_what_is_exported() -> None:
    # dir(): the names load on first use (PEP 562), so vars() holds only those used so far
    public = {n for n in dir(rubris_asgi) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(rubris_asgi, n)).__name__ == "module"}
    assert set(rubris_asgi.__all__) == public - modules
    for name in rubris_asgi.__all__:
        assert getattr(rubris_asgi, name) is not None


def test_package_is_typed() -> None:
    from importlib.resources import files

    assert files("rubris_asgi").joinpath("py.typed").is_file()
    assert files("rubris_asgi").joinpath("static/client.js").is_file()
