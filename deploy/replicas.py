"""N rosefast replicas behind nginx on this machine: `make serve-replicas N=2`.

Starts N `gunicorn -k gevent server:app` servers on consecutive loopback ports (from --first-port) and
nginx in front on --port with deploy/nginx.conf.in (least_conn, unbuffered streams, a full, loading,
draining or dead replica passed over). ROSEFAST_* variables go to every replica. Ctrl-C (or SIGTERM)
stops nginx and drains the replicas.

    python deploy/replicas.py --replicas 2 --port 8000 --first-port 8001
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSTALL_HINT = "install it with `apt-get install nginx-light` (Debian/Ubuntu, as root) or your system's nginx package"


def find_nginx(install=True):
    """The nginx binary: on PATH (or /usr/sbin), else installed from Debian's packages when we are root."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found or not install:
        if not found:
            raise RuntimeError(f"nginx is not installed: {INSTALL_HINT}")
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"nginx is not installed and cannot be installed here (needs root and apt-get): "
                           f"{INSTALL_HINT}")
    print("nginx is missing: installing nginx-light from the system's packages", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run = subprocess.run(["apt-get", "install", "-y", "-q", "nginx-light"], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        update = subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
        run = subprocess.run(["apt-get", "install", "-y", "-q", "nginx-light"], env=env, capture_output=True,
                             text=True) if update.returncode == 0 else update
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if not found:
        raise RuntimeError(f"installing nginx-light failed ({run.stderr.strip()[-300:]}): {INSTALL_HINT}")
    return found


def render_conf(listen_port, upstream_ports, prefix, tries=None):
    """deploy/nginx.conf.in filled in: nginx on 127.0.0.1:listen_port over the replicas' ports."""
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in upstream_ports)
    text = (HERE / "nginx.conf.in").read_text()
    for key, value in (("@LISTEN@", f"127.0.0.1:{listen_port}"), ("@SERVERS@", servers), ("@PREFIX@", str(prefix)),
                       ("@TRIES@", str(tries or len(upstream_ports)))):
        text = text.replace(key, value)
    return text


class Nginx:
    """nginx in the foreground with its own prefix directory (config, pid, logs, temp files)."""

    def __init__(self, listen_port, upstream_ports, tries=None):
        self.binary = find_nginx()
        self.prefix = Path(tempfile.mkdtemp(prefix="rosefast-nginx-"))
        self.url = f"http://127.0.0.1:{listen_port}"
        conf = self.prefix / "nginx.conf"
        conf.write_text(render_conf(listen_port, upstream_ports, self.prefix, tries))
        check = subprocess.run([self.binary, "-t", "-q", "-p", str(self.prefix), "-c", str(conf)],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx rejected {conf}: {check.stderr.strip()}")
        self.proc = subprocess.Popen([self.binary, "-p", str(self.prefix), "-c", str(conf), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self._wait_listening(listen_port)

    def _wait_listening(self, port, timeout=10):
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)   # graceful: open streams finish
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--port", type=int, default=8000, help="nginx listens here")
    p.add_argument("--first-port", type=int, default=8001, help="replica i listens on first-port + i")
    a = p.parse_args(argv)
    if a.replicas < 1:
        raise SystemExit("--replicas must be >= 1")
    sys.path.insert(0, str(HERE.parent))
    from server.process import Server

    ports = [a.first_port + i for i in range(a.replicas)]
    replicas = []
    try:
        for i, port in enumerate(ports):   # one at a time: two loads at once only slow each other on a small machine
            # replica i is worker i: with ROSEFAST_DEVICE='cuda:{worker}' each replica has its own GPU
            replicas.append(Server({"ROSEFAST_WORKER_INDEX": i}, port=port, startup_timeout=600))
            print(f"replica on 127.0.0.1:{port} is up", file=sys.stderr)
        nginx = Nginx(a.port, ports)
        print(f"nginx on {nginx.url} -> {', '.join(map(str, ports))} (Ctrl-C stops)", file=sys.stderr)
        stop = []
        for sig in (signal.SIGTERM, signal.SIGINT):   # SIGINT too where a shell started us with it ignored
            signal.signal(sig, lambda *_: stop.append(1))
        while not stop and nginx.proc.poll() is None:
            time.sleep(0.5)
        nginx.stop()
    finally:
        for server in replicas:
            server.stop()


if __name__ == "__main__":
    main()
