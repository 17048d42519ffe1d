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
from collections.abc import Iterable
from dataclasses import dataclass

from memory_core.artifacts import one_line

MAX_CHARS = 160
SQL_PREFIX = "Applied in SQL: "

_CUE = re.compile(
    r"\b(?:from now on|going forward|from here on|for the rest|by default|default to|always"
    r"|every(?:thing| time| query| chart| report| table)|in all (?:\w+ )?(?:queries|charts|reports"
    r"|numbers|figures|tables|analys[ie]s)|across the board|remember|keep in mind|make sure"
    r"|never|no longer|stop|anymore|any more|again|switch(?:ed|ing)? (?:to|back)|go back to"
    r"|stick (?:to|with)|instead|throughout|unless I say|until I say)\b",
    re.I,
)
_STRONG_CUE = re.compile(
    r"\b(?:from now on|going forward|from here on|by default|always|for the rest|remember)\b", re.I
)
_POLITE = re.compile(
    r"^(?:please|pls|can you|could you|would you|will you|can we|could we|ok(?:ay)?|so|and|also"
    r"|actually|now|oh|hmm|right|alright|great|thanks|thank you|one more thing|btw|by the way"
    r"|also,? )\b[\s,:\-]*",
    re.I,
)
_QUESTION_START = re.compile(
    r"^(?:what|which|who|whom|whose|when|where|why|how|is|are|was|were|do|does|did|has|have"
    r"|had|should|shall|may|might|could|would|can|will)\b",
    re.I,
)
_IMPERATIVE = re.compile(
    r"^(?:use|show|report|display|express|give|keep|present|round|convert|make|put|switch|call"
    r"|treat|count|format|stick|exclude|leave|ignore|drop|remove|filter|skip|omit|include|add"
    r"|bring|define|consider|focus|restrict|limit|narrow|go|assume|label|name|rename|refer|set"
    r"|change|let's|lets|let us|from|going|always|never|don't|do not|stop|only|just|everything"
    r"|all|no|we|our|i'd like|i want|i need|note|remember|please|forget|instead|actually)\b",
    re.I,
)

# ------------------------------------------------------------------ categories

