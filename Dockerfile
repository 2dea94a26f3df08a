# The Canopy image that kuberay.yaml runs on every Ray node: Canopy and its dependencies in a
# virtualenv at /opt/canopy, run as the non-root user ray (uid 1000) with its data dir /home/ray/.canopy
# (made here, so that a secrets volume mounted at /home/ray/.canopy/secrets leaves it ray's). Nothing
# secret is baked in: the database URL, tokens and provider keys arrive at run time as files there.
#
# Built from a wheelhouse, not from the source tree (.dockerignore sends only dist/*.whl):
#
#   pip wheel --wheel-dir dist .          # Canopy's wheel and every dependency's (Python 3.11, x86_64)
#   docker build -t canopy:0.1.0 .       # BASE defaults to python:3.11-slim from a registry
#
# The install reads only the wheelhouse (pip --no-index), so the build needs no network when the
# base already has wget; without a registry, make a base from Debian's mirror first and build on it:
#
#   bash .ci/canopy-base.sh canopy-base:bookworm
#   docker build --network none --build-arg BASE=canopy-base:bookworm -t canopy:0.1.0 .
ARG BASE=python:3.11-slim

FROM ${BASE} AS install
# Names this stage's images, which the legacy builder keeps untagged, for whoever cleans them up.
LABEL canopy.stage=install
COPY dist/ /wheels/
# pip compiles what it installs: the user ray cannot write bytecode into /opt/canopy, so without it
# every process would compile Ray, litellm and Canopy from source at each start (seconds of CPU each).
RUN python3 -m venv /opt/canopy \
    && /opt/canopy/bin/pip install --no-cache-dir --disable-pip-version-check \
        --no-index --find-links /wheels canopy

FROM ${BASE}
# KubeRay's exec health probes (Ray < 2.53, RayService workers) run `bash -c "wget ... | grep success"`.
RUN { command -v wget >/dev/null || { apt-get update && apt-get install -y --no-install-recommends wget \
        && rm -rf /var/lib/apt/lists/*; }; } \
    && useradd --create-home --uid 1000 --user-group --shell /bin/bash ray \
    && install -d -o ray -g ray -m 700 /home/ray/.canopy
# MALLOC_ARENA_MAX: two malloc arenas per process keep a session host's memory from growing with the
# sessions it serves (actors/runtime.py says why).
ENV PATH=/opt/canopy/bin:$PATH \
    CANOPY_DATA_DIR=/home/ray/.canopy \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    MALLOC_ARENA_MAX=2 \
    PYTHONUNBUFFERED=1
USER ray
WORKDIR /home/ray
CMD ["canopy", "--help"]
# Last: with a copying storage driver (vfs) every later step would copy the whole venv again.
COPY --from=install /opt/canopy /opt/canopy
