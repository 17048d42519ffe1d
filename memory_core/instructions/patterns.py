"""The vocabulary of standing instructions (detect.py): cues, verbs and categories.

Plain regular expressions, kept apart from the logic that uses them. They recognise how analysts
phrase a lasting instruction (a cue such as "from now on", an imperative verb, a definition) and
what it is about (a filter's object, a scope's kind, a convention).
"""

from __future__ import annotations

import re


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.I)


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


CUE = _rx(
    r"\b(?:from now on|going forward|from here on|for the rest|for now|from today|by default"
    r"|default to|always|every(?:thing| time| query| chart| report| table)|in all (?:\w+ )?"
    r"(?:queries|charts|reports|numbers|figures|tables|analys[ie]s)|across the board|remember"
    r"|keep in mind|make sure|never|no longer|stop|anymore|any more|again|switch(?:ed|ing)? "
    r"(?:to|back)|go back to|back to|stick (?:to|with)|instead|throughout|unless I say"
    r"|until I say|change of plan|scratch|widen|broaden|expand|tighten|loosen|as a whole"
    r"|alongside|back in|back into|comes? back|(?:are|is) back|counted again|counts? again"
    r"|wants?|needs?|would like|prefers?|asked for|asks for|requires?|now on)\b"
)
STRONG_CUE = _rx(
    r"\b(?:from now on|going forward|from here on|by default|always|for the rest|remember)\b"
)
# A pick for one question, not a rule ("just Laptops this time", "for this one"): no instruction
# unless a lasting cue says otherwise.
ONE_OFF = _rx(
    r"\b(?:this time|this once|just once|one[- ]off|for this one|just for this|for this (?:one"
    r"|question|query|chart|number|table|breakdown|view|slice|cut)|for the moment)\b"
)
POLITE = _rx(
    r"^(?:please|pls|can you|could you|would you|will you|can we|could we|ok(?:ay)?|so|and"
    r"|also|actually|now|oh|hmm|right|alright|great|thanks|thank you|one more thing|btw"
    r"|by the way|also,? )\b[\s,:\-]*"
)
QUESTION_START = _rx(
    r"^(?:what|which|who|whom|whose|when|where|why|how|is|are|was|were|do|does|did|has|have"
    r"|had|should|shall|may|might|could|would|can|will)\b"
)
IMPERATIVE = _rx(
    r"^(?:use|show|report|display|express|give|keep|present|round|convert|make|put|switch|call"
    r"|treat|count|format|stick|exclude|leave|ignore|drop|remove|filter|skip|omit|include|add"
    r"|bring|define|consider|focus|restrict|limit|narrow|go|assume|label|name|rename|refer|set"
    r"|change|let's|lets|let us|from|going|always|never|don't|do not|stop|only|just|everything"
    r"|all|no|we|our|i'd like|i want|i need|note|remember|please|forget|instead|actually|widen"
    r"|broaden|expand|open|scratch|tighten|loosen|relax|pin|move|back|take|express|state"
    r"|quote|list|measure|nothing|none)\b"
)

# ------------------------------------------------------------------ categories

