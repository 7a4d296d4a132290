# agentrl repo_fix base image: the agentrl sandbox image + git (episodes start from a one-commit git repository),
# installed offline from .deb files (python -m agentrl_repo_fix images fetches them once into the cache). Only the
# installed files reach the final image: the .debs stay in the discarded first stage. Built with --network none.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS debs
USER 0:0
COPY debs /build/debs
COPY stage_debs.py /build/stage_debs.py
RUN python3 /build/stage_debs.py /build/debs /staging && git --version

FROM ${BASE_IMAGE}
COPY --from=debs /staging/ /
RUN git --version
