# The control plane image: API, dispatcher, dashboard. No torch: `service` never imports torch,
# `workers` or `algorithms` (tests/test_layers.py), so neither is copied here. What the service
# serves must ship inside the packages copied below: the method cards are package data of `api`
# (api/method_cards/<name>.md); tests/test_deploy.py installs exactly these files and reads them.
FROM python:3.11-slim
WORKDIR /app
COPY deploy/requirements-service.txt /tmp/requirements-service.txt
RUN pip install --no-cache-dir -r /tmp/requirements-service.txt
COPY pyproject.toml README.md ./
COPY api ./api
COPY service ./service
COPY cli ./cli
RUN pip install --no-cache-dir --no-deps .
ENV TESSERA_HOST=0.0.0.0 TESSERA_PORT=8000 TESSERA_HOME=/data
EXPOSE 8000
CMD ["tessera", "serve"]
