"""The ``socket`` transport of ring messages (`dmp.engine.ring`): frames carry any payload
intact, and a worker's port unpickles nothing from a connection without its token."""

import pickle
import socket
import threading
import time

import numpy as np
import pytest

from dmp.engine import ring


def _round_trip(payload):
    a, b = socket.socketpair()
    try:
        out = {}
        reader = threading.Thread(target=lambda: out.update(m=ring.read_message(b)))
        reader.start()
        nbytes = ring.send_message(a, "partition-key", 7, 3, payload)
        reader.join(10)
        to, blob, buffers = out["m"]
        return to, pickle.loads(blob, buffers=buffers), nbytes
    finally:
        a.close()
        b.close()


def test_a_frame_carries_any_payload_and_its_arrays_arrive_writable():
    rng = np.random.default_rng(0)
    big = rng.random(3 * 2**20 // 8)              # larger than a socket's buffers
    strided = rng.random((40, 30))[:, ::3]        # not contiguous: pickled in band
    payload = {"big": big, "strided": strided, "empty": np.empty((0, 5)),
               "scalar": np.float32(2.5), "nested": [(np.arange(5, dtype=np.int16), "x")],
               "none": None}
    to, (round, src, got), nbytes = _round_trip(payload)
    assert (to, round, src) == ("partition-key", 7, 3)
    assert nbytes == big.nbytes + 5 * 2   # the contiguous arrays, out of band
    np.testing.assert_array_equal(got["big"], big)
    np.testing.assert_array_equal(got["strided"], strided)
    assert got["empty"].shape == (0, 5) and got["scalar"] == np.float32(2.5)
    np.testing.assert_array_equal(got["nested"][0][0], np.arange(5, dtype=np.int16))
    assert got["nested"][0][1] == "x" and got["none"] is None
    got["big"][0] = -1.0                          # a program may write to what it received
    assert got["big"].flags.writeable


def test_the_end_of_a_connection_between_messages_and_inside_one():
    a, b = socket.socketpair()
    a.close()
    assert ring.read_message(b) is None           # between messages: the sender is done
    b.close()
    a, b = socket.socketpair()
    a.sendall(b"\x05\x00")                        # two bytes of a message's head
    a.close()
    with pytest.raises(EOFError, match="middle of a message"):
        ring.read_message(b)
    b.close()


class _Marker:
    """Unpickling it creates a file: proof that a frame was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _endpoint_and_sink(dask_worker):
    class Sink:   # stands in a partition: counts what is delivered to it
        delivered = 0
        failed = None

        def deliver_now(self, round, src, payload):
            Sink.delivered += 1

        def ring_failed_now(self, exc):
            Sink.failed = exc

    dask_worker.state.actors["dmp-test-sink"] = Sink()
    return ring.server_for(dask_worker).endpoint


def _drop_sink(dask_worker):
    sink = dask_worker.state.actors.pop("dmp-test-sink", None)
    return None if sink is None else type(sink).delivered


@pytest.mark.dask
def test_a_connection_without_the_workers_token_is_closed_unread(dask_client, tmp_path):
    address, (host, port, token) = next(iter(dask_client.run(_endpoint_and_sink).items()))
    try:
        assert host == "127.0.0.1" and len(token) == ring.TOKEN_BYTES
        marker = tmp_path / "unpickled"
        forged = bytes(b ^ 0xFF for b in token)
        sock = socket.create_connection((host, port), timeout=10)
        try:
            sock.sendall(forged)
            ring.send_message(sock, "dmp-test-sink", 0, 0, _Marker(str(marker)))
            assert sock.recv(1) == b""            # closed by the worker, nothing sent back
        except (ConnectionResetError, BrokenPipeError):
            pass                                  # closed while the frame was being written
        finally:
            sock.close()
        time.sleep(0.2)
        assert not marker.exists()
        # the same frame behind the right token is unpickled and delivered, so the refusal
        # above was the token's
        good = ring.connect((host, port, token), timeout=10)
        try:
            ring.send_message(good, "dmp-test-sink", 0, 0, _Marker(str(marker)))
            deadline = time.monotonic() + 10
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            good.close()
        assert marker.exists()
    finally:
        delivered = dask_client.run(_drop_sink)[address]   # (a sink on every worker)
    assert delivered == 1
