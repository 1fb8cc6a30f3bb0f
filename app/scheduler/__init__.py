"""Replica routing inside one pool (one LLMServer deployment): which replica answers.

llm-d style: a request (``RoutedRequest``) and the pool's replicas (``Candidates``) go
through filters, then weighted scorers (each 0–1 per replica), then a picker, in one
scheduler loop (``app.scheduler.loop``); the Ray Serve request router
(``app.scheduler.ray_router``) feeds it and books load. Every plugin module opens with
its rule and parameters.
"""
