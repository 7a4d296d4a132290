"""Open a report in a real headless Chromium (through playwright) and measure it; used by the browser tests and by
`benchmarks/bench_view.py`. Not needed to write reports.

Uses the system's Chromium (Debian: `apt-get install chromium`), never a browser downloaded by `playwright install`:
the binary comes from `$AGENTRL_CHROMIUM`, else the first of `chromium`, `chromium-browser`, `google-chrome` on PATH.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import MissingDependencyError

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run"]
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    explicit = os.environ.get("AGENTRL_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def missing_reason() -> str | None:
    """Why a browser check cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install playwright; no `playwright install`)"
    if find_chromium() is None:
        return "no Chromium binary found (apt-get install chromium, or set AGENTRL_CHROMIUM)"
    return None


@dataclass
class PageProbe:
    """What one page load produced: console messages of every type, uncaught errors, timings in ms."""

    console: list[tuple[str, str]] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    wall_load_ms: float = 0.0

    @property
    def errors(self) -> list[str]:
        return self.page_errors + [text for kind, text in self.console if kind == "error"]


@contextmanager
def open_report(path: str | Path, *, width: int = 1400, height: int = 900) -> Iterator[tuple[Any, PageProbe]]:
    """Yield (playwright page, probe) with `path` loaded (the `load` event fired). Closes the browser after."""
    reason = missing_reason()
    if reason:
        raise MissingDependencyError(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), args=LAUNCH_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            probe = PageProbe()
            page.on("console", lambda m: probe.console.append((m.type, m.text)))
            page.on("pageerror", lambda e: probe.page_errors.append(str(e)))
            t0 = time.perf_counter()
            page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=120_000)
            probe.wall_load_ms = (time.perf_counter() - t0) * 1000
            yield page, probe
        finally:
            browser.close()


TIMINGS_JS = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  return {table_ms: window.agentrlReport ? window.agentrlReport.renderedAt : null,
          dom_content_loaded_ms: nav.domContentLoadedEventEnd, load_ms: nav.loadEventEnd};
}"""

CLICK_JS = """(i) => {
  const t0 = performance.now();
  window.agentrlReport.show(i);
  void document.getElementById("detail").offsetHeight;  // force layout so the cost of showing it is counted
  return performance.now() - t0;
}"""

FILTER_JS = """(status) => {
  const el = document.getElementById("f-status");
  const t0 = performance.now();
  el.value = status;
  el.dispatchEvent(new Event("input"));
  void document.getElementById("rows").offsetHeight;
  return performance.now() - t0;
}"""
