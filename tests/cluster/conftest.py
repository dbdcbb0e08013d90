"""A multi-node Ray cluster on one machine, with token auth as a Ray 2.60 cluster has it, and a
live Tessera service pointed at it with S3 (moto) storage.

The head schedules nothing (``--num-cpus=0``); three worker nodes with one logical CPU each
(``node_a``, ``node_b``, ``node_c``, each with a custom resource of its own name and an
address of its own, ``NODE_IPS``) hold the training workers, so a two-worker run must span two
nodes, and losing one still leaves two.
Every node has its own temp dir; each process is found and ended through it, never with
``ray stop`` (which would end every Ray process on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from tests.local_ray import REPO_ROOT, end_head, free_port, kill_processes_mentioning
from tests.e2e.conftest import cluster_service, wait_until

RAY = str(Path(sys.executable).with_name("ray"))
NODE_NAMES = ("node_a", "node_b", "node_c")
# Each worker node on an address of its own, none the head's (127.0.0.1), as across machines:
# Ray knows four nodes by four addresses, and a rendezvous (Ray Train's master, a kept sweep
# group's store) is at a worker node's address. Linux answers all of 127.0.0.0/8 on the loopback
# device. A server that listens on every address is still reached through any of them, so this
# does not prove that a wrong address would fail.
NODE_IPS = {name: f"127.0.0.{2 + i}" for i, name in enumerate(NODE_NAMES)}
BATCH_DELAY_S = "0.15"  # per batch: leaves time to act on a run between two checkpoints


class LocalRayCluster:
    """A head plus named worker nodes, each a ``ray start`` in its own temp dir; the head keeps
    its ports across restarts so the service's ``TESSERA_RAY_ADDRESS`` stays valid."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.port, self.dashboard_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.head_dir: str | None = None
        self.client_server_port = free_port()  # the same across restarts; see end_head
        self.node_dirs: dict[str, str] = {}

    def _ray_start(self, *args: str) -> subprocess.Popen:
        """Launch one ``ray start``; :meth:`_started` waits for it. Several may start at once."""
        return subprocess.Popen([RAY, "start", *args, "--object-store-memory=100000000", "--disable-usage-stats",
                                 # Two nodes on the default job-agent port (52365) break job submission.
                                 f"--dashboard-agent-listen-port={free_port()}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)

    @staticmethod
    def _started(popen: subprocess.Popen) -> None:
        stdout, stderr = popen.communicate(timeout=180)
        assert popen.returncode == 0, f"{' '.join(popen.args)} failed:\n{stdout}\n{stderr}"

    def start_head(self) -> None:
        self.head_dir = tempfile.mkdtemp(prefix="trh")  # short: Ray puts unix sockets under it
        self._started(self._ray_start(
            "--head", f"--port={self.port}", "--num-cpus=0", "--num-gpus=0", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}", f"--temp-dir={self.head_dir}",
            f"--ray-client-server-port={self.client_server_port}"))

    def start_nodes(self, *names: str) -> None:
        """Start the named worker nodes side by side (each ``ray start`` is mostly waiting on
        its processes' start) and return once every one of them has started."""
        launched = []
        for name in names:
            self.node_dirs[name] = tempfile.mkdtemp(prefix="trn")
            launched.append(self._ray_start(
                f"--address={self.address}", "--num-cpus=1", "--num-gpus=0", f"--node-ip-address={NODE_IPS[name]}",
                f"--resources={json.dumps({name: 1})}", f"--temp-dir={self.node_dirs[name]}"))
        for popen in launched:
            self._started(popen)

    def stop_head(self) -> None:
        if self.head_dir:
            end_head(self.head_dir, self.client_server_port)
            self.head_dir = None

    def stop_node(self, name: str) -> None:
        temp_dir = self.node_dirs.pop(name, None)
        if temp_dir:
            kill_processes_mentioning(temp_dir)
            shutil.rmtree(temp_dir, ignore_errors=True)

    def stop(self) -> None:
        for name in list(self.node_dirs):
            self.stop_node(name)
        self.stop_head()

    def raylet(self, name: str) -> psutil.Process:
        marker = f"--raylet_socket_name={self.node_dirs[name]}/"
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if cmdline and cmdline[0].endswith("/raylet") and any(arg.startswith(marker) for arg in cmdline):
                return proc
        raise AssertionError(f"no raylet for {name}")

    def kill_raylet(self, name: str) -> None:
        """SIGKILL the node's raylet, as a node that lost power would; its workers die with it."""
        raylet = self.raylet(name)
        raylet.send_signal(signal.SIGKILL)
        raylet.wait(timeout=30)

    # --- what Ray says (its state API over HTTP, with the cluster's token) ------------------
    def _state(self, resource: str, **filters: str) -> list[dict]:
        params = [("limit", "1000")]
        for key, value in filters.items():
            params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
        response = httpx.get(f"{self.dashboard_url}/api/v0/{resource}", params=params, timeout=30,
                             headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"})
        response.raise_for_status()
        return response.json()["data"]["result"]["result"]

    def node_ips(self) -> dict[str, str]:
        """``{node name: the address Ray knows it by}`` for the live worker nodes."""
        return {name: node["node_ip"] for node in self._state("nodes", state="ALIVE")
                for name in NODE_NAMES if name in node.get("resources_total", {})}

    def node_names_by_id(self) -> dict[str, str]:
        """``{node id: node name}`` for the live worker nodes."""
        return {node["node_id"]: name for node in self._state("nodes", state="ALIVE")
                for name in NODE_NAMES if name in node.get("resources_total", {})}

    def actor_nodes(self, class_name: str) -> list[str]:
        """The node names the live actors of ``class_name`` run on, one entry per actor."""
        names = self.node_names_by_id()
        actors = self._state("actors", class_name=class_name, state="ALIVE")
        return sorted(names.get(actor["node_id"], actor["node_id"]) for actor in actors)

    def actors_ever(self, class_name: str) -> int:
        """How many actors of ``class_name`` the cluster has made, dead ones included."""
        return len(self._state("actors", class_name=class_name))

    def driver_interpreter_serving(self) -> bool:
        """Whether a warm job-driver interpreter (``workers.fork_server``) serves on the cluster."""
        servers = Path(self.env["TMPDIR"]) / f"tessera-forks-{os.getuid()}"
        return any("serving" in log.read_text() for log in servers.glob("*.log"))

    def train_worker_nodes(self) -> list[str]:
        """The node names the live Ray Train workers run on, one entry per worker."""
        return self.actor_nodes("RayTrainWorker")


@pytest.fixture(scope="module")
def ray_token() -> str:
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
def ray_cluster(s3_server, ray_token):
    """The head and three worker nodes, token auth on. Started after the S3 server, so every
    node inherits its environment."""
    # The nodes' processes, and so the job drivers' warm interpreter (its socket and log), keep
    # their temporary files in a folder of the cluster's own (short: a unix socket lives there).
    tmp = tempfile.mkdtemp(prefix="tcl", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token, "PYTHONPATH": str(REPO_ROOT),
           # Without GCS fault tolerance a node whose head is gone can never rejoin it: end soon.
           "RAY_gcs_rpc_server_reconnect_timeout_s": "10", "TMPDIR": tmp}
    cluster = LocalRayCluster(env)
    try:
        cluster.start_head()
        cluster.start_nodes(*NODE_NAMES)
        wait_until(lambda: len(cluster.node_names_by_id()) == len(NODE_NAMES), timeout=60,
                   what="three worker nodes to join")
        assert cluster.node_ips() == NODE_IPS
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_svc(tmp_path_factory, ray_cluster, ray_token, s3_server, postgres_url):
    """A live service on the cluster: PostgreSQL, S3 storage, Ray's token, and slow batches."""
    with cluster_service(tmp_path_factory.mktemp("tessera-cluster-home"), ray_address=ray_cluster.dashboard_url,
                         postgres_url=postgres_url,
                         env={"TESSERA_STORAGE_URL": s3_server.url("cluster"), "TESSERA_TEST_BATCH_DELAY_S": BATCH_DELAY_S,
                              "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token}) as svc:
        # The service had the head node's warm driver interpreter started once it reached Ray
        # (service.driver_warmup): the first run's driver is forked from it.
        wait_until(ray_cluster.driver_interpreter_serving, timeout=120, what="the warm driver interpreter to serve")
        yield svc
