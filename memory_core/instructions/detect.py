"""Standing instructions: what the user set up for the rest of the thread, found without an LLM.

A standing instruction is a filter ("leave out test accounts"), a definition ("an active
customer is one with an order in the last 90 days"), a scope ("only the Nordics from now on")
or a convention (calendar, currency, time zone, rounding, units, naming, chart style, default
period). Each has a *key*, what it is about (`filter:test account`, `define:active customer`,
`scope:region`, `currency`): a later instruction with the same key replaces the earlier one, so
"actually, include test accounts again" or "switch back to calendar quarters" supersedes what it
revokes instead of standing beside it.

Detection is per sentence and deliberately conservative about questions: "what would revenue
be in USD?" asks once; it must not replace a standing "show amounts in EUR". A question counts
only with a standing cue ("from now on", "by default", "always"), a polite request ("can you
exclude ...") or a definition.

The key is a function of the instruction's text alone (`key_of`), so a summary read back gives
the same keys it was written with. Text that fits no category keeps a key of its own wording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from memory_core.instructions.declared import declared_key, parse_line
from memory_core.instructions.patterns import (
    CONVENTIONS,
    CUE,
    CUE_ONLY,
    DEFINE,
    FILTER,
    FILTER_PASSIVE,
    FIRST_CONVENTIONS,
    IMPERATIVE,
    OBJECT_END,
    ONE_OFF,
    POLITE,
    QUESTION_START,
    REVOKE_FILTER,
    SCOPE,
    SCOPE_CATEGORIES,
    SCOPE_RESET,
    STOP_WORDS,
    STRONG_CUE,
)
from memory_core.instructions.sql_conditions import SQL_PREFIX, sql_key
from memory_core.write.artifacts import one_line

MAX_CHARS = 160
_PRONOUN = re.compile(r"^\s*(?:it|that|this|them|those|these|one)\b", re.I)


@dataclass(frozen=True, slots=True)
class Instruction:
    key: str
    text: str
    lifts: bool = False  # takes a restriction back ("X counts again", "all plants")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9][a-z0-9']*", text.casefold().replace("-", " "))


def singular(word: str) -> str:
    if len(word) > 3 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _norm(phrase: str, limit: int = 4) -> str:
    """`the Test Accounts` -> `test account`: a stable name for what a phrase is about."""
    head = OBJECT_END.split(phrase, maxsplit=1)[0]
    words = [singular(w.strip("'")) for w in _words(head) if w not in STOP_WORDS]
    words = [w for w in words if not w.isdigit()]  # "the 22:00-06:00 crew" is about the crew
    return " ".join(w for w in words[:limit] if w)


def content_words(text: str) -> set[str]:
    return {singular(w) for w in _words(text) if w not in STOP_WORDS and len(w) > 2}


def scope_kind(phrase: str) -> str | None:
    for name, rx in SCOPE_CATEGORIES.items():
        if rx.search(phrase):
            return name
    return None


def _scope_key(phrase: str) -> str | None:
    if kind := scope_kind(phrase):
        return f"scope:{kind}"
    subject = _norm(phrase, 3)
    return f"scope:{subject}" if subject else None


def _definition(sentence: str) -> str | None:
    for rx in DEFINE:
        if (m := rx.search(sentence)) and (subject := _norm(m.group("x"), 3)):
            return f"define:{subject}"
    return None


def _filter(sentence: str) -> str | None:
    for rx in (REVOKE_FILTER, FILTER, FILTER_PASSIVE):
        for m in rx.finditer(sentence):
            obj = next((g for g in m.groups() if g), "")
            if _PRONOUN.match(obj):  # "drop that into the dashboard" moves a chart
                continue
            if scope_kind(obj) == "region":  # "Alberta comes back in" changes the scope
                return "scope:region"
            if subject := _norm(obj):
                return f"filter:{subject}"
    return None


def _scope(sentence: str) -> str | None:
    for rx in (SCOPE_RESET, SCOPE):
        if m := rx.search(sentence):
            phrase = next((g for g in m.groups() if g), "")
            # "scratch the big-customer focus - all plans": the kind may be elsewhere.
            kind = scope_kind(phrase) or scope_kind(sentence)
            return f"scope:{kind}" if kind else _scope_key(phrase)
    return None


def _convention(sentence: str, keys: frozenset[str] | None = None) -> str | None:
    for key, rx in CONVENTIONS:
        if (keys is None or key in keys) and rx.search(sentence):
            return key
    return None


def _category(sentence: str) -> str | None:
    """What an instruction sentence is about, or None if it sets nothing recognisable.

    Definitions first; a scope reset ("bring all plans back in") before a revoked filter;
    the currency, calendar and time zone before filters ("drop the EUR, use USD")."""
    return (
        _definition(sentence)
        or (SCOPE_RESET.search(sentence) and _scope(sentence))
        or (REVOKE_FILTER.search(sentence) and _filter(sentence))
        or _convention(sentence, FIRST_CONVENTIONS)
        or _filter(sentence)
        or _scope(sentence)
        or _convention(sentence)
    )


def key_of(text: str) -> str:
    """The key of an instruction's text (a stored summary line included)."""
    if text.startswith(SQL_PREFIX):
        return sql_key(text[len(SQL_PREFIX) :])
    if declared := parse_line(text):
        return declared_key(declared[0])
    # As detect() keyed it: a clause may carry it ("thousands is too coarse - round to millions").
    found = _sentence_keys(text, text)
    key = found[0][0] if len(found) == 1 else _category(text)
    if key is None:
        key = next((k for c in _clauses(text) if (k := _category(c))), None)
    return key or "text:" + " ".join(sorted(content_words(text)))[:120]


