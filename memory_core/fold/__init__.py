"""Folding: the oldest unfolded turns of a thread go into its running summary.

- `folding.py`: one fold of one thread (the lease, the summarizer call, the compare-and-set).
- `tokens.py`: when a fold is due (the token trigger) and what it folds.
- `statements.py`: the fold's two writes as prebuilt statements.
- `outcome.py`: what an attempt returns, and the backoff between failed attempts.
- `publisher.py` and `sweep.py`: publishing `memory.fold_thread`, and republishing lost ones.
- `summarizer.py` and `prompts.py`: the LLM call and its prompt (built in, or from Langfuse).
- `llm_free.py`: the deterministic summary used without an LLM and as the fallback.
- `carry_forward.py`: the standing instructions carried across an LLM fold by code.
- `summary_tail.py`: the stored summary's verbatim artifact tail and its bound.

What a fold decides to keep as standing instructions lives in `memory_core.instructions`.
"""
