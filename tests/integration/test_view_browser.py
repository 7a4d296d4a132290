"""The HTML report in a real headless Chromium (Debian's `chromium`, driven by playwright; no `playwright install`).

Loads with no console errors; the table lists the expected count and renders only the rows in view; filters and
sorting change what is listed; clicking a trajectory shows its turns with model and tool spans; hostile tool output
stays text; a screenshot is written. Skips with a reason when playwright or Chromium is missing, unless
AGENTRL_REQUIRE_BROWSER=1 (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.types import Status, Trajectory
from agentrl.view import write_report
from agentrl.view.browser import CLICK_JS, missing_reason, open_report
from agentrl.view.synthetic import trajectories

REASON = missing_reason()
if REASON and os.environ.get("AGENTRL_REQUIRE_BROWSER") == "1":
    pytest.fail(f"AGENTRL_REQUIRE_BROWSER=1 but {REASON}", pytrace=False)
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"browser test: {REASON}")

HOSTILE = "</script><script>window.pwned = 1</script><img src=x onerror=\"window.pwned=2\">"
N = 300


@pytest.fixture(scope="module")
def trajs() -> list[Trajectory]:
    out = list(trajectories(N, steps=3, seed=11))
    turn = out[7].turns[0]
    result = turn.tool_results[0].model_copy(update={"output": HOSTILE})
    out[7] = out[7].model_copy(update={"turns": [turn.model_copy(update={"tool_results": [result]}),
                                                 *out[7].turns[1:]]})
    return out


@pytest.fixture(scope="module")
def report(trajs: list[Trajectory], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("view") / "report.html"
    write_report(path, trajs, title="browser test")
    return path


def _row_ids(page) -> list[str]:  # type: ignore[no-untyped-def]
    return page.eval_on_selector_all("#rows .row", "rows => rows.map(r => r.firstElementChild.textContent)")


def test_loads_without_errors_and_lists_every_trajectory(report: Path, trajs: list[Trajectory],
                                                         tmp_path: Path) -> None:
    with open_report(report) as (page, probe):
        assert page.inner_text("#count") == f"{N} of {N} trajectories"
        shown = _row_ids(page)
        assert 0 < len(shown) < N, "the table must render only the rows in view"
        assert shown == [t.id for t in trajs[:len(shown)]]
        page.eval_on_selector("#vp", "vp => vp.scrollTop = vp.scrollHeight")
        page.wait_for_function(f"() => [...document.querySelectorAll('#rows .row')].some("
                               f"r => r.firstElementChild.textContent === {trajs[-1].id!r})")
        assert page.locator("svg.plot").count() >= 4 * 3  # four histograms per step
        assert page.locator(".stepblock:not([hidden])").count() == 1
        page.select_option("#step-sel", "0")
        assert page.get_attribute('.stepblock[data-step="0"]', "hidden") is None
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=False)
        assert probe.errors == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_clicking_a_row_shows_its_turns(report: Path, trajs: list[Trajectory], tmp_path: Path) -> None:
    with open_report(report) as (page, probe):
        page.click("#rows .row >> nth=7")
        t = trajs[7]
        page.wait_for_selector("#detail .turn")
        assert t.id in page.inner_text("#detail h2")
        assert page.locator("#detail .turn").count() == len(t.turns)
        assert page.locator("#detail .span-model").count() == len(t.turns)
        assert page.locator("#detail .span-tool").count() == sum(1 for turn in t.turns if turn.env_len)
        strip = page.eval_on_selector_all("#detail .strip > span", "s => s.map(x => [x.className, x.style.flexGrow])")
        assert [[cls, int(n)] for cls, n in strip] == [["m" if m else "e", n] for m, n in _runs(t.env_mask)]
        first = page.inner_text("#detail .turn >> nth=0")
        assert f"weights v{t.turns[0].weight_version}" in first and f"model · {t.turns[0].model_len} tokens" in first
        assert HOSTILE in page.inner_text("#detail .result >> nth=0")  # shown as text ...
        assert page.evaluate("() => window.pwned") is None  # ... never run
        assert page.evaluate(CLICK_JS, 3) >= 0 and trajs[3].id in page.inner_text("#detail h2")
        page.locator("#detail").screenshot(path=str(tmp_path / "detail.png"))
        assert probe.errors == []


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1][1] += 1
        else:
            out.append([m, 1])
    return [(m, n) for m, n in out]


def test_filters_and_sorting(report: Path, trajs: list[Trajectory]) -> None:
    with open_report(report) as (page, probe):
        page.select_option("#f-status", "ok")
        n_ok = sum(t.status is Status.ok for t in trajs)
        assert page.inner_text("#count") == f"{n_ok} of {N} trajectories"
        page.select_option("#f-status", "")
        page.fill("#f-rmin", "1")
        n_full = sum(t.reward is not None and t.reward >= 1 for t in trajs)
        assert page.inner_text("#count") == f"{n_full} of {N} trajectories"
        page.fill("#f-rmin", "")
        page.select_option("#f-step", "2")
        page.fill("#f-task", "task_001")
        want = [t.id for t in trajs if t.step == 2 and "task_001" in t.task_id]
        assert page.inner_text("#count") == f"{len(want)} of {N} trajectories"
        assert _row_ids(page) == want
        page.select_option("#f-step", "")
        page.fill("#f-task", "")
        page.click('#thead [data-key="reward"]')  # ascending, unscored (null) last
        ids = _row_ids(page)
        rewards = {t.id: t.reward for t in trajs}
        scored = sorted(r for r in rewards.values() if r is not None)
        assert [rewards[i] for i in ids] == scored[:len(ids)]
        assert probe.errors == []


# -- a training run's directory: behaviour snapshots and reward components ---------------------------------------

def _with_components(t: Trajectory) -> Trajectory:
    if t.reward is None:
        return t
    return t.model_copy(update={"reward_components": {"unit_tests": t.reward, "format": 1.0}})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory as the trainer writes it: trajectories.jsonl, snapshots.jsonl (two modes, three steps) and
    each step's snapshot rollouts under its checkpoint."""
    from agentrl.store import TrajectoryStore
    from agentrl.trainer.metrics import MetricsWriter
    from agentrl.trainer.snapshots import behaviour_row, snapshot_path

    run = tmp_path_factory.mktemp("run")
    with TrajectoryStore(run / "trajectories.jsonl") as store:
        store.append_group([_with_components(t) for t in trajectories(60, steps=3, seed=3)])
    writer = MetricsWriter(run / "snapshots.jsonl")
    for step in range(3):
        snap = [_with_components(t) for t in trajectories(8, steps=1, seed=100 + step)]
        path = snapshot_path(run / "checkpoints", step)
        path.parent.mkdir(parents=True, exist_ok=True)
        with TrajectoryStore(path) as store:
            store.append_group(snap)
        for mode in ("sampled", "greedy"):
            writer.write(behaviour_row(step, mode, snap, rollouts=str(path.relative_to(run)), time_s=1.0))
    return run


