"""S3 on loopback for the benchmarks: moto's HTTP server, reached by boto3, s3fs and Ray workers
through ``AWS_ENDPOINT_URL`` (moto's in-process mock would not reach other processes)."""

from __future__ import annotations

import logging
import os

from tests.local_ray import free_port  # the one the suite uses; bench.local_s3.free_port for the benches


def start_s3(bucket: str):
    """Start moto's server on a free loopback port with ``bucket`` made; point this process's
    ``AWS_*`` variables at it. Returns ``(server, boto3 client)``; stop it with ``server.stop()``."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    return server, client
