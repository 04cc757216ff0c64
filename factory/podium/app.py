"""The Podium web app: server-rendered pages over the catalog and the registry, no JavaScript.

Pages: `/` (namespaces and tables), `/t/<namespace.table>` (a snapshot's rows: columns, filters,
sorting, paging, time travel), `/t/<table>/row/<n>` (one sample rendered by kind), `/t/<table>/diff`,
`/t/<table>/sql` (one read-only SELECT, posted, run in a worker process), `/generate` (completions
side by side), `/prompts` (save a custom prompt) and `/checkpoint/<sha256>` (the link Dagster's
metadata gives). Every value is
escaped by the templates; the Content-Security-Policy forbids scripts anyway.
"""

from __future__ import annotations

import logging
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.prompts import TABLE as PROMPTS_TABLE
from factory.data.prompts import save_prompt
from factory.errors import FactoryError
from factory.podium.body import MAX_BODY_BYTES, MAX_FORM_FIELDS, BodyLimit
from factory.podium.browse import OPERATORS, PAGE_SIZES, POSITION, Browser, Filter, PageQuery
from factory.podium.cells import Preview
from factory.podium.errors import Busy, NotFound, PodiumError
from factory.podium.conversation import sampled
from factory.podium.generate import LISTED, MAX_NEW_TOKENS, Generator, candidates, checked_temperature
from factory.podium.render import pygments_css, render_row
from factory.podium.sql import parse_params
from factory.registry.seam import Registry
from factory.registry import open_registry

