"""A TCP proxy on loopback that a test can break: drop one reply, stall, or go down and come back.

Used to break a server the test must not stop itself (the shared RabbitMQ), or to lose a
reply the server did send (tests/integration/redis/test_script_repeats.py).
"""

from __future__ import annotations

import socket
import threading

from tests.durable import free_port


class Proxy:
    """Forwards connections on ``port`` to ``127.0.0.1:target_port``.

    ``armed``: the next reply is dropped and the client's connection closed (the server ran
    the call, the reply never arrived).  :meth:`stall` holds what either side sends (or the
    replies only) until :meth:`flow`, as a link whose packets stop getting through does: a call
    that reached the server is run, and its reply comes late.  :meth:`down` refuses new
    connections and drops the open ones, as a server that died would; :meth:`up` listens again
    on the same port.
    ``target_port`` may change: new connections go there (a fail-over's moved address).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.armed = False
        self.lost = 0
        #: Whether bytes flow, by direction (True: the server's replies).
        self._flowing = {False: threading.Event(), True: threading.Event()}
        self.flow()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._serve()

    def _serve(self) -> None:
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if replies and self.armed:
                    self.armed, self.lost = False, self.lost + 1
                    break  # the reply is dropped with the connection
                self._flowing[replies].wait()
                sink.sendall(data)
        except OSError:
            pass
        self._drop(source, sink)

    def _drop(self, *socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
            with self._lock:
                self._open.discard(sock)

    def stall(self, *, replies_only: bool = False) -> None:
        """Hold every byte either side sends from now on (``replies_only``: the server's only, as a
        link that loses its packets one way), until :meth:`flow`."""
        self._flowing[True].clear()
        if not replies_only:
            self._flowing[False].clear()

    def flow(self) -> None:
        """Let the held bytes and the next ones through."""
        for flowing in self._flowing.values():
            flowing.set()

    def down(self) -> None:
        """Refuse new connections and drop the open ones."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way (close alone does not)
        except OSError:
            pass
        self.listener.close()
        with self._lock:
            open_ = list(self._open)
        self._drop(*open_)

    def up(self) -> None:
        """Accept connections again, on the same port."""
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self._serve()

    def close(self) -> None:
        self.down()
        self.flow()  # the pipes waiting to send find their sockets closed, and end
