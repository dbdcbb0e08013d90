# The control plane image: API, dispatcher, dashboard. No torch: `service` never imports torch,
# `workers` or `algorithms` (tests/test_layers.py), so neither is copied here. What the service
# serves must ship inside the packages copied below: the method cards are package data of `api`
# (api/method_cards/<name>.md); tests/test_deploy.py installs exactly these files and reads them.
# Database migrations run when the service starts, so upgrading is: new image, restart.
FROM python:3.11.13-slim-bookworm
WORKDIR /app
COPY deploy/requirements-service.txt requirements.lock /tmp/
RUN pip install --no-cache-dir -r /tmp/requirements-service.txt -c /tmp/requirements.lock
COPY pyproject.toml README.md ./
COPY api ./api
COPY service ./service
COPY cli ./cli
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 10001 tessera \
    && mkdir -p /data && chown tessera /data
USER tessera
ENV TESSERA_HOST=0.0.0.0 TESSERA_PORT=8000 TESSERA_HOME=/data
EXPOSE 8000
# /healthz/live answers while the process serves and its dispatcher ticks; readiness (/healthz/ready) is the orchestrator's business.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz/live', timeout=4)"]
CMD ["tessera", "serve"]
