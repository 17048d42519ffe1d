"""An example analytics agent: a LangGraph workflow with conversation memory and a checkpointer.

    python -m examples.analytics_agent            # the scripted three-run conversation
    python -m examples.analytics_agent --async    # the same with the async graph
    python -m examples.analytics_agent --finalize enqueue   # turns saved by a running worker

intent -> SQL -> human approval (interrupt) -> run query -> visualize -> finalize, over a small
sales dataset in its own Postgres schema. See README, "LangGraph: the example analytics agent".
"""
