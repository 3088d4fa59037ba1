"""How far a model's download has come: written by sources.hub as the bytes arrive, read by /health while the
server starts (`{"status": "loading", "download": {...}}`). One per process: a server loads one model.

    DOWNLOAD.start("Qwen/Qwen3-0.6B", total_bytes)
    DOWNLOAD.add(n)                 # as each chunk lands
    DOWNLOAD.view()                 # {"model", "bytes", "total", "fraction", "rate_mb_s", "eta_s"} or None
"""
import threading
import time


class DownloadProgress:
    def __init__(self):
        self._lock = threading.Lock()
        self._model, self._done, self._total, self._since, self._finished = None, 0, 0, 0.0, False

    def start(self, model, total):
        with self._lock:
            self._model, self._done, self._total, self._since, self._finished = \
                model, 0, int(total), time.monotonic(), False

    def add(self, n):
        with self._lock:
            self._done += int(n)

    def finish(self):
        with self._lock:
            self._finished = True

    def view(self):
        """The download now (or the last one, finished: `done` true), or None when nothing was downloaded."""
        with self._lock:
            if self._model is None:
                return None
            done, total = max(self._done, 0), self._total
            elapsed = max(time.monotonic() - self._since, 1e-6)
            rate = done / elapsed
            return {"model": self._model, "bytes": done, "total": total,
                    "fraction": round(min(done / total, 1.0), 6) if total else 1.0,
                    "rate_mb_s": round(rate / 1e6, 2),
                    "eta_s": round((total - done) / rate, 1) if rate > 0 and total > done else 0.0,
                    "done": self._finished}


DOWNLOAD = DownloadProgress()
