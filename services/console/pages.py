"""The console's HTML: the pages (static HTML in the package, inside one shared layout) and error pages."""

from __future__ import annotations

import functools
from html import escape
from importlib import resources
from pathlib import Path
from typing import Final

from starlette.responses import HTMLResponse

# name → (title, the navigation entry it belongs to)
PAGES: Final = {
    "loops": ("Loops", "loops"),
    "loop": ("Loop", "loops"),
    "gates": ("Gates", "gates"),
    "tools": ("Tools", "tools"),
}


def static_dir() -> Path:
    return Path(str(resources.files("services.console") / "static"))


@functools.cache
def _layout() -> str:
    return (static_dir() / "layout.html").read_text(encoding="utf-8")


def render_page(page: str, title: str, body: str, nav: str = "") -> str:
    """A page: the shared layout (header, navigation, token bar) around ``body``."""
    out = _layout()
    for key, value in {"title": escape(title), "page": page, "body": body}.items():
        out = out.replace("{{" + key + "}}", value)
    for section in ("loops", "gates", "tools"):
        out = out.replace("{{nav_" + section + "}}", "active" if section == nav else "")
    return out


@functools.cache
def page_html(name: str) -> str:
    title, nav = PAGES[name]
    return render_page(name, title, (static_dir() / "pages" / f"{name}.html").read_text(encoding="utf-8"), nav)


def page_response(name: str) -> HTMLResponse:
    return HTMLResponse(page_html(name), headers={"Cache-Control": "no-store"})


def error_page(status: int, title: str, message: str) -> HTMLResponse:
    body = (
        f'<div class="error-page"><h1>{escape(title)}</h1><p id="error-message">{escape(message)}</p>'
        '<p><a href="/">back to the loops</a></p></div>\n'
    )
    return HTMLResponse(render_page("error", title, body), status_code=status)
