"""The old path of :mod:`rubris_asgi.protocol.deflate`, kept for code written against 0.1.

An alias: no code here.
"""

from .protocol.deflate import (
    Compression,
    CompressionStats,
    Compressor,
    Decompressor,
    DeflateCompressor,
    DeflateDecompressor,
    inflate,
)

__all__ = [
    "Compression",
    "CompressionStats",
    "Compressor",
    "DeflateCompressor",
    "DeflateDecompressor",
    "Decompressor",
    "inflate",
]
