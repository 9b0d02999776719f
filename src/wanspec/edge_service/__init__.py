"""The edge as an OpenAI-compatible service (`wanspec edge`): FastAPI + uvicorn in front of a
resumable wanspec edge client. Floor 4, beside `wanspec.api` and `wanspec.cli`.

`text` renders chat prompts and streams text; `schemas` holds the request bodies and response
shapes; `app` the service and its routes; `cli` the command."""

from wanspec.edge_service.app import EdgeService, create_app
from wanspec.edge_service.text import TextStream, chat_continuation, chat_ids

__all__ = ["EdgeService", "TextStream", "chat_continuation", "chat_ids", "create_app"]
