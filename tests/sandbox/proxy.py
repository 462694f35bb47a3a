"""A TCP proxy on 127.0.0.1 in front of a sandbox host: cut its connections mid-run (a dropped
link), or delay every chunk by half the round trip each way (a far-away host; there is no netem
here)."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections import deque


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


class LatencyProxy(TcpProxy):
    """Like TcpProxy, but a far-away host as TCP sees it: each chunk arrives half the round trip
    after it was sent, while later chunks keep flowing (the delay is a line, not a turnstile), so
    only what waits for an answer (SSH channel windows, SFTP requests) pays the round trip.
    At most ``buffer`` bytes are in flight each way; beyond that the sender waits, as behind a
    bottleneck's queue."""

    def __init__(self, target: tuple[str, int], delay_ms: float = 0.0, buffer: int = 16 << 20):
        self.buffer = buffer
        super().__init__(target, delay_ms)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        line: deque[tuple[float, bytes]] = deque()
        cond = threading.Condition()
        queued = [0, False]  # bytes in the line, sender done

        def deliver() -> None:
            try:
                while True:
                    with cond:
                        while not line and not queued[1]:
                            cond.wait()
                        if not line:
                            return
                        at, data = line[0]
                    wait = at - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    dst.sendall(data)
                    with cond:
                        line.popleft()
                        queued[0] -= len(data)
                        cond.notify_all()
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=deliver, daemon=True).start()
        try:
            while data := src.recv(65536):
                with cond:
                    while queued[0] > self.buffer:
                        cond.wait()
                    line.append((time.monotonic() + self.delay / 2, data))
                    queued[0] += len(data)
                    cond.notify_all()
        except OSError:
            pass
        finally:
            with cond:
                queued[1] = True
                cond.notify_all()
