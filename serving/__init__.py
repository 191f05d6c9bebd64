"""Serving: the continuous-batching Engine over an exported engine bundle, and the servers that drive it.

On the server branch this file holds only the two errors the servers map to HTTP statuses; the engine branch
owns this module (``Engine``, ``RequestError``, ``QueueFull``): at merge its version replaces this one.
The servers (``openai_api``, ``launch``, ``ray_serve``) need the ``serve`` extra and are not imported here.
"""


class RequestError(ValueError):
    """A request the engine refuses (empty prompt, prompt too long, token outside the vocabulary, ...)."""


class QueueFull(RuntimeError):
    """The engine's queue of waiting requests is full: try again later."""
