"""Serving an exported engine: ``Engine`` (continuous batching on a scheduler thread over
``exporter.export_engine``'s artifact), the requests it streams (``Request``) and its errors."""
from .engine import Engine
from .requests import QueueFull, Request, RequestError

__all__ = ["Engine", "Request", "RequestError", "QueueFull"]
