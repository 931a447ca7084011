"""A Ray cluster of two nodes on this machine, started the way an operator starts one.

``ray start --head`` and ``ray start --address=...`` as real processes, each node with
its own resources (``fl_head``, ``fl_second``) so a test can place shards on either; the
second node's raylet can be SIGKILLed to lose the node for real. Everything is stopped
by :meth:`TwoNodeCluster.close`, which kills what is left of both nodes' processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    """The address Ray advertises for this machine (its own interface, not loopback)."""
    import ray

    return str(ray.util.get_node_ip_address())


class TwoNodeCluster:
    def __init__(self, temp_dir: Path, *, cpus_per_node: int = 2) -> None:
        self.temp_dir = temp_dir
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        port = _free_port()
        self.address = f"{node_ip()}:{port}"
        self.logs = temp_dir / "ray-start.log"
        self._processes: list[subprocess.Popen[bytes]] = []
        common = ["--num-cpus", str(cpus_per_node), "--disable-usage-stats", "--block"]
        try:
            self._bring_up(port, common)
        except BaseException:
            self.close()  # a half-started cluster must not outlive the test
            raise

    def _bring_up(self, port: int, common: list[str]) -> None:
        temp_dir = self.temp_dir
        self._start(
            [RAY, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}",
             "--include-dashboard=false", '--resources={"fl_head": 100}', *common]
        )  # fmt: skip
        self._wait_for_nodes(1)
        self._start(
            [RAY, "start", f"--address={self.address}", '--resources={"fl_second": 100}', *common]
        )
        self._wait_for_nodes(2)

    def _start(self, argv: list[str]) -> None:
        with self.logs.open("ab") as log:
            self._processes.append(
                subprocess.Popen(argv, env=self.env, stdout=log, stderr=log, start_new_session=True)
            )

    def _wait_for_nodes(self, count: int, timeout_s: float = 90.0) -> None:
        """Until ``ray status`` lists ``count`` active nodes (it reads the GCS: no
        dashboard needed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run(
                [RAY, "status", f"--address={self.address}"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            active = done.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
            if done.returncode == 0 and active.count("node_") >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"ray did not bring up {count} node(s) in {timeout_s}s: "
                    f"{done.stderr[-500:]} (see {self.logs})"
                )
            time.sleep(0.5)

    def raylet_of(self, resource: str) -> psutil.Process:
        """The raylet process of the node that holds ``resource``."""
        for process in psutil.process_iter(["name", "cmdline"]):
            cmdline = " ".join(process.info["cmdline"] or [])
            if "raylet" in (process.info["name"] or "") and resource in cmdline:
                return process
        raise LookupError(f"no raylet with resource {resource}")

    def kill_second_node(self) -> None:
        os.kill(self.raylet_of("fl_second").pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop both nodes: their `ray start --block` processes first (which stop the
        node's own processes), then anything of this cluster's session still alive."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        marker = str(self.temp_dir)
        leftovers = []
        for process in psutil.process_iter(["cmdline"]):
            if marker in " ".join(process.info["cmdline"] or []):
                leftovers.append(process)
        for process in leftovers:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(leftovers, timeout=10)
