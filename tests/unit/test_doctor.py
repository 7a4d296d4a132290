"""`agentrl doctor`: a machine without bubblewrap / Docker / kubeconfig is told so with the fix; exit codes follow
what the configured job needs; the kubernetes verbs match the RBAC manifests; engine URLs are probed for real."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import yaml

from agentrl.cli import main
from agentrl.cli import doctor

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No bwrap on PATH (an empty PATH), no Docker Engine, no kubeconfig."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def _rows(cfg_yaml: dict[str, Any] | None, tmp_path: Path) -> dict[str, doctor.Check]:
    path = None
    if cfg_yaml is not None:
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(cfg_yaml))
    cfg, out = doctor.load_job(path)
    return {r.name: r for r in doctor.run_checks(cfg, out)}


def test_missing_bwrap_fails_the_default_job_with_the_fix(bare_machine: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "bwrap not found on PATH" in out and "apt-get install -y bubblewrap" in out
    assert "FAIL (needed)" in out and "the job cannot run here" in out
    assert main(["doctor", "--quiet"]) == 1  # quiet still shows the table when something needed is missing
    assert "bwrap not found" in capsys.readouterr().out


def test_no_docker_no_kubeconfig_says_so_and_the_default_job_does_not_care(bare_machine: Path) -> None:
    rows = _rows({"sandbox": {"backend": {"type": "local", "unsafe_no_isolation": True}}}, bare_machine)
    docker_row, kube = rows["docker engine"], rows["kubernetes"]
    assert docker_row.status == doctor.NA and "no Docker Engine answers" in docker_row.detail
    assert "docker.io" in docker_row.fix and not docker_row.needed
    assert kube.status == doctor.NA and "no kubeconfig" in kube.detail and "KUBECONFIG" in kube.fix
    assert not rows["bubblewrap"].needed  # unsafe_no_isolation: the job does not need bubblewrap
    assert doctor.exit_code(list(rows.values())) == 0


def test_a_docker_job_fails_without_an_engine(bare_machine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = bare_machine / "job.yaml"
    job.write_text(yaml.safe_dump({"sandbox": {"backend": {"type": "docker"}}, "out": "x.jsonl"}))
    assert main(["doctor", "--config", str(job)]) == 1
    out = capsys.readouterr().out
    assert "no Docker Engine answers" in out and "FAIL (needed)" in out


def test_a_kubernetes_job_fails_without_a_kubeconfig(bare_machine: Path) -> None:
    rows = _rows({"sandbox": {"backend": {"type": "kubernetes"}}, "out": "x.jsonl"}, bare_machine)
    assert rows["kubernetes"].status == doctor.FAIL and rows["kubernetes"].needed
    assert doctor.exit_code(list(rows.values())) == 1


def test_bad_config_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("steps: 3\nsandboxx: {}\n")
    assert main(["doctor", "--config", str(job)]) == 2
    assert "sandboxx" in capsys.readouterr().err


class _Authz:
    def __init__(self, deny: set[tuple[str, str]]) -> None:
        self.deny, self.seen = deny, []

    def create_self_subject_access_review(self, body: dict[str, Any], **_: Any) -> Any:
        attrs = body["spec"]["resourceAttributes"]
        self.seen.append(attrs)
        return SimpleNamespace(status=SimpleNamespace(allowed=(attrs["verb"], attrs["resource"]) not in self.deny))


def test_access_review_asks_every_verb_and_names_the_denied_ones() -> None:
    authz = _Authz({("patch", "pods")})
    row = doctor._access_review(authz, "agentrl", "pods", needed=True)
    assert len(authz.seen) == len(doctor.K8S_PERMISSIONS["pods"]) and all(a["namespace"] == "agentrl"
                                                                          for a in authz.seen)
    assert row.status == doctor.FAIL and "patch pods" in row.detail and "k8s/base" in row.fix
    assert doctor._access_review(_Authz(set()), "agentrl", "pods", needed=True).status == doctor.OK


def _rbac_rules(path: Path) -> set[tuple[str, str, str, str | None]]:
    out = set()
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "Role":
            for rule in doc["rules"]:
                names = rule.get("resourceNames") or [None]
                out |= {(g, r, v, n) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
                        for n in names}
    return out


def test_k8s_permissions_match_the_rbac_manifests() -> None:
    assert set(doctor.K8S_PERMISSIONS["pods"]) == _rbac_rules(ROOT / "k8s/base/rbac.yaml")
    assert set(doctor.K8S_PERMISSIONS["agent-sandbox"]) == _rbac_rules(ROOT / "k8s/overlays/agent-sandbox/rbac.yaml")


@pytest.fixture
def sglang_like(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    served = tmp_path / "served"
    served.mkdir()
    (served / "tokenizer.json").write_text('{"vocab": 1}')
    answers = {"/model_info": {"model_path": str(served), "tokenizer_path": str(served)},
               "/server_info": {"version": "0.5.23"}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = answers.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode() if body else b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", served
    server.shutdown()
    server.server_close()


def test_engine_url_version_model_and_tokenizer_match(sglang_like: tuple[str, Path], tmp_path: Path) -> None:
    url, served = sglang_like
    same, other = tmp_path / "same", tmp_path / "other"
    for d, text in ((same, '{"vocab": 1}'), (other, '{"vocab": 2}')):
        d.mkdir()
        (d / "tokenizer.json").write_text(text)
    ok = doctor.check_engine_url(url, "sglang", str(same))
    assert ok.status == doctor.OK and "SGLang 0.5.23" in ok.detail and str(served) in ok.detail
    assert "matches engine.model" in ok.detail
    bad = doctor.check_engine_url(url, "sglang", str(other))
    assert bad.status == doctor.FAIL and "MISMATCH" in bad.detail and bad.fix
    assert "n/a" in doctor.check_engine_url(url, "sglang", None).detail
    down = doctor.check_engine_url("http://127.0.0.1:9", "sglang", None)
    assert down.status == doctor.FAIL and "not reachable" in down.detail and down.needed
