"""Ring messages on plain sockets: the ``socket`` transport of `dmp.ring.transport`.

A ring message through Dask's comm layer costs each side about 0.1 ms of CPU whatever its
size (msgpack framing, serialisation, the event loop's wake-ups; BENCHMARKS.md, "Ring
messages on plain sockets"), which bounds the programs that exchange small messages every
round (MF CCD++) on workers with little CPU.  Here every worker that holds a ring partition
listens on one more TCP port of its own host; a message is one frame written by the
sending partition's push thread with a blocking ``sendmsg`` (the arrays out of band, never
copied) and read by the worker's ring thread straight into the arrays it becomes.

A connection is authenticated before anything on it is unpickled: its first bytes must be
the listening worker's random token, which a sender learns only by asking that worker
through Dask (`ENDPOINT_HANDLER`), so the port is no more open than the worker's own.
Dask clusters on other comms (TLS, UCX, in-process) keep the ``dask`` transport.
"""

from __future__ import annotations

import hmac
import logging
import pickle
import secrets
import selectors
import socket
import struct
import threading

import numpy as np

logger = logging.getLogger(__name__)

#: the worker's Dask handler that tells a sender where, and with which token, to connect
ENDPOINT_HANDLER = "dmp_ring_endpoint"

TOKEN_BYTES = 16
# blob length, number of out-of-band buffers, length of the receiving partition's key
_HEAD = struct.Struct("<QIH")
_POLL_S = 1.0   # how often the ring thread looks at its worker's status


def _recv_exact(sock: socket.socket, n: int, eof_ok: bool = False):
    """``n`` bytes from ``sock`` as a new uint8 array; None when ``eof_ok`` and the stream
    ends before the first byte, else EOFError at its end."""
    buf = np.empty(n, dtype=np.uint8)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            if got == 0 and eof_ok:
                return None
            raise EOFError("ring connection closed in the middle of a message")
        got += k
    return buf


def _send_parts(sock: socket.socket, parts: list) -> None:
    """Write the buffers ``parts`` in order (``sendmsg`` may write only some of them)."""
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if v.nbytes]
    while views:
        sent = sock.sendmsg(views[:1024])
        while sent:
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def encode(round: int, src: int, payload) -> tuple:
    """A message's ``(pickle, out-of-band buffers)``: encoded once for all its receivers."""
    buffers: list = []
    blob = pickle.dumps((round, src, payload), protocol=5, buffer_callback=buffers.append)
    return blob, [b.raw() for b in buffers]


def send_message(sock: socket.socket, to: str, round: int, src: int, payload,
                 encoded: tuple | None = None) -> int:
    """Write one ring message for partition ``to`` (``encoded``: `encode`'s result for
    it, when known); returns the bytes of its arrays."""
    blob, raws = encode(round, src, payload) if encoded is None else encoded
    key = to.encode()
    head = (_HEAD.pack(len(blob), len(raws), len(key)) + key
            + struct.pack(f"<{len(raws)}Q", *[r.nbytes for r in raws]))
    _send_parts(sock, [head, blob, *raws])
    return sum(r.nbytes for r in raws)


def read_message(sock: socket.socket):
    """``(to, blob, buffers)`` of the next message on ``sock``, or None when the sender
    closed the connection between messages."""
    head = _recv_exact(sock, _HEAD.size, eof_ok=True)
    if head is None:
        return None
    blob_len, n_buffers, key_len = _HEAD.unpack(head.tobytes())
    # the key, the buffers' lengths and the pickled message in one read
    rest = _recv_exact(sock, key_len + 8 * n_buffers + blob_len)
    to = rest[:key_len].tobytes().decode()
    lens = rest[key_len:key_len + 8 * n_buffers].view("<u8")
    blob = rest[key_len + 8 * n_buffers:]
    # each array lands in the memory it keeps: no transient copies of a large message
    return to, blob, [_recv_exact(sock, int(n)) for n in lens]


def connect(endpoint, timeout: float) -> socket.socket:
    """A connection to the worker at ``endpoint = (host, port, token)``, authenticated."""
    host, port, token = endpoint
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(token)
    except BaseException:
        sock.close()
        raise
    return sock


class RingServer:
    """One worker's listening end: one thread accepts connections, checks each one's token
    and reads its messages as they come, handing each to the partition it names
    (``deliver_now``), or its failure (``ring_failed_now``).  One thread serves all the
    connections: the messages of a round arrive together, and one wake-up takes in all that
    are there (a thread per connection cost more CPU per message on small workers)."""

    def __init__(self, worker):
        from distributed.comm import get_address_host

        self._worker = worker
        self.token = secrets.token_bytes(TOKEN_BYTES)
        host = get_address_host(worker.address)
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.endpoint = (host, self._listener.getsockname()[1], self.token)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._conns: dict = {}            # connection -> its token was checked
        self._thread = threading.Thread(target=self._serve, daemon=True, name="dmp-ring")
        self._thread.start()

    def open_connections(self) -> int:
        """Incoming connections open now."""
        with self._lock:
            return len(self._conns)

    def _worker_gone(self) -> bool:
        return self._worker.status.name in ("closing", "closed", "failed")

    def _serve(self) -> None:
        try:
            while not self._worker_gone():
                for key, _ in self._selector.select(_POLL_S):
                    try:
                        if key.data is None:
                            self._accept()
                        else:
                            self._take(key.fileobj)
                    except Exception:  # noqa: BLE001 - the other connections go on
                        logger.exception("dmp ring: a connection failed")
                        if key.data is not None:
                            self._drop(key.fileobj)
        finally:
            for conn in list(self._conns):
                self._drop(conn)
            self._selector.close()
            self._listener.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(True)
        with self._lock:
            self._conns[conn] = False
        self._selector.register(conn, selectors.EVENT_READ, True)

    def _drop(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _take(self, conn: socket.socket) -> None:
        """Read what arrived on ``conn``: its token, or one whole message."""
        try:
            if not self._conns[conn]:
                token = _recv_exact(conn, TOKEN_BYTES)
                if not hmac.compare_digest(token.tobytes(), self.token):
                    logger.warning("dmp ring: a connection without this worker's token was "
                                   "refused")
                    self._drop(conn)
                    return
                self._conns[conn] = True
                return
            message = read_message(conn)
        except (OSError, EOFError):
            message = None   # the sender is gone: its own partition or the driver says so
        if message is None:
            self._drop(conn)
            return
        to, blob, buffers = message
        partition = self._worker.state.actors.get(to)
        if partition is None:   # released since (its fit ended or is being recovered)
            return
        try:
            round, src, payload = pickle.loads(blob, buffers=buffers)
            partition.deliver_now(round, src, payload)
        except Exception as exc:  # noqa: BLE001 - raised by the receiving partition
            partition.ring_failed_now(exc)


_servers_lock = threading.Lock()


def server_for(worker) -> RingServer:
    """This worker's `RingServer`, started on first use."""
    with _servers_lock:
        server = getattr(worker, "_dmp_ring_server", None)
        if server is None:
            server = worker._dmp_ring_server = RingServer(worker)
        return server


def open_connections(worker) -> int:
    """Incoming ring connections of ``worker`` being read now (0 without a server)."""
    server = getattr(worker, "_dmp_ring_server", None)
    return 0 if server is None else server.open_connections()
