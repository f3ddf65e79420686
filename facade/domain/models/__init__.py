"""Model actors: the OpenAI-compatible chat-completions client (``client``), how a streamed
answer is assembled (``wire``), the tools a model is offered (``functions``), the text pieces
it streams as events (``deltas``), and the failures it can meet (``failures``).

The plan loop (``plans/model_actor.py``) and the session orchestrator
(``model_orchestrator.py``) are built on these; nothing here knows plans or sessions.
"""