log = logging.getLogger("factory.podium")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
PROMPT_COLUMNS = ("prompt", "question", "input", "text", "content", "code")
MAX_CHOSEN = 6
"""Checkpoints one generate request may compare."""
MAX_OFFSET = 10**12
MAX_DIGITS = 30
"""Digits a whole number from a request may have; Python refuses to parse past 4300, and no count here needs more."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Podium:
    """What the pages read: the catalog, the registry and the models loaded so far."""

    browser: Browser
    registry: Registry
    generator: Generator


def create_app(root: Path, *, host: str = "127.0.0.1", allowed_hosts: Sequence[str] = ()) -> Starlette:
    """The app over the factory store at `root` (`.factory`: catalog under iceberg/, registry under registry/).

    Requests must name this machine in their Host header (loopback; when `host` exposes the app,
    also its host name, addresses and `allowed_hosts`), which keeps DNS rebinding out.
    """
    config = CatalogConfig.at(root)
    registry = open_registry(root / "registry")
    podium = Podium(browser=Browser(open_catalog(config)), registry=registry, generator=Generator(registry))
    templates = jinja2.Environment(loader=jinja2.PackageLoader("factory.podium", "templates"), autoescape=True,
                                   undefined=jinja2.StrictUndefined)
    templates.globals.update(url=_url, pygments_css=pygments_css(), position=POSITION)
    templates.tests["preview"] = lambda value: isinstance(value, Preview)

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = templates.get_template(template).render(request=request, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def index(request: Request) -> Response:
        namespaces = []
        for namespace in podium.browser.namespaces():
            try:
                names = podium.browser.tables(namespace)
            except PodiumError as e:
                namespaces.append((namespace, [(namespace, None, str(e))]))
                continue
            tables = []
            for name in names:
                try:
                    tables.append((name, podium.browser.info(name), None))
                except PodiumError as e:
                    tables.append((name, None, str(e)))
            namespaces.append((namespace, tables))
        return page(request, "index.html", namespaces=namespaces)

    def table(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            info = podium.browser.info(name)
        except NotFound as e:
            if name != PROMPTS_TABLE:
                raise
            raise NotFound("no custom prompts are saved yet: write or pick a prompt on the Generate page and save it") from e
        snapshot = info.snapshot(request.query_params.get("snapshot"))
        query = _page_query(request.query_params)
        result = podium.browser.page(name, snapshot.id, query)
        return page(request, "table.html", info=info, snapshot=snapshot, page=result, operators=list(OPERATORS),
                    columns=podium.browser.columns_at(name, snapshot.id),
                    sizes=PAGE_SIZES, params=request.query_params, sql=request.query_params.get("q", ""))

    def row(request: Request) -> Response:
        name = request.path_params["name"]
        info = podium.browser.info(name)
        snapshot = info.snapshot(request.query_params.get("snapshot"))
        position = _int(request.path_params["position"], "the row number")
        values = podium.browser.row(name, snapshot.id, position)
        fields = render_row(values, full=frozenset(request.query_params.getlist("full")))
        prompt_column = next((c for c in PROMPT_COLUMNS if isinstance(values.get(c), str)), "")
        return page(request, "row.html", info=info, snapshot=snapshot, position=position, fields=fields,
                    rows=snapshot.rows, prompt_column=prompt_column, params=request.query_params)

    def diff(request: Request) -> Response:
        name = request.path_params["name"]
        info = podium.browser.info(name)
        after = info.snapshot(request.query_params.get("to"))
        earlier = [s for s in info.snapshots if s.timestamp < after.timestamp]  # newest first
        default_before = next((s for s in earlier if s.refs), earlier[0] if earlier else after)  # the previous version, by default
        before = info.snapshot(request.query_params.get("from") or str(default_before.id))
        result = podium.browser.diff(name, before.id, after.id)
        return page(request, "diff.html", info=info, before=before, after=after, diff=result)

    async def sql(request: Request) -> Response:
        # Running a query is a POST, which SameOrigin checks: a GET (any page can make a browser send one) shows the form only.
        form = await _text_form(request) if request.method == "POST" else request.query_params
        name = request.path_params["name"]
        info = await run_in_threadpool(podium.browser.info, name)
        snapshot = info.snapshot(str(form.get("snapshot", "")) or request.query_params.get("snapshot"))
        text = str(form.get("q", "")).strip() or "SELECT * FROM t LIMIT 20"
        params_text = str(form.get("params", ""))
        error, result = "", None
        if request.method == "POST":
            try:
                result = await run_in_threadpool(podium.browser.sql, name, snapshot.id, text, parse_params(params_text))
            except (NotFound, Busy):
                raise
            except PodiumError as e:
                error = str(e)
        return page(request, "sql.html", info=info, snapshot=snapshot, text=text, params_text=params_text, result=result,
                    error=error, status=400 if error else 200)

    async def generate(request: Request) -> Response:
        form = await _text_form(request) if request.method == "POST" else request.query_params
        chosen = list(dict.fromkeys(form.getlist("ckpt")))
        prompt, source, reply = str(form.get("prompt", "")), str(form.get("source", "")), str(form.get("reply", ""))
        chat = form.get("chat") == "on"
        sample = form.get("table"), form.get("snapshot"), form.get("row"), form.get("column")
        if not prompt and all(sample):
            table_name, snapshot_ref, position, column = (str(v) for v in sample)
            info = podium.browser.info(table_name)
            snapshot = info.snapshot(snapshot_ref)
            values = podium.browser.row(table_name, snapshot.id, _int(position, "row"))
            if not isinstance(values.get(column), str):
                raise PodiumError(f"{table_name} row {position} has no text column {column!r} to use as a prompt")
            prompt, source = values[column], f"{table_name}@{snapshot.id}#{position}/{column}"
            if (conversation := sampled(prompt)) is not None:  # a chat row: the turns before its last reply prompt the models
                prompt, reply, chat = conversation.prompt, conversation.reply, True
        new_tokens = _int(str(form.get("new_tokens", "48")), "new tokens")
        temperature = checked_temperature(_float(str(form.get("temperature", "0")), "temperature"))
        completions, error = [], ""
        if request.method == "POST":
            if not chosen:
                error = "choose at least one checkpoint or model"
            elif len(chosen) > MAX_CHOSEN:
                error = f"choose at most {MAX_CHOSEN} checkpoints or models at once; {len(chosen)} were chosen"
            else:
                try:
                    completions = await run_in_threadpool(
                        lambda: [podium.generator.complete(podium.generator.find(sha), prompt, new_tokens, temperature, chat=chat)
                                 for sha in chosen]
                    )
                except PodiumError as e:
                    error = str(e)
        return page(request, "generate.html", candidates=candidates(podium.registry, chosen), listed=LISTED, chosen=chosen, prompt=prompt, source=source,
                    chat=chat, reply=reply, new_tokens=new_tokens, temperature=temperature, max_new_tokens=MAX_NEW_TOKENS, completions=completions,
                    error=error, saved=request.query_params.get("saved", ""), status=400 if error else 200)

    async def prompts(request: Request) -> Response:
        form = await _text_form(request)
        tag = await run_in_threadpool(save_prompt, podium.browser.catalog, str(form.get("prompt", "")), str(form.get("note", "")),
                                      str(form.get("source", "")) or "custom")
        return RedirectResponse(_url(f"/t/{PROMPTS_TABLE}", snapshot=tag, saved=tag), status_code=303)

    def checkpoint(request: Request) -> Response:
        sha = request.path_params["sha256"]
        podium.generator.find(sha)
        return RedirectResponse(_url("/generate", ckpt=sha), status_code=303)

    async def not_found(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", status=404, message=str(exc))

    async def bad_request(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", status=400, message=str(exc))

    async def not_done(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", status=409, message=str(exc))

    async def busy(request: Request, exc: Exception) -> Response:
        response = page(request, "error.html", status=503, message=str(exc))
        response.headers["Retry-After"] = "5"
        return response

    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = f"there is no page at {request.url.path}; start from the table list" if exc.status_code == 404 else exc.detail
        return page(request, "error.html", status=exc.status_code, message=message)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("podium: %s %s failed", request.method, request.url.path)
        return page(request, "error.html", status=500, message=f"Podium could not show this page ({type(exc).__name__}: {exc}); "
                    "the server's log has the details")

    routes = [
        Route("/", index),
        Route("/t/{name}", table),
        Route("/t/{name}/row/{position}", row),
        Route("/t/{name}/diff", diff),
        Route("/t/{name}/sql", sql, methods=["GET", "POST"]),
        Route("/generate", generate, methods=["GET", "POST"]),
        Route("/prompts", prompts, methods=["POST"]),
        Route("/checkpoint/{sha256}", checkpoint),
    ]
    hosts = [*LOOPBACK, "[::1]", *allowed_hosts]
    if host not in LOOPBACK:
        hosts += [host, *_names_of_this_machine()]
    return Starlette(
        routes=routes,
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts), Middleware(BodyLimit), Middleware(SameOrigin)],
        exception_handlers={NotFound: not_found, Busy: busy, PodiumError: bad_request, FactoryError: not_done, HTTPException: http_error,
                            Exception: server_error},
    )


def _names_of_this_machine() -> list[str]:
    """The host name, fully qualified name and addresses people may reach this machine by."""
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return sorted(names)


class SameOrigin:
    """Refuses a POST that a page of another site (or an opaque origin, `null`) sent: it cannot save prompts through a user's browser.

    A browser names the origin of every form post; a post without one is accepted only when the
    browser says it came from this site (`Sec-Fetch-Site: same-origin`).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode()
            host = headers.get(b"host", b"").decode()
            same_site = headers.get(b"sec-fetch-site", b"").decode() == "same-origin"
            if not (origin and urllib.parse.urlsplit(origin).netloc == host) and not (not origin and same_site):
                await HTMLResponse("cross-origin form posts are refused", status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _url(path: str, params: QueryParams | Mapping[str, Any] | None = None, **changes: Any) -> str:
    """`path` with the query `params`, some replaced by `changes` (a None value drops the key; a list repeats it)."""
    items: list[tuple[str, Any]] = list(params.multi_items()) if isinstance(params, QueryParams) else list((params or {}).items())
    items = [(k, v) for k, v in items if k not in changes]
    for key, value in changes.items():
        if isinstance(value, list | tuple):
            items.extend((key, v) for v in value)
        elif value is not None:
            items.append((key, value))
    quoted = urllib.parse.quote(path, safe="/.@-_~")
    return f"{quoted}?{urllib.parse.urlencode(items)}" if items else quoted


def _page_query(params: QueryParams) -> PageQuery:
    filters = tuple(
        Filter(column=c, operator=o, value=v)
        for c, o, v in zip(params.getlist("fc"), params.getlist("fo"), params.getlist("fv"), strict=False) if c
    )
    size = _int(params.get("size", "50"), "page size")
    if size not in PAGE_SIZES:
        raise PodiumError(f"page size must be one of {', '.join(map(str, PAGE_SIZES))}, not {size}")
    offset = _int(params.get("offset", "0"), "offset")
    if not 0 <= offset <= MAX_OFFSET:
        raise PodiumError(f"the offset must be between 0 and {MAX_OFFSET}, not {offset}")
    return PageQuery(columns=tuple(params.getlist("col")), filters=filters, sort=params.get("sort", ""),
                     descending=params.get("desc") == "1", offset=offset, size=size)


async def _text_form(request: Request) -> FormData:
    """A posted form whose fields are all text, at most MAX_FORM_FIELDS of them: an uploaded file is refused (400), never read
    as a value (`BodyLimit` has bounded the body before this reads it)."""
    try:
        form = await request.form(max_files=0, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_BODY_BYTES)
    except HTTPException as e:
        raise PodiumError(f"the form cannot be read ({e.detail}); Podium's forms take at most {MAX_FORM_FIELDS} text fields, "
                          "not uploaded files") from e
    for key, value in form.multi_items():
        if not isinstance(value, str):
            raise PodiumError(f"the form field {key!r} must be text, not an uploaded file")
    return form


def _int(text: str, what: str) -> int:
    if len(text.strip().lstrip("+-")) > MAX_DIGITS:
        raise PodiumError(f"{what} must be a whole number of at most {MAX_DIGITS} digits, not one of {len(text.strip())} characters")
    try:
        return int(text)
    except ValueError as e:
        raise PodiumError(f"{what} must be a whole number, not {text!r}") from e


def _float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError as e:
        raise PodiumError(f"{what} must be a number, not {text!r}") from e


def serve(root: Path, host: str = "127.0.0.1", port: int = 8765, allowed_hosts: Sequence[str] = ()) -> None:
    """Serve Podium until interrupted."""
    import uvicorn

    uvicorn.run(create_app(root, host=host, allowed_hosts=allowed_hosts), host=host, port=port, log_level="info")
