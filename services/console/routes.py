"""Every route of the console in one table, and the Starlette routes built from it.

Pages are plain GETs; every ``/api`` route is behind :func:`~services.console.guard.guarded`,
and its POSTs (the actions) count as state-changing: they must come from the console's own pages.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from services.console.api import ConsoleApi
from services.console.guard import Handler, guarded
from services.console.pages import static_dir


def route_table(api: ConsoleApi) -> list[tuple[str, str, Handler]]:
    """(method, path, handler) of every page and API route, in matching order."""
    loop = "/api/loops/{loop_id}"
    return [
        ("GET", "/", api.page("loops")),
        ("GET", "/loops/{loop_id}", api.page("loop")),
        ("GET", "/gates", api.page("gates")),
        ("GET", "/tools", api.page("tools")),
        ("GET", "/api/info", api.whoami),
        ("GET", "/api/loops", api.list_loops),
        ("POST", "/api/loops", api.start_loop),
        ("GET", "/api/stream", api.index_stream),
        ("GET", "/api/gates", api.list_gates),
        ("GET", "/api/tools", api.list_tools),
        ("GET", loop, api.get_loop),
        ("GET", f"{loop}/events", api.loop_events),
        ("GET", f"{loop}/events/{{seq:int}}", api.loop_event),
        ("GET", f"{loop}/stream", api.loop_stream),
        ("POST", f"{loop}/input", api.send_input),
        ("POST", f"{loop}/answer", api.answer_gate),
        ("POST", f"{loop}/interrupt", api.interrupt),
        ("POST", f"{loop}/close", api.close),
        ("POST", f"{loop}/fork", api.fork_loop),
        ("GET", f"{loop}/lineage", api.lineage),
        ("GET", f"{loop}/verify", api.verify),
    ]


def build_routes(api: ConsoleApi) -> list[BaseRoute]:
    """The table's routes (API handlers guarded), then the static files under ``/static``."""
    routes: list[BaseRoute] = []
    for method, path, handler in route_table(api):
        if path.startswith("/api/"):
            handler = guarded(handler, api.token, mutating=method != "GET")
        routes.append(Route(path, handler, methods=[method]))
    routes.append(Mount("/static", app=StaticFiles(directory=static_dir()), name="static"))
    return routes
