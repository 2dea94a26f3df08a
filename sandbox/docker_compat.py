"""Every use of docker-py's private parts (and, through them, requests' and http.client's), in one place.

Checked against docker 7.2.0 and docker 7.1.0 (pyproject.toml pins ``docker>=7.1,<7.3``); a new version
must be checked here first (tests/sandbox/test_docker_backend.py's proxied tests check it):

- ``exec_output``: the output of an exec, from the file its reply's headers were read through.
  docker-py's ``exec_start(socket=True)`` (and ``stream=True``, which reads the same socket) hands
  back the socket beneath the HTTP response. But the HTTP client read the reply's headers through a
  buffered file that reads ahead, so output that had arrived with the headers (a client slow to read
  them, on a loaded host) sat in that file's buffer, and a reader of the socket never saw it: the
  command came back with exit code 0 and no output (docker/docker-py#2042 and #3332, both open).
  docker-py keeps the response on that socket (``_response``); its urllib3 response holds
  http.client's (``_fp``), whose ``fp`` is the buffered file.
"""

from __future__ import annotations

from typing import Any, BinaryIO, cast

import docker


def exec_output(api: docker.APIClient, exec_id: str) -> tuple[BinaryIO, Any]:
    """Start exec ``exec_id`` (not detached, no tty): the file to read its multiplexed output from,
    and the socket beneath it (to take its timeout off, or to shut it down)."""
    sock = api.exec_start(exec_id, socket=True)
    try:
        reader = sock._response.raw._fp.fp
    except AttributeError as error:  # a transport docker-py keeps no response on
        sock.close()
        raise RuntimeError(
            f"docker {docker.__version__}: cannot reach the buffered reply of an exec's start ({error}); "
            "sandbox/docker_compat.py is checked against docker 7.1 and 7.2 only"
        ) from error
    return cast(BinaryIO, reader), sock