_SUBJECT = r"[\w' -]{2,40}?"
DEFINE = [
    _rx(rf"\b(?:by|when (?:i|we) say)\s+(?P<x>{_SUBJECT})\s*,?\s+(?:i|we)\s+mean\b"),
    _rx(rf"\bdefine\s+(?P<x>{_SUBJECT})\s+as\b"),
    _rx(rf"\bredefined?\s+(?:the|our|that)\s+(?P<x>{_SUBJECT})(?::|\s+as\b|$)"),
    _rx(rf"\bcall\s+(?:it|them|this)\s+(?:an?\s+)?(?P<x>{_SUBJECT})\s+(?:when|if|once)\b"),
    _rx(rf"\b(?P<x>{_SUBJECT})\s+(?:is|are)\s+defined\s+as\b"),
    _rx(rf"\btreat\s+(?P<x>{_SUBJECT})\s+as\b"),
    # "X counts as retained" defines "retained".
    _rx(r"\bcounts?\s+as\s+(?P<x>[\w'-]+(?:\s+(?!if\b|when\b|unless\b)[\w'-]+)?)"),
    _rx(
        rf"\b(?P<x>{_SUBJECT})\s+(?:runs|goes|is measured|is counted|is computed"
        r"|is calculated)\s+(?:from|as|by)\b"
    ),
    _rx(rf"^(?P<x>{_SUBJECT})\s*=\s*\S"),
    _rx(
        rf"\b(?P<x>{_SUBJECT})\s+(?:is|are)\s+[\w' -]{{2,40}}?\s+(?:over|divided by|minus"
        r"|plus|times)\s"
    ),
    _rx(
        rf"\b(?P<x>{_SUBJECT})\s+(?:only\s+)?(?:counts?|qualif(?:y|ies))\s+(?:only\s+)?"
        r"(?:if|when|once|after|unless)\b"
    ),
    _rx(rf"\bconsider\s+(?P<x>{_SUBJECT})\s+(?:as|to be)\b"),
    _rx(
        rf"\b(?:tighten|loosen|relax|change|update|adjust|revise|redefine|move|new)(?:ed|d|s)?"
        rf"\s+(?:(?:that|the|our|this)\s+)?(?P<x>{_SUBJECT})\s+(?:rule|definition|threshold"
        r"|criteria|criterion|cut-?off|window)\b"
    ),
    _rx(
        rf"\b(?:tighten|loosen|relax|change|update|adjust|revise|redefine|move)\s+(?:that|the"
        rf"|our|this)\s+(?P<x>{_SUBJECT})\s+(?:rule|definition|threshold|criteria|criterion"
        r"|cut-?off|window)\b"
    ),
    _rx(
        rf"\b(?P<x>{_SUBJECT})\s+(?:is|are|=)\s+(?:one|ones|those|anyone|anybody|someone"
        r"|any(?:thing|\s+\w+)|an?\s+\w+|\w+s)\s+(?:with|who|that|where|whose|which|having)\b"
    ),
    _rx(r"\b(?P<x>[\w'-]+(?:\s+[\w'-]+){0,3})\s+(?:means|refers to)\b"),
]
_BACK_VERBS = r"include|including|add|bring|put|let|count|keep|allow|take"
REVOKE_FILTER = _rx(
    r"\b(?:stop|quit|no longer|don't|do not|never)\s+(?:excluding|exclude|ignoring|ignore"
    r"|dropping|drop|removing|remove|filtering out|filter out|leaving out|leave out|skipping"
    r"|skip|omitting|omit)\s+(?P<x>[^.;,?!]+)"
    rf"|\b(?:{_BACK_VERBS})\s+(?:back\s+)?(?P<y>[^.;,?!]+?)\s+(?:again|back|too|as well)\b"
    rf"|\b(?:{_BACK_VERBS})\s+back\s+(?:in\s+)?(?P<z>[^.;,?!]+)"
    rf"|(?P<w>{_SUBJECT})\s+(?:come|comes|go|goes|are|is|should be|can be|belongs?)\s+back\b"
    rf"|(?P<v>{_SUBJECT})\s+(?:should\s+be\s+|are\s+|is\s+|can\s+be\s+)?counted\s+again\b"
    rf"|(?P<u>{_SUBJECT})\s+belongs?\s+in\s+[\w ]{{0,20}}?\s*again\b"
    rf"|(?P<s>{_SUBJECT})\s+counts?\s+again\b"
    r"|\binclude\s+(?P<t>[^.;,?!]+)"
)
FILTER = _rx(
    r"\b(?:exclude|excluding|leave out|leaving out|ignore|ignoring|drop|dropping|remove|removing"
    r"|filter out|filtering out|skip|skipping|omit|omitting|don't count|do not count"
    r"|don't include|do not include|not including|without|minus|strip out|take out|get rid of"
    r"|exclusive of|disregard|nothing from|none of)\s+(?P<x>[^.;,?!]+)"
    rf"|\b(?:leave|keep|take|filter|strip)\s+(?P<y>{_SUBJECT})\s+out\b"
)
FILTER_PASSIVE = _rx(
    rf"(?P<x>{_SUBJECT})\s+(?:are|is|should be|must be|stay|stays|get|gets|to be|being)\s+"
    r"(?:(?:always|all|now|still)\s+)?(?:excluded|left out|ignored|dropped|removed|filtered out"
    r"|omitted|skipped|included(?:\s+again)?|back in|out)\b"
)
SCOPE = _rx(
    r"\b(?:only|just|focus(?:ing)? (?:only )?on|restrict(?:ed)? (?:it |this |everything )?to"
    r"|limit(?:ed)? (?:it |this |everything )?to|stick (?:to|with)"
    r"|narrow (?:it |this )?(?:down )?to|concentrate on|zoom in on|scope (?:it |this )?to"
    r"|keep (?:it |this |things |everything )?to)"
    r"\s+(?:the\s+)?(?P<x>[^.;,?!]+)"
    rf"|\badd\s+(?P<y>{_SUBJECT})\s+to\s+(?:the|our|this)\s+(?:[\w-]+\s+)?(?:mix|scope|list"
    r"|selection|analysis|set|filter)\b"
)
SCOPE_RESET = _rx(
    r"\b(?:all|every|both)\s+(?P<x>regions?|countries|markets|segments|plans|tiers|channels"
    r"|products|categories)\b|\b(?:widen|expand|broaden|open)\b[^.;?!]*?\bto\s+(?P<y>[^.;,?!]+)"
    r"|\bback to\s+(?P<z>global|worldwide|all\s+\w+|the whole\s+\w+|every\s*\w+)"
    r"|\b(?:so|back to|include|including)\s+all\s+(?P<v>[\w-]+(?:\s+[\w-]+)?s)\s*$"
    r"|\ball\s+(?P<u>[\w-]+(?:\s+[\w-]+)?s)\s+again\b"
    r"|\b(?:and|compare|across|cover|covering)\s+all\s+(?:(?:two|three|four|five|six|\d+)\s+)?"
    r"(?P<t>[\w-]+s)\b"
    r"|\b(?:drop|remove|lift|scratch|forget|lose)\s+the\s+(?P<w>[\w-]+\s+(?:restriction|focus"
    r"|scope|filter|limit|cut))\b"
)
REGIONS = (
    r"nordics?|nordic countries|scandinavi\w*|emea|apac|amer|americas|latam|europe|european"
    r"|asia|asian|africa|north america|south america|oceania|dach|benelux|us|usa|uk|germany"
    r"|german|france|french|spain|spanish|italy|italian|sweden|swedish|norway|norwegian"
    r"|denmark|danish|finland|finnish|iceland|japan|japanese|china|chinese|india|indian|brazil"
    r"|canada|canadian|mexico|australia|poland|polish|czechia|czech|netherlands|dutch"
    r"|switzerland|swiss|austria|austrian|belgium|portugal|ireland|korea|singapore|british"
    r"|regions?|regional|countr(?:y|ies)|markets?|territor(?:y|ies)|global|worldwide"
    r"|international|domestic|west|east|north|south|northern|southern|eastern|western"
    r"|cit(?:y|ies)|provinces?|states?|columbia|alberta|ontario|quebec"
)
SCOPE_CATEGORIES = {
    "region": _rx(rf"\b(?:{REGIONS})\b"),
    "segment": _rx(
        r"\b(?:enterprise|smb|small business(?:es)?|mid-?market|self-?serve|plans?|tiers?"
        r"|segments?|b2b|b2c|premium|free|pro|paid|trial|customer types?)\b"
    ),
    "channel": _rx(
        r"\b(?:online|offline|retail|web|mobile|app|stores?|channels?|wholesale|e-?commerce"
        r"|resellers?|direct)\b"
    ),
}
_PLACES = r"japan|tokyo|london|new york|berlin|paris|sydney|pacific|eastern|central|mountain"
CONVENTIONS = [
    (
        "currency",
        _rx(
            r"\b(?:eur|usd|gbp|sek|nok|dkk|chf|jpy|aud|cad|euros?|dollars?|pounds sterling"
            r"|kronor|kroner|currenc(?:y|ies)|fx|exchange rates?)\b"
        ),
    ),
    (
        "calendar",
        _rx(
            r"\b(?:fiscal|calendar|financial)\s+(?:years?|quarters?|months?|weeks?|calendar)"
            r"\b|\b(?:quarters?|weeks?|years?|fy)\s+(?:that\s+)?(?:start|begin|open|run|end)s?\b"
            r"|\biso\s+weeks?\b|\bfy\d*\b|\bweek starts?\b"
        ),
    ),
    (
        "timezone",
        _rx(
            r"\btime\s*-?zones?\b|\b(?:utc|gmt|cet|cest|est|edt|pst|pdt|jst|ist)\b"
            rf"|\b(?:local|{_PLACES}|server|user'?s?)\s+time\b"
        ),
    ),
    (
        "number format",
        _rx(
            r"\bround(?:ed|ing)?\b|\bdecimals?\b|\bdecimal places\b|\bsignificant"
            r"\b|\bin (?:thousands|millions|billions)\b|\b(?:thousands|millions) separator"
            r"|\bas (?:a )?percentages?\b"
        ),
    ),
    (
        "units",
        _rx(
            r"\b(?:metric|imperial|kilomet(?:er|re)s?|miles?|kilograms?|kgs?|lbs|litres?"
            r"|liters?|gallons?|units? of measure|[kmgt]wh|kw|mw|watts?|per (?:1,?000|100"
            r"|thousand|million))\b"
        ),
    ),
    (
        "preference",
        _rx(
            r"\b(?:use|show|report|display|count|measure|quote)\s+[\w' -]{2,30}?,?\s+"
            r"(?:not|instead of|rather than)\s+\w"
        ),
    ),
    (
        "naming",
        _rx(
            r"\bcall\s+(?:it|them|this|that|those|the|our)\b|\brefer to\b[^.;?!]*\bas\b"
            r"|\brename\b|\blabel\b[^.;?!]*\bas\b|\bname (?:it|them)\b"
        ),
    ),
    (
        "chart style",
        _rx(
            r"\b(?:bar|line|pie|stacked|area|scatter)\s+charts?\b|\bcolou?rs?\b"
            r"|\blog(?:arithmic)? scale\b|\blegend\b"
        ),
    ),
    (
        "period",
        _rx(
            r"\b(?:last|past|trailing|rolling)\s+\d+\s+(?:days|weeks|months|quarters|years)\b"
            r"|\b(?:ytd|year to date|month to date|mtd)\b"
        ),
    ),
]
FIRST_CONVENTIONS = frozenset({"currency", "calendar", "timezone"})
CUE_ONLY = frozenset({"chart style", "period"})
STOP_WORDS = _set(
    "a an the all any our my your their its of for in on from to with by and or as at it this "
    "that these those them everything anything everyone please again back too well also now "
    "then just only any more anymore from now on going forward rest data numbers results "
    "report reports query queries analysis analyses chart charts table tables"
)
OBJECT_END = _rx(
    r"\b(?:from|in|for|when|while|unless|until|so|because|since|and then|going|across|always"
    r"|everywhere|throughout|anymore|again|please|too|as well|if|but|before|after|into|out"
    r"|back)\b|\s[-\u2013\u2014]+\s|[(:@\"]"
)
