"""The playground at `/`: one static page (server/ui/: HTML, CSS and JavaScript shipped in the package; no
build step, no CDN) that chats with the served model over /v1/chat/completions and charts /metrics.
ROSEFAST_UI=0 turns it off (`/` is then a 404). The page never holds the API key: it asks the user for it."""
from pathlib import Path

from flask import Blueprint, Response, current_app
from werkzeug.exceptions import NotFound

bp = Blueprint("ui", __name__)
FILES = Path(__file__).resolve().parent / "ui"
TYPES = {"index.html": "text/html", "playground.js": "text/javascript", "playground.css": "text/css"}
# the page runs its own script and styles only, talks to this server only, and no model text can add a script
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _file(name):
    if not current_app.extensions["rosefast"].config.ui or name not in TYPES:
        raise NotFound()
    return Response((FILES / name).read_bytes(), mimetype=TYPES[name],
                    headers={"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff",
                             "Cache-Control": "no-cache"})


@bp.get("/")
def index():
    return _file("index.html")


@bp.get("/ui/<name>")
def asset(name):
    return _file(name)
