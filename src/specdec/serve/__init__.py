"""``specdec serve``: an OpenAI-compatible HTTP server with speculative decoding inside.

app.py         the FastAPI app and its routes (``create_app(pair, ServeConfig)``)
engine.py      the worker thread that owns the models: one generation at a time, a bounded
               queue, cancellation between rounds
generation.py  request -> generation parameters -> the worker's job -> statistics fields
schemas.py     pydantic request/response shapes (field bounds = the CLI's rules)
errors.py      OpenAI-style error bodies
middleware.py  body-size limit and per-endpoint request counts (pure ASGI)
server.py      uvicorn with a connection guard (header deadline, connection bound), bounded
               logs and a drain on shutdown (``run``, ``make_server``)
metrics.py     server-wide counters in the Prometheus text format

Needs the ``serve`` extra: ``pip install 'specdec[serve]'``.
"""

from specdec.serve.app import ServeConfig, create_app
from specdec.serve.generation import ServeSettings

__all__ = ["ServeConfig", "ServeSettings", "create_app"]
