# Ray head/worker image: Ray 2.60 + torch + Tessera's workers and algorithms. Jobs submitted by
# the service run `python -m workers.launch` inside it.
FROM rayproject/ray:2.60.0-py311
WORKDIR /home/ray/tessera
COPY requirements.txt requirements.lock ./
RUN pip install --no-cache-dir -r requirements.txt -c requirements.lock
COPY pyproject.toml README.md ./
COPY api ./api
COPY workers ./workers
COPY algorithms ./algorithms
COPY cli ./cli
RUN pip install --no-cache-dir --no-deps .