_DEFINE = [
    re.compile(
        r"\b(?:by|when (?:i|we) say)\s+(?P<x>[\w' -]{2,40}?)\s*,?\s+(?:i|we)\s+mean\b", re.I
    ),
    re.compile(r"\bdefine\s+(?P<x>[\w' -]{2,40}?)\s+as\b", re.I),
    re.compile(r"\b(?P<x>[\w' -]{2,40}?)\s+(?:is|are)\s+defined\s+as\b", re.I),
    re.compile(r"\btreat\s+(?P<x>[\w' -]{2,40}?)\s+as\b", re.I),
    re.compile(r"\b(?P<x>[\w' -]{2,40}?)\s+(?:should\s+)?counts?\s+as\b", re.I),
    re.compile(r"\bconsider\s+(?P<x>[\w' -]{2,40}?)\s+(?:as|to be)\b", re.I),
    re.compile(
        r"\b(?P<x>[\w' -]{2,40}?)\s+(?:is|are|=)\s+(?:one|ones|those|anyone|anybody|someone"
        r"|any(?:thing|\s+\w+)|an?\s+\w+|\w+s)\s+(?:with|who|that|where|whose|which|having)\b",
        re.I,
    ),
    re.compile(r"\b(?P<x>[\w'-]+(?:\s+[\w'-]+){0,3})\s+(?:means|refers to)\b", re.I),
]
_REVOKE_FILTER = re.compile(
    r"\b(?:stop|quit|no longer|don't|do not|never)\s+(?:excluding|exclude|ignoring|ignore"
    r"|dropping|drop|removing|remove|filtering out|filter out|leaving out|leave out|skipping"
    r"|skip|omitting|omit)\s+(?P<x>[^.;,?!]+)"
    r"|\b(?:include|including|add back|bring back|put back|count|keep)\s+(?P<y>[^.;,?!]+?)"
    r"\s+(?:again|back|too|as well)\b",
    re.I,
)
_FILTER = re.compile(
    r"\b(?:exclude|excluding|leave out|leaving out|ignore|ignoring|drop|dropping|remove|removing"
    r"|filter out|filtering out|skip|skipping|omit|omitting|don't count|do not count"
    r"|don't include|do not include|not including|without|minus|strip out|take out|get rid of"
    r"|exclusive of|disregard)\s+(?P<x>[^.;,?!]+)",
    re.I,
)
_FILTER_PASSIVE = re.compile(
    r"(?P<x>[\w' -]{2,40}?)\s+(?:are|is|should be|must be|stay|stays|get|gets|to be|being)\s+"
    r"(?:(?:always|all|now|still)\s+)?(?:excluded|left out|ignored|dropped|removed|filtered out"
    r"|omitted|skipped|included(?:\s+again)?|back in)\b",
    re.I,
)
_SCOPE = re.compile(
    r"\b(?:only|just|focus(?:ing)? (?:only )?on|restrict(?:ed)? (?:it |this |everything )?to"
    r"|limit(?:ed)? (?:it |this |everything )?to|stick (?:to|with)"
    r"|narrow (?:it |this )?(?:down )?to|concentrate on|zoom in on|scope (?:it |this )?to)"
    r"\s+(?:the\s+)?(?P<x>[^.;,?!]+)",
    re.I,
)
_SCOPE_RESET = re.compile(
    r"\b(?:all|every|both)\s+(?P<x>regions?|countries|markets|segments|plans|tiers|channels"
    r"|products|categories)\b|\b(?:widen|expand|broaden|open)\b[^.;?!]*\bto\s+(?P<y>[^.;,?!]+)",
    re.I,
)
_SCOPE_CATEGORIES = {
    "region": r"nordics?|nordic countries|scandinavia|emea|apac|amer|americas|latam|europe|asia"
    r"|africa|north america|south america|oceania|dach|benelux|us|usa|uk|germany|france|spain"
    r"|italy|sweden|norway|denmark|finland|iceland|japan|china|india|brazil|canada|mexico"
    r"|australia|regions?|countr(?:y|ies)|markets?|territor(?:y|ies)|west|east|north|south",
    "segment": r"enterprise|smb|small business(?:es)?|mid-?market|self-?serve|plans?|tiers?"
    r"|segments?|b2b|b2c|premium|free|pro|paid|trial|accounts? tier|customer types?",
    "channel": r"online|offline|retail|web|mobile|app|stores?|channels?|wholesale|e-?commerce"
    r"|partners?|resellers?|direct",
}
_CONVENTIONS = [
    (
        "currency",
        r"\b(?:eur|usd|gbp|sek|nok|dkk|chf|jpy|aud|cad|euros?|dollars?|pounds sterling"
        r"|kronor|kroner|currenc(?:y|ies)|fx|exchange rates?)\b",
    ),
    (
        "calendar",
        r"\b(?:fiscal|calendar|financial)\s+(?:years?|quarters?|months?|weeks?|calendar)"
        r"\b|\b(?:quarters?|weeks?|years?|fy)\s+(?:that\s+)?(?:start|begin)s?\b|\biso\s+weeks?\b"
        r"|\bfy\d*\b|\bweek starts?\b",
    ),
    (
        "timezone",
        r"\btime\s*-?zones?\b|\b(?:utc|gmt|cet|cest|est|edt|pst|pdt|jst|ist)\b"
        r"|\blocal time\b",
    ),
    (
        "number format",
        r"\bround(?:ed|ing)?\b|\bdecimals?\b|\bdecimal places\b|\bsignificant"
        r"\b|\bin (?:thousands|millions|billions)\b|\b(?:thousands|millions) separator",
    ),
    (
        "units",
        r"\b(?:metric|imperial|kilomet(?:er|re)s?|miles?|kilograms?|kgs?|lbs|litres?"
        r"|liters?|gallons?|units? of measure)\b",
    ),
    (
        "naming",
        r"\bcall (?:it|them|this|that|those)\b|\brefer to\b[^.;?!]*\bas\b|\brename\b"
        r"|\blabel\b[^.;?!]*\bas\b|\bname (?:it|them)\b",
    ),
    (
        "chart style",
        r"\b(?:bar|line|pie|stacked|area|scatter)\s+charts?\b|\bcolou?rs?\b"
        r"|\blog(?:arithmic)? scale\b|\blegend\b",
    ),
    (
        "period",
        r"\b(?:last|past|trailing|rolling)\s+\d+\s+(?:days|weeks|months|quarters|years)\b"
        r"|\b(?:ytd|year to date|month to date|mtd)\b",
    ),
]
_CUE_ONLY = frozenset({"chart style", "period"})
_CONVENTION_RE = [(key, re.compile(rx, re.I)) for key, rx in _CONVENTIONS]


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_STOP_WORDS = _set(
    "a an the all any our my your their its of for in on from to with by and or as at it this "
    "that these those them everything anything everyone please again back too well also now "
    "then just only any more anymore from now on going forward rest data numbers results "
    "report reports query queries analysis analyses chart charts table tables"
)
_OBJECT_END = re.compile(
    r"\b(?:from|in|for|when|while|unless|until|so|because|since|and then|going|across|always"
    r"|everywhere|throughout|anymore|again|please|too|as well|if|but|before|after)\b",
    re.I,
)


