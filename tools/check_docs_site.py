"""Open the built documentation site in headless Chromium and check it as a reader meets it.

Builds the site (``mkdocs build --strict``) into a temporary folder, or takes ``--site DIR``,
serves it on 127.0.0.1, and drives Chromium through its DevTools protocol over a pipe (no
driver, no extra Python package). Checks: every page of mkdocs.yml's nav is in the navigation
and opens with its title and no script error; search finds a term and the result page highlights
it; code blocks are highlighted; every link inside the site resolves (page and anchor); and no
request leaves the site (Chromium's proxy is a local recorder that refuses everything, and the
page's own requests are listed). Exit status 0 when all hold, 1 with one line per failure.

    python tools/check_docs_site.py                       # needs mkdocs (the dev extra)
    python tools/check_docs_site.py --site site --screenshot index.png

Chromium: Debian's ``chromium`` package (``apt-get install chromium``), or ``--chromium PATH``.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import functools
import html.parser
import http.server
import json
import os
import pathlib
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEARCH_TERM = "workspace"


# ---- the site, served locally --------------------------------------------------------------

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(directory: pathlib.Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _Recorder(socketserver.StreamRequestHandler):
    """Chromium's proxy: records the request line of anything bound off the site, refuses it."""

    def handle(self) -> None:
        line = self.rfile.readline(4096).decode("latin-1").strip()
        if line:
            self.server.seen.append(line)  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def recorder() -> tuple[socketserver.ThreadingTCPServer, list[str]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Recorder)
    server.daemon_threads = True
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.seen  # type: ignore[attr-defined]


# ---- Chromium through the DevTools protocol on a pipe ------------------------------------------

# what Chromium answers when a page is replaced while a script is evaluated
_NAVIGATING = re.compile(r"navigated or closed|Cannot find context|Execution context was destroyed")


class Browser:
    """Chromium with ``--remote-debugging-pipe``: JSON messages ending in NUL on fds 3 and 4."""

    def __init__(self, chromium: str, proxy_port: int, profile: str) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        def child_fds() -> None:  # Chromium reads fd 3 and writes fd 4; move both out of the way first
            high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-extensions",
                 "--disable-default-apps", "--mute-audio", "--no-pings",
                 "--disable-domain-reliability", "--disable-client-side-phishing-detection",
                 "--disable-features=NetworkTimeServiceQuerying,AutofillServerCommunication,"
                 "OptimizationHints,OptimizationGuideModelDownloading,MediaRouter,"
                 "Translate,InterestFeedContentSuggestions,CertificateTransparencyComponentUpdater",
                 f"--user-data-dir={profile}",
                 f"--proxy-server=http://127.0.0.1:{proxy_port}", "--remote-debugging-pipe",
                 "--window-size=1280,900", "about:blank"]
        # preexec_fn runs before the child closes its other fds; pass_fds keeps 3 and 4
        self.proc = subprocess.Popen([chromium, *flags], preexec_fn=child_fds, pass_fds=(3, 4),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        session = self.session if session is None else session
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_event(self, method: str, since: int, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[since:]:
                if event.get("method") == method:
                    return event
            since = len(self.events)
            self.events.append(self._read_message(deadline))

    def open_page(self) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session="")
        attached = self.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                       "flatten": True}, session="")
        self.session = attached["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.send(f"{domain}.enable")
        # workers (the search index is fetched by one) report their requests too
        self.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False,
                                           "flatten": True})

    def goto(self, url: str) -> None:
        mark = len(self.events)
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", mark)

    def js(self, expression: str, timeout: float = 30.0) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"script failed: {reply['exceptionDetails'].get('text')}: "
                               f"{expression[:80]}")
        return reply["result"].get("value")

    def poll(self, expression: str, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression)
            except RuntimeError as error:
                # a navigation under way replaces the page's context: ask the next one
                if not _NAVIGATING.search(str(error)) or time.monotonic() > deadline:
                    raise
                value = None
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def screenshot(self, path: pathlib.Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close", session="", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


# ---- what the site should hold -------------------------------------------------------------

def nav_pages(mkdocs_yml: pathlib.Path) -> dict[str, str]:
    """mkdocs.yml's nav as {page path relative to the site root: title}."""
    import yaml  # mkdocs' own dependency

    class _Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may carry tags such as !ENV; the nav needs none of them
    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load(mkdocs_yml.read_text(), Loader=_Loader)
    pages: dict[str, str] = {}

    def walk(items: Any) -> None:
        for item in items:
            for title, value in item.items():
                if isinstance(value, list):
                    walk(value)
                else:
                    path = "" if value == "index.md" else value[:-len(".md")] + "/"
                    pages[path] = title
    walk(config["nav"])
    return pages


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)


