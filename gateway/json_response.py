"""The gateway's default JSON response: rendered by orjson (compact UTF-8, like Starlette's
``JSONResponse``, several times cheaper per body). FastAPI's own ``ORJSONResponse`` is deprecated
(it serialises typed routes through pydantic instead); this one serves the routes that return
plain dicts and the error bodies."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
