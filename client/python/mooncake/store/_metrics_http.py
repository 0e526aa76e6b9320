"""The client HTTP server of setup(enable_client_http_server=True, client_http_port=P), as
Mooncake's client serves it: GET /metrics (the client's counters, Prometheus text, from
kvpool.Client.metrics_text) and GET /health.

It names counters and no key, as `kvpool serve --http-listen` does, so it asks for no
credential; it binds the store's own host (local_hostname's; 127.0.0.1 without one), not
every address as Mooncake's does. What a stranger can cost it is bounded: at most
MAX_CONNS connections at once (one more is closed at once), each closed
HEAD_DEADLINE_S after it opened whatever it sent (both counted in its /metrics,
kvpool_client_http_refused_total), a request line and headers of at most
64 KiB, no body read; any other path 404, any other method 405.
"""

import http.server as _http
import socket as _socket
import threading as _threading

MAX_CONNS = 16
HEAD_DEADLINE_S = 5.0


class _Handler(_http.BaseHTTPRequestHandler):
    server_version = "kvpool-client"
    protocol_version = "HTTP/1.0"  # one request a connection

    def log_message(self, fmt, *args):  # (no stderr line per request)
        pass

    def _answer(self, status, body, ctype="text/plain; charset=utf-8", head=False):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if status == 405:
            self.send_header("Allow", "GET, HEAD")
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _get(self, head):
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            text = self.server.metrics_text()
            if isinstance(text, str):
                text += self.server.own_metrics()
                return self._answer(200, text, "text/plain; version=0.0.4; charset=utf-8",
                                    head)
            return self._answer(503, "the store is closed\n", head=head)
        if path == "/health":
            ok = self.server.healthy()
            return self._answer(200 if ok else 503, "ok\n" if ok else "closed\n", head=head)
        return self._answer(404, "no such endpoint: /metrics and /health only\n", head=head)

    def do_GET(self):  # noqa: N802 (http.server's names)
        self._get(False)

    def do_HEAD(self):  # noqa: N802
        self._get(True)

    def _refuse(self):
        self._answer(405, "only GET and HEAD\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse  # noqa: N815


class _Server(_http.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = MAX_CONNS

    def __init__(self, addr, metrics_text, healthy):
        self.metrics_text = metrics_text
        self.healthy = healthy
        self._slots = _threading.BoundedSemaphore(MAX_CONNS)
        self._timers = {}  # connection -> its deadline's timer
        self._lock = _threading.Lock()
        self.refused = 0  # connections closed at once: MAX_CONNS were open
        self.cut = 0  # connections closed at their deadline
        super().__init__(addr, _Handler)

    def own_metrics(self):
        return ("# HELP kvpool_client_http_refused_total Connections to the client HTTP server "
                "closed unserved, by reason (full: at its connection cap; deadline: the "
                "request not whole within it).\n"
                "# TYPE kvpool_client_http_refused_total counter\n"
                f'kvpool_client_http_refused_total{{reason="full"}} {self.refused}\n'
                f'kvpool_client_http_refused_total{{reason="deadline"}} {self.cut}\n')

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        # the whole request within the deadline, however it trickles
        timer = _threading.Timer(HEAD_DEADLINE_S, self._cut, (request,))
        timer.daemon = True
        with self._lock:
            self._timers[request] = timer
        timer.start()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._end(request)
            raise

    def _cut(self, request):
        with self._lock:
            if request not in self._timers:
                return  # answered meanwhile
            self.cut += 1
        try:
            request.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def _end(self, request):
        with self._lock:
            timer = self._timers.pop(request, None)
        if timer is not None:
            timer.cancel()
            self._slots.release()

    def shutdown_request(self, request):
        self._end(request)
        super().shutdown_request(request)




class MetricsServer:
    """The server on (host, port), serving on a thread of its own until close()."""

    def __init__(self, host, port, metrics_text, healthy):
        self._srv = _Server((host, port), metrics_text, healthy)
        self.port = self._srv.server_address[1]
        self._thread = _threading.Thread(target=self._srv.serve_forever,
                                         kwargs={"poll_interval": 0.2},
                                         name="mooncake-client-http", daemon=True)
        self._thread.start()

    def close(self):
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(5)
