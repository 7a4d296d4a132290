# agentrl repo_fix sandbox image for one package: its test venv at /opt/agentrl/repo-fix/venv (pytest,
# pytest-timeout and the lockfile's test_deps from the local wheel cache, pip --no-index), never the package itself.
# The wheels and the pip that installs them stay in the discarded first stage. Built with --network none.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS venv
USER 0:0
COPY wheels /build/wheels
COPY pip /build/pip
COPY requirements.txt /build/requirements.txt
RUN python3 -m venv --without-pip /opt/agentrl/repo-fix/venv \
 && PYTHONPATH=/build/pip /opt/agentrl/repo-fix/venv/bin/python -m pip install -q --disable-pip-version-check \
      --no-index --no-cache-dir --find-links /build/wheels -r /build/requirements.txt \
 && chmod -R a+rX,go-w /opt/agentrl/repo-fix/venv \
 && /opt/agentrl/repo-fix/venv/bin/python -c "import pytest, pytest_timeout"

FROM ${BASE_IMAGE}
COPY --from=venv /opt/agentrl/repo-fix/venv /opt/agentrl/repo-fix/venv
