"""Size and load time of the HTML report (`agentrl view`) for large trajectory files, measured in headless Chromium.

For each case: write N synthetic trajectories (agentrl.view.synthetic: hermes tool calls, pytest-like outputs,
spread over steps) as a store file, read it back and write the report (the same code path as `agentrl view`), then
open the report in Chromium and record: the time until the trajectory table is rendered, DOMContentLoaded, the
`load` event (all from navigation start, as the page measures them), the wall time of the load seen by the driver,
the time to show one trajectory's turns after a click, and the time to apply a status filter. Prints a markdown
table. Targets (issue 7): a 5,000-trajectory file renders in < 5 s and the HTML stays < 50 MB.

    python benchmarks/bench_view.py [--n 5000] [--steps 10] [--big-output-chars 20000] [--keep DIR]

Needs the `playwright` Python package and a system Chromium (`apt-get install chromium`); no `playwright install`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from agentrl.replay import load, write_trajectories
from agentrl.view import write_report
from agentrl.view.browser import CLICK_JS, FILTER_JS, TIMINGS_JS, missing_reason, open_report
from agentrl.view.synthetic import trajectories


def run_case(name: str, n: int, steps: int, output_chars: int, workdir: Path) -> dict[str, object]:
    stem = name.replace(" ", "_")
    store = workdir / f"{stem}.jsonl"
    t0 = time.perf_counter()
    write_trajectories(store, list(trajectories(n, steps=steps, seed=1, output_chars=output_chars)))
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = load(store)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    info = write_report(workdir / f"{stem}.html", loaded.trajectories, errors=loaded.errors)
    write_s = time.perf_counter() - t0
    row: dict[str, object] = {"case": name, "trajectories": n, "jsonl_mb": store.stat().st_size / 1e6,
                              "html_mb": info.bytes / 1e6, "max_chars": info.max_chars, "gen_s": gen_s,
                              "read_s": load_s, "write_s": write_s}
    with open_report(info.path) as (page, probe):
        row.update(page.evaluate(TIMINGS_JS))
        row["wall_load_ms"] = probe.wall_load_ms
        row["count"] = page.inner_text("#count")
        row["click_ms"] = page.evaluate(CLICK_JS, n // 2)
        row["turns_shown"] = page.locator("#detail .turn").count()
        row["filter_ms"] = page.evaluate(FILTER_JS, "ok")
        row["console_errors"] = len(probe.errors)
    return row


COLUMNS = [("case", "{}"), ("trajectories", "{:,}"), ("jsonl_mb", "{:.1f}"), ("html_mb", "{:.1f}"),
           ("max_chars", "{}"), ("read_s", "{:.2f}"), ("write_s", "{:.2f}"), ("table_ms", "{:.0f}"),
           ("dom_content_loaded_ms", "{:.0f}"), ("load_ms", "{:.0f}"), ("wall_load_ms", "{:.0f}"),
           ("click_ms", "{:.1f}"), ("filter_ms", "{:.1f}"), ("console_errors", "{}")]


def markdown(rows: list[dict[str, object]]) -> str:
    head = "| " + " | ".join(c for c, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(fmt.format(r[c]) if r.get(c) is not None else "–" for c, fmt in COLUMNS) + " |"
            for r in rows]
    return "\n".join([head, sep, *body])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--big-output-chars", type=int, default=20000, help="tool output size of the stress case")
    ap.add_argument("--keep", type=Path, help="keep the files in this directory")
    a = ap.parse_args()
    reason = missing_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        workdir = a.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = [run_case("typical", a.n, a.steps, 0, workdir),
                run_case(f"outputs {a.big_output_chars // 1000} KB", a.n, a.steps, a.big_output_chars, workdir)]
    print(markdown(rows))
    for r in rows:
        print(f"{r['case']}: table shows {r['count']!r}; click showed {r['turns_shown']} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
