"""Standing instructions: what the user set up for the rest of the thread, found without an LLM.

- `declared.py`: what an agent declared stands (`TurnSnapshot.standing_instructions`), verbatim.
- `detect.py`: finding an instruction in a turn's words, and its subject (the fallback).
- `patterns.py`: the vocabulary (cues, verbs, categories) as plain regular expressions.
- `sql_conditions.py`: the WHERE conditions the thread's queries applied.
- `sql_select.py`: the conventions their SELECT lists applied (a time zone, a formula).
- `standing.py`: the instructions in force while a fold reads its turns, one per subject.
- `in_force.py`: an LLM's summary lines, judged against what `standing.py` computed.
"""