def page_ids(url: str, cache: dict[str, set[str] | None]) -> set[str] | None:
    """The ids of the page at ``url`` (None when it does not load)."""
    if url not in cache:
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                parser = _Ids()
                parser.feed(reply.read().decode("utf-8", "replace"))
                cache[url] = parser.ids
        except urllib.error.URLError:
            cache[url] = None
    return cache[url]


# ---- the checks ------------------------------------------------------------------------------

def check(site: pathlib.Path, chromium: str, screenshot: pathlib.Path | None,
          browser_own: list[str]) -> list[str]:
    """Every failure found, one line each; ``browser_own`` gets the hosts Chromium itself asked
    for (refused by the recorder, no page's request)."""
    failures: list[str] = []
    pages = nav_pages(ROOT / "mkdocs.yml")
    server, base = serve(site)
    proxy, off_site = recorder()
    profile = tempfile.mkdtemp(prefix="pycudnn-docs-chromium-")
    browser = Browser(chromium, proxy.server_address[1], profile)
    try:
        browser.open_page()

        # navigation: every nav page is linked from the first page, opens, has its title
        browser.goto(base)
        linked = set(browser.js(
            "[...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]"
            ".map(a => a.href.split('#')[0])"))
        for path, title in pages.items():
            url = base + path
            if url not in linked:
                failures.append(f"navigation: {path or 'index'} ({title}) is not linked from {base}")
            browser.goto(url)
            state = browser.js("({title: document.title, h1: !!document.querySelector('article h1'),"
                               " active: [...document.querySelectorAll("
                               "'nav.md-nav--primary a.md-nav__link--active')].map(a => a.href)})")
            if not state["title"].startswith(title):
                failures.append(f"navigation: {url} is titled {state['title']!r}, not {title!r}")
            if not state["h1"]:
                failures.append(f"navigation: {url} has no heading")
            if url not in state["active"]:
                failures.append(f"navigation: {url} is not marked as the current page")
        browser.goto(base)
        first = sorted(pages)[1] if len(pages) > 1 else ""
        browser.js(f"document.querySelector('nav.md-nav--primary a[href$=\"{first}\"]').click()")
        if not browser.poll(f"location.href === {json.dumps(base + first)}", timeout=10):
            failures.append(f"navigation: clicking {first} in the menu did not open it")

        # search: the index loads (from the site), a term finds pages, the page marks the term
        browser.goto(base)
        browser.js("(() => { const q = document.querySelector('input.md-search__input');"
                   " document.querySelector('#__search').checked = true; q.focus();"
                   f" q.value = {json.dumps(SEARCH_TERM)};"
                   " for (const t of ['focus', 'input', 'keyup']) q.dispatchEvent(new Event(t,"
                   " {bubbles: true})); })()")
        found = browser.poll("[...document.querySelectorAll('.md-search-result__item a')]"
                             ".map(a => a.href)", timeout=20)
        if not found:
            failures.append(f"search: no result for {SEARCH_TERM!r}")
        else:
            if not all(href.startswith(base) for href in found):
                failures.append(f"search: results off the site: {found[:3]}")
            # a result inside a page carries the term to highlight (?h=); a whole page's may not
            marked = [href for href in found if f"h={SEARCH_TERM}" in href]
            if not marked:
                failures.append(f"search: no result asks its page to highlight {SEARCH_TERM!r}")
            else:
                browser.goto(marked[0])
                marks = browser.poll("[...document.querySelectorAll('article mark')]"
                                     ".map(m => m.textContent.toLowerCase())", timeout=10)
                if not marks or SEARCH_TERM not in marks:
                    failures.append(f"search: {marked[0]} does not highlight {SEARCH_TERM!r}")

        # highlighting: the quick start's Python block has coloured tokens
        browser.goto(base)
        colours = browser.js(
            "[...new Set([...document.querySelectorAll('.highlight code span')]"
            ".map(s => getComputedStyle(s).color))].length")
        if not colours or colours < 3:
            failures.append(f"highlighting: the first page's code has {colours} token colours")
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            browser.screenshot(screenshot)

        # links: every link inside the site leads to a page that exists, anchors included
        ids: dict[str, set[str] | None] = {}
        for path in pages:
            browser.goto(base + path)
            hrefs = browser.js("[...document.querySelectorAll('a[href]')].map(a => a.href)")
            for href in hrefs:
                if not href.startswith(base):
                    continue
                target, _, anchor = href.partition("#")
                found_ids = page_ids(target, ids)
                if found_ids is None:
                    failures.append(f"links: {base + path} links to {target}, which does not load")
                elif anchor and urllib.parse.unquote(anchor) not in found_ids:
                    failures.append(f"links: {base + path} links to {href}: no such anchor")

        # nothing loaded from another host, by any page or worker
        page_requests = [event["params"]["request"]["url"] for event in browser.events
                         if event.get("method") == "Network.requestWillBeSent"]
        for url in page_requests:
            if not url.startswith((base, "data:", "blob:", "about:")):
                failures.append(f"requests: a page asked for {url}")
        if not any(url.startswith(base + "search/") for url in page_requests):
            failures.append("requests: the search index was never seen loading (are workers "
                            "watched?)")
        # the recorder also refuses Chromium's own background services (updates, sign-in),
        # which no page asked for: counted, not failed
        asked = {urllib.parse.urlsplit(url).hostname for url in page_requests}
        for line in off_site:
            method, _, rest = line.partition(" ")
            target = rest.split(" ")[0]
            host = (target.split(":")[0] if method == "CONNECT"
                    else urllib.parse.urlsplit(target).hostname)
            if host in asked:
                failures.append(f"requests: off the site: {line}")
            else:
                browser_own.append(host or target)
        for event in browser.events:
            if event.get("method") == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                failures.append(f"script error: {str(text).splitlines()[0]}")
    finally:
        browser.close()
        server.shutdown()
        proxy.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    return list(dict.fromkeys(failures))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--site", type=pathlib.Path,
                        help="a built site to check (default: build one with mkdocs)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium",
                        help="the Chromium executable (default: %(default)s)")
    parser.add_argument("--screenshot", type=pathlib.Path, help="save the first page as PNG")
    args = parser.parse_args(argv)
    if not os.access(args.chromium, os.X_OK):
        print(f"check_docs_site: no Chromium at {args.chromium} (apt-get install chromium, or "
              "--chromium PATH)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="pycudnn-site-") as tmp:
        site = args.site
        if site is None:
            site = pathlib.Path(tmp) / "site"
            env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
            build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                                    "-d", str(site)], cwd=ROOT, env=env,
                                   capture_output=True, text=True)
            if build.returncode:
                print(build.stdout + build.stderr, file=sys.stderr)
                print("check_docs_site: mkdocs build --strict failed", file=sys.stderr)
                return 1
        started = time.monotonic()
        browser_own: list[str] = []
        failures = check(site.resolve(), args.chromium, args.screenshot, browser_own)
    for line in failures:
        print(f"check_docs_site: {line}", file=sys.stderr)
    pages = len(nav_pages(ROOT / "mkdocs.yml"))
    if browser_own:
        print(f"check_docs_site: Chromium's own background requests, refused (no page's): "
              f"{', '.join(sorted(set(browser_own)))}")
    print(f"check_docs_site: {pages} pages, {'FAILED' if failures else 'OK'} "
          f"({len(failures)} problems, {time.monotonic() - started:.1f} s in Chromium)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
