"""Looking at stored trajectories: the static HTML report (`html.py`, `plots.py`, `data.py`, `assets.py`) and the
terminal views of `agentrl replay / rescore / stats` (`terminal.py`). Imports only store, reward and types."""

from agentrl.view.html import ReportInfo, build_report, write_report

__all__ = ["ReportInfo", "build_report", "write_report"]
