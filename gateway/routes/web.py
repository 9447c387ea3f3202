"""The web page: ``GET /`` and its files under ``/static/`` (script and styles as files, so the strict
Content-Security-Policy of ``gateway.guards`` holds), and the bundled example images under
``/examples/`` for its gallery. No key needed for these: the page asks for one when the API says 401.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

router = APIRouter(tags=["web"])
STATIC = Path(__file__).resolve().parent.parent / "static"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"  # the image copies them to /app/examples
REVALIDATE = {"Cache-Control": "no-cache"}  # an upgraded gateway's page is seen at the next load


class _RevalidatedFiles(StaticFiles):
    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(REVALIDATE)
        return response


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=REVALIDATE)


def mount_files(app: FastAPI) -> None:
    app.mount("/static", _RevalidatedFiles(directory=STATIC), name="static")
    app.mount("/examples", _RevalidatedFiles(directory=EXAMPLES, check_dir=False), name="examples")
