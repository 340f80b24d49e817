"""A helper process of the agent, from the agent's side: one JSON line asked, one answered.

The process side is `fusevol.base.helper_child`. A helper is started from the trio thread: the
thread that spawns it is its "parent" for PR_SET_PDEATHSIG, so it must live as long as the process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys

import trio


class HelperProcess:
    def __init__(self, module: str) -> None:
        """Start `python -m module <our pid>`."""
        self.module = module
        self._process = subprocess.Popen(
            [sys.executable, "-m", module, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,  # above all, not /dev/fuse
        )
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self.pid = self._process.pid
        self._send = trio.lowlevel.FdStream(os.dup(self._process.stdin.fileno()))
        self._receive = trio.lowlevel.FdStream(os.dup(self._process.stdout.fileno()))
        self._process.stdin.close()
        self._process.stdout.close()
        self._buffer = b""

    async def call(self, request: object) -> object:
        """Send `request`, return the answer; OSError(EIO) if the helper died. A caller that is
        cancelled in between must `kill` the helper: a half-read answer must never reach the
        next caller."""
        died = OSError(errno.EIO, f"helper {self.module} {self.pid} died")
        try:
            await self._send.send_all((json.dumps(request) + "\n").encode())
            while b"\n" not in self._buffer:
                chunk = await self._receive.receive_some()
                if not chunk:
                    raise died
                self._buffer += chunk
        except trio.BrokenResourceError as exc:  # its end of a pipe closed before we wrote
            raise died from exc
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self, *, timeout_s: float = 1.0) -> None:
        """End the helper: EOF on its stdin, then a kill if it has not exited after `timeout_s`;
        reaped either way. Not for a helper that may have a request on our own mount."""
        self._send.close()
        self._receive.close()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def wait(self) -> int:
        """Block until the helper has exited (after `kill`); its exit status."""
        return self._process.wait()

    def kill(self) -> None:
        """Kill the helper, without waiting: a helper whose request is on our own mount dies only
        once our trio thread (this one) has answered it. It is reaped later (`subprocess`'s own
        clean-up at the next spawn, or at exit)."""
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        self._send.close()
        self._receive.close()
        self._process.poll()