@dataclass(frozen=True, slots=True)
class Instruction:
    key: str
    text: str


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9][a-z0-9'-]*", text.casefold())


def _singular(word: str) -> str:
    if len(word) > 3 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _norm(phrase: str, limit: int = 4) -> str:
    """`the Test Accounts` -> `test account`: a stable name for what a phrase is about."""
    head = _OBJECT_END.split(phrase, maxsplit=1)[0]
    words = [_singular(w.strip("'-")) for w in _words(head) if w not in _STOP_WORDS]
    return " ".join(w for w in words[:limit] if w)


def content_words(text: str) -> set[str]:
    return {_singular(w) for w in _words(text) if w not in _STOP_WORDS and len(w) > 2}


def _scope_key(phrase: str) -> str | None:
    for name, rx in _SCOPE_CATEGORIES.items():
        if re.search(rf"\b(?:{rx})\b", phrase, re.I):
            return f"scope:{name}"
    subject = _norm(phrase, 3)
    return f"scope:{subject}" if subject else None


def _definition(sentence: str) -> str | None:
    for rx in _DEFINE:
        if (m := rx.search(sentence)) and (subject := _norm(m.group("x"), 3)):
            return f"define:{subject}"
    return None


def _filter(sentence: str) -> str | None:
    m = (
        _REVOKE_FILTER.search(sentence)
        or _FILTER.search(sentence)
        or _FILTER_PASSIVE.search(sentence)
    )
    if m is None:
        return None
    subject = _norm(m.groupdict().get("x") or m.groupdict().get("y") or "")
    return f"filter:{subject}" if subject else None


def _scope(sentence: str) -> str | None:
    if m := _SCOPE_RESET.search(sentence):
        return _scope_key(m.group("x") or m.group("y") or "")
    if m := _SCOPE.search(sentence):
        return _scope_key(m.group("x"))
    return None


def _convention(sentence: str, keys: frozenset[str] | None = None) -> str | None:
    for key, rx in _CONVENTION_RE:
        if (keys is None or key in keys) and rx.search(sentence):
            return key
    return None


_FIRST_CONVENTIONS = frozenset({"currency", "calendar", "timezone"})


def _category(sentence: str) -> str | None:
    """What an instruction sentence is about, or None if it sets nothing recognisable.

    Definitions first; then revoked or set filters, but the currency, calendar and time zone
    before them ("drop the EUR, use USD" is about currency, not a filter)."""
    return (
        _definition(sentence)
        or (_REVOKE_FILTER.search(sentence) and _filter(sentence))
        or _convention(sentence, _FIRST_CONVENTIONS)
        or _filter(sentence)
        or _scope(sentence)
        or _convention(sentence)
    )


def key_of(text: str) -> str:
    """The key of an instruction's text (a stored summary line included)."""
    if text.startswith(SQL_PREFIX):
        return sql_key(text[len(SQL_PREFIX) :])
    return _category(text) or "text:" + " ".join(sorted(content_words(text)))[:120]


def _clean(sentence: str) -> str:
    text = " ".join(sentence.split()).strip(" -*\u2022")
    while (stripped := _POLITE.sub("", text)) != text:
        text = stripped
    return text


def _is_question(raw: str, text: str) -> bool:
    return raw.rstrip().endswith("?") or bool(_QUESTION_START.match(text))


_SENTENCE = re.compile(r"[^.!?;\n]+(?:[.!?;]+|\n|$)")


def detect(query: str) -> list[Instruction]:
    """Standing instructions stated in one user message, in order."""
    out: list[Instruction] = []
    for m in _SENTENCE.finditer(query):
        raw = m.group(0)
        text = _clean(raw.strip().rstrip(".;!?").strip())
        if len(text) < 6:
            continue
        polite = bool(re.match(r"\s*(?:please|can you|could you|would you|will you)\b", raw, re.I))
        if _is_question(raw, text) and not (polite or _STRONG_CUE.search(text)):
            key = _category(text)
            if not (key and key.startswith("define:")):
                continue
        else:
            key = _category(text)
        if key is None:
            continue
        cue = bool(_CUE.search(text))
        if not (cue or _IMPERATIVE.match(text) or key.startswith("define:")):
            continue
        if key in _CUE_ONLY and not cue:  # "make that a bar chart" changes one chart
            continue
        shown = text[:1].upper() + text[1:]
        out.append(Instruction(key, one_line(shown, MAX_CHARS)))
    return out


# ------------------------------------------------------------------ SQL conditions

_SQL_STOP = re.compile(
    r"\b(?:group\s+by|order\s+by|having|limit|union|window|qualify|offset|fetch)\b", re.I
)
_SQL_NOISE = _set(
    "and or not is null in like ilike between true false select from where exists interval "
    "now current_date date_trunc cast as case when then else end lower upper coalesce"
)


def _where_clauses(sql: str) -> Iterable[str]:
    flat = " ".join(sql.split())
    for m in re.finditer(r"\bwhere\b", flat, re.I):
        i, depth = m.end(), 0
        while i < len(flat):
            c = flat[i]
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and (c == ";" or _SQL_STOP.match(flat, i)):
                break
            i += 1
        if clause := flat[m.end() : i].strip():
            yield clause


def _split_and(clause: str) -> list[str]:
    """Top-level AND conjuncts (BETWEEN x AND y stays whole)."""
    parts, depth, start, between = [], 0, 0, False
    for m in re.finditer(r"\(|\)|'(?:[^']|'')*'|\bbetween\b|\band\b", clause, re.I):
        tok = m.group(0).lower()
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        elif tok == "between":
            between = True
        elif tok == "and" and depth == 0:
            if between:
                between = False
                continue
            parts.append(clause[start : m.start()].strip())
            start = m.end()
    parts.append(clause[start:].strip())
    return [p for p in parts if p]


def _columns(condition: str) -> list[str]:
    no_strings = re.sub(r"'(?:[^']|'')*'", " ", condition)
    names = re.findall(r"[A-Za-z_][\w.]*", no_strings)
    cols = {n.split(".")[-1].lower() for n in names if n.lower() not in _SQL_NOISE}
    return sorted(cols)


def sql_key(condition: str) -> str:
    cols = _columns(condition.removeprefix("WHERE ").strip())
    return "sql:" + ",".join(cols) if cols else "sql:" + condition.casefold()[:80]


def sql_conditions(sql: str) -> list[Instruction]:
    """The WHERE conjuncts of a query, each keyed by the columns it tests."""
    out = []
    for clause in _where_clauses(sql):
        for cond in _split_and(clause):
            out.append(Instruction(sql_key(cond), one_line(SQL_PREFIX + cond, MAX_CHARS)))
    return out


def sql_column_words(key: str) -> set[str]:
    """The words of the columns an `sql:` key tests (`is_test` -> {is, test})."""
    cols = key.removeprefix("sql:").split(",")
    return {_singular(w) for c in cols for w in c.split("_") if len(w) > 2}


def revokes_sql(instruction: Instruction, sql_key_: str) -> bool:
    """Does a user instruction speak about the columns of an SQL condition?

    "Include test accounts again" drops the standing `NOT c.is_test`; a scope on regions drops
    a standing `region IN (...)`."""
    words = content_words(instruction.key.split(":", 1)[-1])
    if instruction.key.startswith("scope:"):
        words |= {instruction.key.split(":", 1)[1]}
    return bool(words & sql_column_words(sql_key_))
