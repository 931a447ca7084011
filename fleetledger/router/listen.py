"""The router's address: a port reserved once, bound on the calling thread.

Story: the rollout client never re-resolves its endpoint, so a restarted router must
come back at the very same address; the port is reserved once (:func:`reserve_port`)
and passed to every incarnation, which rebinds it with ``SO_REUSEADDR``.
"""

from __future__ import annotations

import socket

__all__ = ["bind_listening", "reserve_port"]


def reserve_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (bound to 0, read, closed), reserved once so that a
    restarted router binds the same address and its clients never re-resolve."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_listening(
    host: str, port: int, error: type[Exception], *, shared: bool = False, listen: bool = True
) -> socket.socket:
    """A listening socket on ``host:port``, bound on the calling thread, so a port
    conflict fails the caller (``error``, one line) rather than a background thread.

    ``shared``: the port is one of several worker processes' (``SO_REUSEPORT``: each
    worker listens on a socket of its own and the kernel spreads new connections over
    them). ``listen=False`` holds the port without taking connections (the workers'
    supervisor: a port taken by anything else fails it before a worker starts).
    """
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR: a restarted router rebinds its port while old connections sit in
        # TIME_WAIT; it does not let two live routers share a port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        why = exc.strerror or exc
        raise error(f"router: cannot listen on {host}:{port}: {why}") from None
    return sock
