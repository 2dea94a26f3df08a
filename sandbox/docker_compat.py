"""Every use of docker-py's private parts (and, through them, requests' and http.client's), in one place.

Checked against docker 7.2.0 and docker 7.1.0 (pyproject.toml pins ``docker>=7.1,<7.3``); a new version
must be checked here first (tests/sandbox/test_docker_backend.py's proxied tests check it, over TCP;
the engine's unix socket is the suite's own, and TLS takes the same path):

- ``exec_output``: the output of an exec, from the file its reply's headers were read through.
  docker-py's ``exec_start(socket=True)`` (and ``stream=True``, which reads the same socket) hands
  back the socket beneath the HTTP response. But the HTTP client read the reply's headers through a
  buffered file that reads ahead, so output that had arrived with the headers (a client slow to read
  them, on a loaded host) sat in that file's buffer, and a reader of the socket never saw it: the
  command came back with exit code 0 and no output (docker/docker-py#2042 and #3332, both open).
  docker-py keeps the response on that socket (``_response``); its urllib3 response holds
  http.client's (``_fp``), whose ``fp`` is the buffered file. The socket itself is a ``SocketIO``'s
  (``_sock``) for a unix or TCP engine, or the TLS socket itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from typing import Any, BinaryIO, cast

import docker


@dataclasses.dataclass(frozen=True)
class ExecOutput:
    """A started exec's multiplexed output: ``reader`` to read it from, ``connection`` beneath it."""

    reader: BinaryIO
    connection: Any  # a socket.socket (unix, TCP, TLS), or what an ssh:// engine's transport gives

    def cut(self) -> None:
        """Make the reader (in any thread) read an end of stream."""
        if isinstance(self.connection, socket.socket):
            # socket.socket's own shutdown, for a TLS socket too: SSLSocket's first drops the TLS
            # state that a read in another thread may be using.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self.connection, socket.SHUT_RDWR)
        else:
            self.close()

    def close(self) -> None:
        for part in (self.reader, self.connection):
            with contextlib.suppress(OSError):
                part.close()


def exec_output(api: docker.APIClient, exec_id: str) -> ExecOutput:
    """Start exec ``exec_id`` (not detached, no tty) and return its output, with no read timeout
    (the client's would end a command that is merely quiet)."""
    sock = api.exec_start(exec_id, socket=True)
    try:
        reader = sock._response.raw._fp.fp
    except AttributeError as error:  # a transport docker-py keeps no response on
        sock.close()
        raise RuntimeError(
            f"docker {docker.__version__}: cannot reach the buffered reply of an exec's start ({error}); "
            "sandbox/docker_compat.py is checked against docker 7.1 and 7.2 only"
        ) from error
    connection = sock._sock if isinstance(sock, socket.SocketIO) else sock
    if hasattr(connection, "settimeout"):
        connection.settimeout(None)
    return ExecOutput(cast(BinaryIO, reader), connection)
