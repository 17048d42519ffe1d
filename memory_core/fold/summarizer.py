"""ConversationSummarizer: the LLM that folds old exchanges of a thread into its summary.

One chat-completions call per fold (prompt from Langfuse or built in, traced to Langfuse as a
generation); the answer is validated before it may replace a summary. Every failure is a
`SummarizationError`; retrying is the caller's (Celery's) job. Without an LLM, or when it
keeps failing, the fold uses llm_free.py instead.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import openai

from memory_core.copy.context import Exchange
from memory_core.fold.llm_free import (
    LLM_FREE_LABEL,
    LLM_FREE_TARGET_TOKENS,
    llm_free_fold,
    standing_after,
)
from memory_core.fold.prompts import (
    LANGFUSE_PROMPT_NAME,
    NO_STANDING,
    ResolvedPrompt,
    builtin_prompt,
    langfuse_prompt,
    make_langfuse_client,
    openai_messages,
    prompt_echo,
)
from memory_core.settings import Settings, get_settings
from memory_core.tokens import count_tokens
from memory_core.write.artifacts import one_line

if TYPE_CHECKING:  # the SDK is imported only when Langfuse is configured (~0.5 s)
    from langfuse import Langfuse, LangfuseGeneration

log = logging.getLogger(__name__)

TEMPERATURE = 0.1
_MAX_QUERY_CHARS = 2000
_MAX_ANSWER_CHARS = 1500


class SummarizationError(Exception):
    """The summary could not be produced; the message says what failed (never the text).

    `retryable` is False for errors no retry can fix (the provider refused the request as
    such: too long, filtered, bad model): the fold falls back to the LLM-free summary at once.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class SummaryResult:
    text: str
    prompt: str  # "langfuse:conversation_summarizer:v3", "builtin:v2", "llm-free:v2"
    model: str | None
    input_tokens: int | None
    output_tokens: int | None


def _clip(text: str, limit: int) -> str:
    return one_line(text, limit)


# The prompt delimits the conversation with these tags; user text cannot close them.
_TAGS = re.compile(r"<(/?)(conversation|previous_summary|standing_instructions)>", re.IGNORECASE)


def neutralize_tags(text: str) -> str:
    return _TAGS.sub(lambda m: f"<{m.group(1)}{m.group(2)}\u200b>", text)


def render_conversation(exchanges: Sequence[Exchange]) -> str:
    """The transcript the LLM reads: User/Assistant lines plus artifact one-liners.

    Every line starts with a prefix of ours; user text follows it flattened to one line, so it
    cannot pose as a line (or a closing tag) of the prompt around it.
    """
    blocks = []
    for ex in exchanges:
        lines = [f"User: {_clip(ex.user_query, _MAX_QUERY_CHARS)}"]
        if ex.answer.strip():
            lines.append(f"Assistant: {_clip(ex.answer, _MAX_ANSWER_CHARS)}")
        lines.extend(f"  {a.one_line()}" for a in ex.artifacts)
        blocks.append("\n".join(lines))
    return neutralize_tags("\n\n".join(blocks))


def standing_lines(previous_summary: str | None, exchanges: Sequence[Exchange]) -> str:
    """The standing instructions code finds, for the prompt: one "- " line each."""
    found, _ = standing_after(previous_summary, exchanges)
    return neutralize_tags("\n".join(f"- {t}" for t in found)) if found else NO_STANDING


# ---------------------------------------------------------------- answer validation

_REFUSAL = re.compile(
    r"^(?:(?:an?\s+)?(?:error|exception)\b\s*(?:[:!\-]|occurred|$)|internal server error"
    r"|i['\u2019]?m sorry|i am sorry|sorry,|i apologi[sz]e|i cannot|i can['\u2019]?t"
    r"|i am unable|i['\u2019]?m unable|as an ai\b)",
    re.IGNORECASE,
)
_PREAMBLE = re.compile(
    r"^(?:here(?:'s| is) (?:the |an |your )?(?:updated |new )?summary[^\n:]*:|"
    r"(?:updated )?summary:)\s*",
    re.IGNORECASE,
)


def _is_garbage(text: str) -> bool:
    visible = [c for c in text if not c.isspace()]
    if not visible:
        return True
    letters = sum(c.isalpha() for c in visible)
    controls = sum(unicodedata.category(c) in ("Cc", "Co", "Cs") or c == "\ufffd" for c in visible)
    words = re.findall(r"[^\W\d_]{2,}", text)
    return letters / len(visible) < 0.5 or controls > 0.02 * len(visible) or len(words) < 3


_UNSTORABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """`text` as Postgres and Redis can store it: no NUL or other control characters (tabs
    and line breaks stay), lone surrogates replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", _UNSTORABLE.sub("", text))


def validate_summary(raw: str | None, max_tokens: int) -> str:
    """The cleaned summary, or SummarizationError saying why it is unusable."""
    text = (raw or "").strip()
    if not text:
        raise SummarizationError("LLM returned an empty summary")
    text = _PREAMBLE.sub("", text, count=1).strip()
    if not text:
        raise SummarizationError("LLM returned an empty summary (preamble only)")
    # The messages never quote the answer: it may echo the user's words.
    if _REFUSAL.match(text.lstrip("\"'*# ")):
        raise SummarizationError("LLM returned an error/refusal instead of a summary")
    if _is_garbage(text):
        raise SummarizationError("LLM returned garbage instead of a summary")
    tokens = count_tokens(text)
    if tokens > max_tokens:
        raise SummarizationError(f"invalid summary: {tokens} tokens exceeds the bound {max_tokens}")
    return text


def finished_content(choice: Any) -> str:
    """The text of a completion that finished (`finish_reason` "stop") as an answer in words,
    or SummarizationError. A refusal, a content filter's cut, a cut at the token bound or a
    tool call is never a summary, whatever text came with it. A refusal or a content filter
    is the provider's verdict on this input: no retry can fix it (an LLM-free fold at once)."""
    message = choice.message
    reason = choice.finish_reason
    if getattr(message, "refusal", None):
        raise SummarizationError("LLM refused the request (refusal)", retryable=False)
    if reason == "content_filter":
        raise SummarizationError("LLM answer cut by the content filter", retryable=False)
    if reason == "length":
        raise SummarizationError("invalid summary: LLM answer truncated at the token bound")
    if getattr(message, "tool_calls", None) or getattr(message, "function_call", None):
        raise SummarizationError("LLM answered with a tool call instead of a summary")
    if reason != "stop":
        label = one_line(str(reason), 40)  # the provider's word, never content
        raise SummarizationError(f"LLM answer did not finish (finish_reason {label})")
    return str(message.content or "")


# Statuses whose request no retry can fix: malformed or too long (400), refused as such
# (403 content policy, 404 unknown model, 413, 422). 401 (bad key) is an operator's fix:
# retried, like 408/409/429/5xx, until the attempts run out.
_FINAL_STATUSES = frozenset({400, 403, 404, 413, 422})


def _status_error(exc: openai.APIStatusError) -> SummarizationError:
    """`LLM HTTP 400 (context_length_exceeded)`: the status and the provider's error code,
    never its message (providers quote the offending input in some of them)."""
    body = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error") if isinstance(body.get("error"), dict) else body
    code = inner.get("code") or inner.get("type") if isinstance(inner, dict) else None
    label = one_line(str(code), 60) if code else ""
    text = f"LLM HTTP {exc.status_code}" + (f" ({label})" if label else "")
    return SummarizationError(text, retryable=exc.status_code not in _FINAL_STATUSES)


def _flush_quietly(client: Langfuse) -> None:
    try:
        client.flush()
    except Exception as exc:
        log.warning("langfuse flush failed: %s", exc)


