"""A real `gunicorn -k gevent server:app` (or another WSGI app) on a loopback port, started and stopped from
Python: for the tests, the benchmarks, and anyone scripting a local server."""
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`Server(env)`: started and healthy when it returns (env: extra environment variables; `command`
    replaces the gunicorn command line, `{port}` in it filled in; `cwd`: where it runs, default this checkout)."""

    def __init__(self, env, port=None, command=None, startup_timeout=120, cwd=ROOT):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, **{k: str(v) for k, v in env.items()}}
        cmd = [a.format(port=self.port) for a in command] if command else \
            [sys.executable, "-m", "gunicorn", "-k", "gevent", "server:app", "--bind", f"127.0.0.1:{self.port}"]
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"rosefast-gunicorn-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gunicorn did not become healthy:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")[-5000:]

    def metric(self, name):
        text = requests.get(self.url + "/metrics", timeout=5).text
        m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else None

    def stop(self, sig=15, timeout=30):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