def same_subject(a: str, b: str) -> bool:
    """Do two keys name the same thing (`filter:partner sourced deal` ~ `filter:partner
    deal`, `define:activity` ~ `define:active customer`)? The words of the shorter subject
    all match (exactly, or by a 5-letter stem) words of the longer."""
    kind_a, _, subject_a = a.partition(":")
    kind_b, _, subject_b = b.partition(":")
    if kind_a != kind_b or kind_a not in ("filter", "define", "naming") or a == b:
        return a == b
    short, long = sorted((subject_a.split(), subject_b.split()), key=len)
    if not short:
        return False

    def match(w: str) -> bool:
        return any(
            w == v
            or (min(len(w), len(v)) >= 4 and (w.startswith(v) or v.startswith(w)))
            or (len(w) >= 5 and len(v) >= 5 and w[:5] == v[:5])
            for v in long
        )

    return all(match(w) for w in short)


def _clean(sentence: str) -> str:
    text = " ".join(sentence.split()).strip(" -*\u2022")
    while (stripped := POLITE.sub("", text)) != text:
        text = stripped
    return text


_CLAUSE = re.compile(r"\s+[-\u2013\u2014]+\s+|:\s+|;\s*|,\s+(?=(?:and|so|but|then)\s)")


def _clauses(text: str) -> list[str]:
    parts = _CLAUSE.split(text)
    return [_clean(p) for p in parts if p.strip()]


_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")


def _qualified_key(clause: str, text: str, raw: str) -> str | None:
    """The key `clause` (of sentence `text`) sets, or None (a question, a one-off request)."""
    cue = bool(CUE.search(text))
    if ONE_OFF.search(text) and not STRONG_CUE.search(text):  # "just Laptops this time"
        return None
    polite = bool(re.match(r"\s*(?:please|can you|could you|would you|will you)\b", raw, re.I))
    lasting = polite or bool(STRONG_CUE.search(text))
    asks = (raw.rstrip().endswith("?") and clause == text) or QUESTION_START.match(clause)
    # Only a definition passes a question without a lasting cue, or a clause with neither a
    # cue nor an imperative: then only `_definition` (which `_category` tries first) can
    # answer, and the costly rest of `_category` is skipped.
    if (asks and not lasting) or not (cue or IMPERATIVE.match(clause)):
        key = _definition(clause)
    else:
        key = _category(clause)
    if key is None:
        return None
    if key in CUE_ONLY and not cue:  # "make that a bar chart" changes one chart
        return None
    return key


# Where one sentence may hold two instructions (a dash or colon introduces a detail instead).
_PARTS = re.compile(r";\s*|,\s+(?=(?:and|also|then|plus)\s)")


def _part_key(part: str, text: str, raw: str) -> str | None:
    """The key of one part of a sentence: the part's own, or its first clause's."""
    if key := _qualified_key(part, text, raw):
        return key
    return next((k for c in _clauses(part) if (k := _qualified_key(c, text, raw))), None)


def _sentence_keys(raw: str, text: str) -> list[tuple[str, str]]:
    """(key, text) of what a sentence sets: one instruction worded by the whole sentence, or
    one per part when its parts set different things ("only cohort courses, and nothing
    from the corporate academy")."""
    parts = [_clean(p) for p in _PARTS.split(text) if p.strip()]
    found = [(k, p) for p in parts if (k := _part_key(p, text, raw))]
    if len({k for k, _ in found}) > 1:
        return list({k: (k, p) for k, p in reversed(found)}.values())[::-1]
    key = _qualified_key(text, text, raw) or (found[0][0] if found else None)
    return [(key, text)] if key else []


_RULE_SHAPE = re.compile(
    r"\b(?:is|are|means|mean|should|must|needs? to|has to|have to|counts?|counted|never"
    r"|always|no more|not|don't|do not|instead|rather than|stays?|keep|exclude|throughout"
    r"|everywhere|anywhere|everything|from now on|from here on|going forward|net of|ex)\b|=",
    re.I,
)
# Imperatives that set how things are done, not what to fetch ("use", not "give me").
_RULE_VERB = re.compile(
    r"^(?:use|call|treat|measure|report|express|round|convert|define|count|quote|state)\b", re.I
)


@lru_cache(maxsize=1024)
def states(query: str) -> bool:
    """Does a message state something (a sentence that is no question, names no one-off
    pick, and is shaped like a rule: a definition, a restriction, a must)? Weaker
    than `detect`: it says a turn may have set something, not what."""
    for raw in _SENTENCE.split(query):
        text = _clean(raw.strip())
        if not text or text.endswith("?") or len(text.split()) < 4:
            continue
        if QUESTION_START.match(text) or ONE_OFF.search(text):
            continue
        if _RULE_VERB.match(text) or _RULE_SHAPE.search(text):
            return True
    return False


def detect(query: str) -> list[Instruction]:
    """Standing instructions stated in one user message, in order."""
    return list(_detect(query))


# A fold reads each folded turn more than once (the prompt's section, then carry_forward),
# and detection is a few hundred regex searches per message: keep recent answers, bounded.
@lru_cache(maxsize=1024)
def _detect(query: str) -> tuple[Instruction, ...]:
    out: list[Instruction] = []
    for raw in _SENTENCE.split(query):
        text = _clean(raw.strip().rstrip(".;!?").strip())
        if len(text) < 6:
            continue
        for key, words in _sentence_keys(raw, text):
            shown = words[:1].upper() + words[1:]
            if shown.startswith(SQL_PREFIX) or parse_line(shown):  # a user's words, not ours
                shown = "Said: " + shown
            lifts = bool(REVOKE_FILTER.search(words) or SCOPE_RESET.search(words))
            out.append(Instruction(key, one_line(shown, MAX_CHARS), lifts))
    return tuple(out)
