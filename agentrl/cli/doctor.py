"""`agentrl doctor [--config job.yaml] [--quiet]`: what this machine offers agentrl, and how to fix what is missing.

Owns the checks and the one table they print (check, status, detail, fix): bubblewrap and user namespaces, cgroup
version and which limits are enforced (the local backend's own detection, `agentrl.sandbox.limits.detect`), Docker
Engine and the sandbox image, kubeconfig / context / namespace and a SelfSubjectAccessReview for every verb the
kubernetes backend uses, the SGLang / vLLM servers of the config (reachable, version, served model, tokenizer match
with the local checkpoint), GPUs, free disk, the embedded model cache. Each check knows whether the configured job
needs it; the exit code is 0 only if every needed check is not "fail" (default job: the demo's local engine + local
sandbox). Checks are blocking and bounded by short timeouts; this is a CLI command, not async code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"
HTTP_TIMEOUT_S = 5.0
MIN_FREE_GIB, LOW_FREE_GIB = 1.0, 5.0
BWRAP_FIX = "apt-get install -y bubblewrap (make demo / make test do it as root or with sudo -n)"
USERNS_FIX = ("allow unprivileged user namespaces: sysctl -w kernel.unprivileged_userns_clone=1 (Debian) or "
              "kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 24.04), or run as root")

# (api group, resource, verb, resource name) the kubernetes backend uses; mirrors k8s/base/rbac.yaml and
# k8s/overlays/agent-sandbox/rbac.yaml (a unit test keeps them equal).
K8S_PERMISSIONS: dict[str, tuple[tuple[str, str, str, str | None], ...]] = {
    "pods": (
        *(("", "pods", v, None) for v in ("get", "list", "watch", "create", "patch", "delete")),
        ("", "configmaps", "get", None), ("", "configmaps", "create", None),
        ("", "secrets", "get", "agentrl-sandbox-key"), ("", "secrets", "create", None),
    ),
    "agent-sandbox": (
        *(("extensions.agents.x-k8s.io", "sandboxclaims", v, None)
          for v in ("get", "list", "watch", "create", "delete")),
        *(("extensions.agents.x-k8s.io", r, v, None)
          for r in ("sandboxtemplates", "sandboxwarmpools") for v in ("get", "create", "update")),
        ("agents.x-k8s.io", "sandboxes", "get", None),
    ),
}


@dataclass
class Check:
    """One row of the table. `needed`: the configured job cannot run when this row is FAIL."""

    name: str
    status: str
    detail: str
    fix: str = ""
    needed: bool = False


# -- config -------------------------------------------------------------------------------------------------------

def load_job(path: Path | None) -> tuple[Any, Path]:
    """(RolloutConfig of the job, its output path) from a train or rollout YAML; defaults: the demo job."""
    from agentrl.config import RolloutConfig, load_config, read_yaml

    if path is None:
        return RolloutConfig(), Path.cwd()
    data = read_yaml(path)
    if "out" in data or "resume" in data:  # only rollout configs have these
        cfg = load_config(RolloutConfig, path)
        return cfg, cfg.out.parent
    from agentrl.trainer.config import TrainConfig

    train = load_config(TrainConfig, path)
    return train.rollout_config(), train.output_dir


# -- local sandbox ------------------------------------------------------------------------------------------------

def check_bwrap(needed: bool) -> Check:
    path = shutil.which("bwrap")
    if path is None:
        return Check("bubblewrap", FAIL, "bwrap not found on PATH (the local sandbox backend needs it)", BWRAP_FIX,
                     needed)
    version = _run([path, "--version"]).stdout.strip() or "unknown version"
    probe = _run([path, "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--",
                  "/bin/true"])
    if probe.returncode != 0:
        return Check("bubblewrap", FAIL, f"{version} at {path}, but it cannot create namespaces here: "
                     f"{(probe.stderr or '').strip()[:200]}", USERNS_FIX, needed)
    return Check("bubblewrap", OK, f"{version}; user, pid and net namespaces work", "", needed)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def cgroup_version(root: str = "/sys/fs/cgroup") -> str:
    if os.path.exists(f"{root}/cgroup.controllers"):
        return "v2"
    return "v1" if os.path.isdir(f"{root}/memory") else "none"


def check_limits(needed: bool) -> Check:
    from agentrl.sandbox import limits

    version = cgroup_version()
    quiet = logging.getLogger("agentrl.sandbox")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # detect() logs its choice; the table says it
    try:
        limiter = limits.detect()
    finally:
        quiet.setLevel(level)
    if limiter.mode != "rlimit":
        return Check("sandbox limits", OK, f"cgroup {version}: memory, pids and CPU enforced per sandbox "
                     f"({limiter.mode} under {', '.join(limiter.parents)})", "", needed)
    pids = "pids per uid (RLIMIT_NPROC)" if limiter.enforces_pids else "pids NOT enforced (host uid 0)"
    return Check("sandbox limits", WARN, f"cgroup {version} not writable here: rlimits only: memory per process "
                 f"(RLIMIT_AS), CPU as a time budget, {pids}",
                 "run as root with a writable /sys/fs/cgroup, or in a delegated cgroup v2 subtree "
                 "(systemd-run --user --scope -p Delegate=yes ...)", needed)


# -- docker -------------------------------------------------------------------------------------------------------

def check_docker(needed: bool, image: str, docker_host: str | None) -> list[Check]:
    try:
        import docker
    except ImportError:
        return [Check("docker engine", FAIL if needed else NA, "the docker Python client is not installed",
                      "pip install 'agentrl[docker]'", needed)]
    fix = "apt-get install -y docker.io and start dockerd (as root: bash .ci/docker-setup.sh does both)"
    try:
        client = docker.DockerClient(base_url=docker_host, timeout=HTTP_TIMEOUT_S) if docker_host else \
            docker.from_env(timeout=HTTP_TIMEOUT_S)
        version = client.version()
    except Exception as exc:  # the docker client raises many types; any of them means "no engine here"
        why = str(exc).splitlines()[0][:160]
        return [Check("docker engine", FAIL if needed else NA, f"no Docker Engine answers ({why})", fix, needed)]
    rows = [Check("docker engine", OK, f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})",
                  "", needed)]
    try:
        client.images.get(image)
        rows.append(Check("sandbox image", OK, f"{image} present", "", needed))
    except Exception:  # ImageNotFound or an API error: either way the image cannot be used
        rows.append(Check("sandbox image", FAIL if needed else WARN, f"{image} not in this Docker Engine",
                          "sandbox_images/build.sh --offline-base (no registry needed)", needed))
    client.close()
    return rows


# -- kubernetes ---------------------------------------------------------------------------------------------------

def check_kubernetes(needed: bool, backend: Any | None) -> list[Check]:
    kubeconfig = getattr(backend, "kubeconfig", None) or os.environ.get("KUBECONFIG") or "~/.kube/config"
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and backend is None
    if not in_cluster and not all(Path(p).expanduser().is_file() for p in kubeconfig.split(os.pathsep)):
        return [Check("kubernetes", FAIL if needed else NA, f"no kubeconfig ({kubeconfig} does not exist)",
                      "set KUBECONFIG or sandbox.backend.kubeconfig; a local cluster: docs/kubernetes.md", needed)]
    try:
        from kubernetes import client, config
    except ImportError:
        return [Check("kubernetes", FAIL if needed else NA, "the kubernetes client is not installed",
                      "pip install 'agentrl[k8s]'", needed)]
    context = getattr(backend, "context", None)
    namespace = getattr(backend, "namespace", "agentrl")
    plane = getattr(backend, "control_plane", "pods")
    try:
        _, active = config.list_kube_config_contexts(config_file=os.path.expanduser(kubeconfig))
        name = context or active["name"]
        api = config.new_client_from_config(config_file=os.path.expanduser(kubeconfig), context=context)
    except Exception as exc:  # ConfigException, a broken file, a missing context
        return [Check("kubernetes", FAIL if needed else WARN, f"cannot load {kubeconfig}: {exc}",
                      "fix the kubeconfig or set sandbox.backend.context", needed)]
    rows = [Check("kube context", OK, f"context {name}, namespace {namespace} ({kubeconfig})", "", needed)]
    rows.append(_access_review(client.AuthorizationV1Api(api), namespace, plane, needed))
    return rows


def _access_review(authz: Any, namespace: str, plane: str, needed: bool) -> Check:
    denied, checked = [], 0
    for group, resource, verb, name in K8S_PERMISSIONS[plane]:
        attrs = {"namespace": namespace, "group": group, "resource": resource, "verb": verb}
        if name:
            attrs["name"] = name
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        try:
            allowed = authz.create_self_subject_access_review(body, _request_timeout=HTTP_TIMEOUT_S).status.allowed
        except Exception as exc:  # unreachable API server, TLS, 401: the review cannot be made
            return Check("kube permissions", FAIL if needed else WARN, f"API server: {str(exc).splitlines()[0][:160]}",
                         "check the cluster is up and the kubeconfig's credentials", needed)
        checked += 1
        if not allowed:
            denied.append(f"{verb} {resource}" + (f"/{name}" if name else ""))
    if denied:
        return Check("kube permissions", FAIL if needed else WARN,
                     f"denied in namespace {namespace}: {', '.join(denied)}",
                     "kubectl apply -k k8s/base (Role agentrl-rollout) and bind it to your user or service account",
                     needed)
    return Check("kube permissions", OK, f"all {checked} verbs the {plane} backend uses are allowed in {namespace}",
                 "", needed)


# -- engines ------------------------------------------------------------------------------------------------------

def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
        return json.loads(resp.read() or b"null")


def _first_json(base: str, paths: tuple[str, ...]) -> Any:
    for p in paths:
        try:
            return _get_json(base.rstrip("/") + p)
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return None


def tokenizer_fingerprint(path: str | os.PathLike[str]) -> str | None:
    """sha256 of a checkpoint's tokenizer files (tokenizer.json, else the vocab files); None if none readable."""
    d = Path(path)
    files = [d / "tokenizer.json"] if (d / "tokenizer.json").is_file() else sorted(d.glob("vocab.*")) + \
        sorted(d.glob("merges.txt")) + sorted(d.glob("tokenizer.model"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def check_engine_url(url: str, kind: str, local_model: str | None) -> Check:
    """Reachable, version, served model, tokenizer match (sglang: /model_info, /server_info; vllm: /version,
    /v1/models)."""
    if kind == "vllm":
        version, models = _first_json(url, ("/version",)), _first_json(url, ("/v1/models",))
        if version is None and models is None:
            return Check(f"vllm {url}", FAIL, "not reachable (/version, /v1/models)", "start the server or fix the "
                         "URL in engine.urls", True)
        served = ", ".join(m.get("id", "?") for m in (models or {}).get("data", [])) or "?"
        info = {"model_path": served}
        detail = f"vLLM {(version or {}).get('version', '?')}, serves {served}"
    else:
        info = _first_json(url, ("/model_info", "/get_model_info"))
        if info is None:
            return Check(f"sglang {url}", FAIL, "not reachable (/model_info)", "start the server (or `agentrl "
                         "engine serve` for a CPU stand-in) or fix engine.urls / engine.router_url", True)
        server = _first_json(url, ("/server_info", "/get_server_info")) or {}
        detail = f"SGLang {server.get('version', '?')}, serves {info.get('model_path', '?')}"
    match, fix = _tokenizer_match(info, local_model)
    status = FAIL if match.startswith("MISMATCH") else OK
    return Check(f"{kind} {url}", status, f"{detail}; tokenizer: {match}", fix, True)


def vllm_capabilities(url: str, *, deterministic: bool = False) -> list[Check]:
    """What a vLLM server offers agentrl (version, dev mode, weight reload, LoRA, weight-version spans, seeded
    chunked prefill) and what agentrl does about each gap (`agentrl.engine.vllm_server`)."""
    from agentrl.engine.vllm_server import facts_from

    base = url.rstrip("/")
    facts = facts_from(url, version=_first_json(base, ("/version",)), models=_first_json(base, ("/v1/models",)),
                       weight=_first_json(base, ("/weight_info",)),
                       info=_first_json(base, ("/server_info?config_format=json",)))
    name = f"vllm {url}"
    rows = [Check(f"{name} dev mode", OK if facts.dev_mode else FAIL,
                  "weight reload (/collective_rpc reload_weights), /pause, /weight_info" if facts.dev_mode else
                  "no /weight_info: no weight sync", "" if facts.dev_mode else "start it with VLLM_SERVER_DEV_MODE=1",
                  True),
            Check(f"{name} spans", OK if facts.spans == "exact" else WARN,
                  f"vLLM {facts.version or '?'}: " + ("exact weight-version spans" if facts.spans == "exact" else
                                                       "no spans; versions derived from agentrl's update fences")),
            Check(f"{name} LoRA", OK if facts.lora else NA,
                  f"max rank {facts.max_lora_rank}" if facts.lora else "not enabled: weight_sync adapter refused",
                  "" if facts.lora else "--enable-lora --max-lora-rank R, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")]
    crash = facts.seeded_prefill_crashes
    rows.append(Check(f"{name} seeded prefill", {True: WARN, False: OK, None: NA}[crash],
                      {True: f"{facts.device} server, chunked prefill at {facts.max_num_batched_tokens} < "
                             f"max_model_len {facts.max_model_len}: seeded requests would crash it; agentrl sends "
                             "no seeds and refuses --deterministic",
                       False: f"safe ({facts.device}, chunked prefill {facts.chunked_prefill})",
                       None: "unknown (no /server_info)"}[crash],
                      "restart with --no-enable-chunked-prefill --max-num-batched-tokens >= --max-model-len"
                      if crash else "", bool(crash) and deterministic))
    if facts.dtype:
        rows.append(Check(f"{name} dtype", OK if "float32" in facts.dtype else WARN, facts.dtype,
                          "" if "float32" in facts.dtype else "bf16 logprobs differ from the trainer's fp32 "
                          "recomputation (mismatch_* in metrics.jsonl); --dtype float32 for exact ones"))
    return rows


def _tokenizer_match(info: dict[str, Any], local_model: str | None) -> tuple[str, str]:
    served = info.get("tokenizer_path") or info.get("model_path")
    if not local_model:
        return "n/a (engine.model unset: the served tokenizer_path is used)", ""
    if not served or not Path(served).is_dir():
        return f"n/a (the server's tokenizer {served!r} is not readable here to compare)", ""
    mine, theirs = tokenizer_fingerprint(local_model), tokenizer_fingerprint(served)
    if mine is None or theirs is None:
        return "n/a (no tokenizer files to compare)", ""
    if mine != theirs:
        return f"MISMATCH with engine.model {local_model}", "point engine.model at a copy of the served checkpoint"
    return f"matches engine.model {local_model}", ""


# -- machine ------------------------------------------------------------------------------------------------------

def check_gpu() -> Check:
    try:
        import torch
    except ImportError:
        return Check("gpu", NA, "torch is not installed")
    if not torch.cuda.is_available():
        smi = shutil.which("nvidia-smi")
        hint = "nvidia-smi present but torch sees no CUDA (CPU build of torch?)" if smi else "none visible"
        return Check("gpu", NA, f"{hint}; the embedded job runs on CPU")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return Check("gpu", OK, f"{len(names)} visible: {', '.join(names)}")


def check_disk(paths: dict[str, Path]) -> list[Check]:
    rows = []
    for label, path in paths.items():
        existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
        free = shutil.disk_usage(existing).free / 2**30
        status = FAIL if free < MIN_FREE_GIB else WARN if free < LOW_FREE_GIB else OK
        fix = "" if status == OK else f"free space under {existing} (checkpoints and the model cache need GBs)"
        rows.append(Check(f"disk ({label})", status, f"{free:.1f} GiB free at {existing}", fix, True))
    return rows


def check_model(model: str | None, needed: bool) -> Check:
    from agentrl.engine import embedded, models

    entry = embedded.lookup(model)
    if entry is None:
        ok = Path(str(model), "config.json").is_file()
        return Check("model", OK if ok else FAIL, f"{model}" + ("" if ok else " has no config.json"),
                     "" if ok else "engine.model must be a Hugging Face checkpoint directory", needed)
    target = models.cache_target(entry)
    if models._is_complete(target):
        return Check("embedded model", OK, f"{entry.title} converted in {target}", "", needed)
    try:
        files = embedded.source_files(entry)
    except Exception as exc:  # MissingDependencyError: the model's package is absent
        return Check("embedded model", FAIL, f"not converted and the GGUF is missing ({exc})", entry.pip, needed)
    return Check("embedded model", WARN, f"not converted yet ({files[0].name} found): the first run converts it "
                 f"into {target} (a minute or more)", "", needed)


# -- assembly -----------------------------------------------------------------------------------------------------

def run_checks(cfg: Any, output_dir: Path) -> list[Check]:
    from agentrl.engine import models

    backend = cfg.sandbox.backend
    local = backend.type == "local" and not backend.unsafe_no_isolation
    rows = [check_bwrap(local), check_limits(local)]
    rows += check_docker(backend.type == "docker", cfg.sandbox.spec.image, getattr(backend, "docker_host", None))
    rows += check_kubernetes(backend.type == "kubernetes", backend if backend.type == "kubernetes" else None)
    engine = cfg.engine
    if engine.type == "local":
        rows.append(check_model(engine.model, True))
    else:
        rows += [check_engine_url(u, engine.type, engine.model) for u in _engine_urls(engine)]
        if engine.type == "vllm":
            rows += [r for u in engine.urls for r in vllm_capabilities(u, deterministic=cfg.deterministic)]
    rows.append(check_gpu())
    rows += check_disk({"output": output_dir.resolve(), "model cache": models.default_cache_dir()})
    return rows


def _engine_config(kind: str, urls: list[str], current: Any) -> Any:
    from agentrl.config import SGLangEngineConfig, VLLMEngineConfig

    model = getattr(current, "model", None)
    cls = VLLMEngineConfig if kind == "vllm" else SGLangEngineConfig
    return cls(urls=urls, model=model)


def _engine_urls(engine: Any) -> list[str]:
    router = getattr(engine, "router_url", None)
    return ([router] if router else []) + list(getattr(engine, "urls", []))


def exit_code(rows: list[Check]) -> int:
    return 1 if any(r.needed and r.status == FAIL for r in rows) else 0


def render(rows: list[Check], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    style = {OK: "green", WARN: "yellow", FAIL: "bold red", NA: "dim"}
    for r in rows:
        mark = r.status + (" (needed)" if r.needed and r.status == FAIL else "")
        table.add_row(r.name, f"[{style[r.status]}]{mark}[/]", r.detail, r.fix)
    return table


def _cmd_doctor(a: argparse.Namespace) -> int:
    from rich.console import Console

    cfg, output_dir = load_job(a.config)
    if a.engine_urls:
        kind = a.engine or ("vllm" if _first_json(a.engine_urls[0], ("/version",)) else "sglang")
        cfg = cfg.model_copy(update={"engine": _engine_config(kind, a.engine_urls, cfg.engine)})
    rows = run_checks(cfg, output_dir)
    code = exit_code(rows)
    if a.json:
        print(json.dumps([{"check": r.name, "status": r.status, "detail": r.detail, "fix": r.fix, "needed": r.needed}
                          for r in rows], indent=1))
        return code
    console = Console(highlight=False, width=max(Console().width, 140))
    if a.quiet and code == 0:
        print("doctor: everything the job needs is here")
        return 0
    job = str(a.config) if a.config else "default job (local engine + local sandbox)"
    console.print(render(rows, f"agentrl doctor: {job}"))
    console.print("doctor: " + ("the job can run" if code == 0 else
                                "the job cannot run here: fix the rows marked FAIL (needed)"))
    return code


def add_doctor_command(sub: Any) -> None:
    """Register `agentrl doctor` under the top-level subparsers."""
    p = sub.add_parser("doctor", help="check this machine for what a job needs (sandboxes, engines, GPUs, disk) "
                                      "and say how to fix what is missing")
    p.add_argument("--config", type=Path, help="train or rollout YAML (default: local engine + local sandbox)")
    p.add_argument("--quiet", action="store_true", help="print the table only when the job cannot run")
    p.add_argument("--engine-url", action="append", dest="engine_urls", metavar="URL",
                   help="check this SGLang / vLLM server instead of the config's engine (repeatable)")
    p.add_argument("--engine", choices=["sglang", "vllm"], help="the server kind (default: detected from /version)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (for scripts) instead of the table")
    p.set_defaults(func=_cmd_doctor)