class ConversationSummarizer:
    """Summarizes a thread's folded exchanges; one instance may serve many threads."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self._openai: openai.OpenAI | None = None
        self._langfuse: Langfuse | None = None
        self._langfuse_ready = False
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the LLM client's connections and flush Langfuse; the instance can be reused."""
        with self._lock:
            llm, self._openai = self._openai, None
            lf, self._langfuse, self._langfuse_ready = self._langfuse, None, False
        if llm is not None:
            llm.close()
        if lf is not None:
            try:
                lf.shutdown()
            except Exception as exc:
                log.warning("langfuse shutdown failed: %s", type(exc).__name__)

    def __enter__(self) -> ConversationSummarizer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # Clients are built lazily: an LLM-free deployment never touches openai or Langfuse.
    def _llm(self) -> openai.OpenAI:
        with self._lock:
            if self._openai is None:
                s = self.settings
                self._openai = openai.OpenAI(
                    base_url=s.openai_base_url or None,
                    # OpenAI-compatible servers without auth still need a non-empty key.
                    api_key=s.openai_api_key or "unused",
                    timeout=s.memory_llm_timeout_s,
                    max_retries=0,  # Celery owns retries
                )
                # A host that drops a summarizer without close() still gets its sockets back.
                weakref.finalize(self, self._openai.close)
            return self._openai

    def _lf(self) -> Langfuse | None:
        with self._lock:
            if not self._langfuse_ready:
                self._langfuse = make_langfuse_client(self.settings)
                self._langfuse_ready = True
            return self._langfuse

    def summarize(
        self, *, thread_id: str, previous_summary: str | None, exchanges: Sequence[Exchange]
    ) -> SummaryResult:
        if not exchanges:
            raise ValueError("summarize() needs at least one exchange")
        s = self.settings
        if not s.llm_configured:
            # Extracted notes grow with every fold; keep them to a size that leaves views room
            # for recent turns (an LLM condenses; this fold can only drop the oldest items).
            bound = min(s.memory_summary_max_tokens, LLM_FREE_TARGET_TOKENS)
            text = llm_free_fold(previous_summary, exchanges, bound)
            return SummaryResult(text, LLM_FREE_LABEL, None, None, None)

        previous = neutralize_tags((previous_summary or "").strip() or "(none yet)")
        conversation = render_conversation(exchanges)
        standing = standing_lines(previous_summary, exchanges)
        lf = self._lf()
        resolved = langfuse_prompt(lf, s, previous, conversation, standing) or builtin_prompt(
            previous, conversation, s.memory_summary_max_tokens, standing
        )
        generation = self._start_generation(lf, thread_id, resolved, len(exchanges))
        try:
            result = self._call_llm(resolved, (previous, conversation, standing))
        except SummarizationError as exc:
            self._end_generation(lf, generation, error=str(exc))
            raise
        self._end_generation(lf, generation, result=result)
        return result

    def _call_llm(self, resolved: ResolvedPrompt, values: Sequence[str]) -> SummaryResult:
        """One completion, validated; `values`: what was filled into the prompt's template."""
        s = self.settings
        try:
            completion = self._llm().chat.completions.create(
                model=s.memory_summarizer_model,
                messages=openai_messages(resolved.messages),
                temperature=TEMPERATURE,
                max_tokens=s.memory_summary_max_tokens,
            )
        except openai.APITimeoutError as exc:
            raise SummarizationError(f"LLM timeout after {s.memory_llm_timeout_s}s") from exc
        except openai.APIStatusError as exc:
            raise _status_error(exc) from exc
        except openai.APIConnectionError as exc:
            raise SummarizationError(f"LLM unreachable: {type(exc).__name__}") from exc
        except Exception as exc:  # malformed responses, client errors
            raise SummarizationError(f"LLM call failed: {type(exc).__name__}") from exc
        choice = completion.choices[0] if completion.choices else None
        if choice is None:
            raise SummarizationError("LLM returned no choices")
        text = validate_summary(storable(finished_content(choice)), s.memory_summary_max_tokens)
        if why := prompt_echo(text, resolved.messages, values):
            raise SummarizationError(f"LLM echoed its prompt instead of a summary ({why})")
        usage = completion.usage
        return SummaryResult(
            text=text,
            prompt=resolved.label,
            model=completion.model or s.memory_summarizer_model,
            input_tokens=usage.prompt_tokens if usage else None,
            output_tokens=usage.completion_tokens if usage else None,
        )

    # ------------------------------------------------------------ tracing (never fatal)

    def _start_generation(
        self, lf: Langfuse | None, thread_id: str, resolved: ResolvedPrompt, n: int
    ) -> LangfuseGeneration | None:
        if lf is None:
            return None
        from langfuse import propagate_attributes  # loaded with the client `lf`

        s = self.settings
        try:
            with propagate_attributes(session_id=thread_id, trace_name=LANGFUSE_PROMPT_NAME):
                return lf.start_observation(
                    as_type="generation",
                    name=LANGFUSE_PROMPT_NAME,
                    model=s.memory_summarizer_model,
                    model_parameters={
                        "temperature": TEMPERATURE,
                        "max_tokens": s.memory_summary_max_tokens,
                    },
                    input=resolved.messages,
                    metadata={"thread_id": thread_id, "prompt": resolved.label, "exchanges": n},
                    prompt=resolved.langfuse_prompt,
                )
        except Exception as exc:
            log.warning("langfuse generation start failed: %s", exc)
            return None

    def _end_generation(
        self,
        lf: Langfuse | None,
        generation: LangfuseGeneration | None,
        *,
        result: SummaryResult | None = None,
        error: str | None = None,
    ) -> None:
        if lf is None or generation is None:
            return
        try:
            update: dict[str, Any] = {}
            if result is not None:
                update["output"] = result.text
                update["model"] = result.model
                if result.input_tokens is not None and result.output_tokens is not None:
                    update["usage_details"] = {
                        "input": result.input_tokens,
                        "output": result.output_tokens,
                        "total": result.input_tokens + result.output_tokens,
                    }
            if error is not None:
                update.update(level="ERROR", status_message=error)
            generation.update(**update)
            generation.end()
        except Exception as exc:
            log.warning("langfuse generation end failed: %s", exc)
        self.flush(self.settings.langfuse_prompt_timeout_s)

    def flush(self, timeout_s: float = 5.0) -> None:
        """Export pending traces, waiting at most timeout_s (the export continues after)."""
        lf = self._langfuse
        if lf is None:
            return
        worker = threading.Thread(target=_flush_quietly, args=(lf,), daemon=True)
        worker.start()
        worker.join(timeout_s)
