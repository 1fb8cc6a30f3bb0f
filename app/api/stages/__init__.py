"""The stages of one request through the ingress, in the order ``app.api.pipeline``
runs them:

authenticate → parse → route → admit → dispatch → respond

Each stage is a module with one entry that takes what it needs of the request's
context (``app.api.flow.Call``) and returns the next state — or raises, and the
pipeline answers with the one OpenAI-shaped error (``app.api.errors``). ``parse``,
``dispatch`` and ``respond`` have one entry per endpoint; an endpoint
(``app.api.endpoints``) is the slice that names them.
"""
