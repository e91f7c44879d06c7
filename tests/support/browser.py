"""A real headless browser (Debian's chromium, driven by Playwright) on the operator's dashboard,
recording every request the page makes and every error its JavaScript reports: for the
dashboard's test and the screenshots in docs/SERVER.md."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field

from playwright.sync_api import Browser, ConsoleMessage, Page, Request, sync_playwright

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAPTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}  # a phone held upright, in CSS pixels


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    if CHROMIUM is None:
        raise RuntimeError(
            "no chromium: server/monitoring/ensure-debian-package.sh chromium chromium installs Debian's"
        )
    with sync_playwright() as p:
        # Chromium's sandbox needs user namespaces, which a root container's Chromium cannot use.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    """A page, the URLs it requested and what its JavaScript reported as errors."""

    page: Page
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def watched_page(browser: Browser, password: str | None, viewport: dict[str, int] = LAPTOP) -> Watched:
    """A new page in its own context; ``password``: what the browser answers the server's Basic
    challenge with (None: it has nothing to answer)."""
    credentials = {"username": "operator", "password": password} if password is not None else None
    context = browser.new_context(http_credentials=credentials, viewport=viewport)  # type: ignore[arg-type]
    watched = Watched(context.new_page())

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            watched.errors.append(message.text)

    def request(r: Request) -> None:
        watched.requests.append(r.url)

    watched.page.on("console", console)
    watched.page.on("pageerror", lambda exc: watched.errors.append(str(exc)))
    watched.page.on("request", request)
    return watched