def test_run_dir_report_plots_snapshots_and_shows_components(run_dir: Path, tmp_path: Path) -> None:
    from agentrl.cli import main

    out = tmp_path / "run.html"
    assert main(["view", str(run_dir), "-o", str(out)]) == 0
    with open_report(out) as (page, probe):
        assert page.locator("#snapshots").count() == 1
        trends = page.locator(".snaptrends")
        assert trends.count() == 2  # sampled and greedy
        titles = page.eval_on_selector_all(".snaptrends svg.plot", "s => s.map(x => x.getAttribute('aria-label'))")
        for mode in ("sampled", "greedy"):
            for label in ("reward", "length (model tokens)", "format compliance"):
                assert f"{mode}: {label}" in titles
        assert page.locator("#snapshot-table tr").count() == 1 + 6
        assert page.locator(".snapblock:not([hidden])").count() == 1
        assert page.get_attribute('.snapblock[data-step="2"]', "hidden") is None
        page.select_option("#snap-step-sel", "0")
        assert page.get_attribute('.snapblock[data-step="0"]', "hidden") is None
        assert page.get_attribute('.snapblock[data-step="2"]', "hidden") is not None
        assert page.locator('.snapblock[data-step="0"] svg.plot').count() == 2  # reward and length histograms
        assert "reward component: format (mean)" in page.inner_text("#summary-table")
        page.click("#rows .row >> nth=0")
        page.wait_for_selector("#detail .components")
        assert "unit_tests" in page.inner_text("#detail .components")
        page.screenshot(path=str(tmp_path / "snapshots.png"), full_page=True)
        assert probe.errors == []
