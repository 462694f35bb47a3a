"""A TCP proxy on 127.0.0.1 in front of a sandbox host: cut its connections mid-run (a dropped
link), or delay every chunk by half the round trip each way (a far-away host; there is no netem
here)."""

from __future__ import annotations

import queue
import socket
import threading
import time


class TcpProxy:
    def __init__(self, target: tuple[str, int], delay_ms: float = 0.0):
        self.target, self.delay = target, delay_ms / 1000.0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        self.sent = 0  # bytes carried towards the target (what an upload really sends)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy ``src`` to ``dst``; with a delay, each chunk leaves half the round trip after it
        arrived, whatever else is in flight: a link's latency, not a cap on its throughput
        (sleeping before each send would make N chunks cost N half-trips)."""
        line: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        if self.delay:
            threading.Thread(target=self._deliver, args=(line, src, dst), daemon=True).start()
        upload = dst.getpeername()[1] == self.target[1]
        try:
            while data := src.recv(65536):
                if upload:
                    self.sent += len(data)
                if self.delay:
                    line.put((time.monotonic() + self.delay / 2, data))
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            if self.delay:
                line.put(None)  # the deliverer closes both ends once the line is empty
            else:
                self._close(src, dst)

    def _deliver(self, line: queue.Queue[tuple[float, bytes] | None], src: socket.socket,
                 dst: socket.socket) -> None:
        try:
            while (item := line.get()) is not None:
                due, data = item
                time.sleep(max(0.0, due - time.monotonic()))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src, dst)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every open connection at once, as a broken link would."""
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.server.close()
        self.cut()
