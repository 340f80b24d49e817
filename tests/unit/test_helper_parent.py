"""A helper process seen from the agent (`fusevol.base.helper_parent`): a dead one is an OSError,
whatever the call was doing when it died."""

from __future__ import annotations

import errno

import pytest
import trio

from fusevol.base.helper_parent import HelperProcess


def test_a_call_to_a_helper_that_died_is_an_eio() -> None:
    async def main() -> None:
        helper = HelperProcess("fusevol.fuse.pin_helper")
        assert await helper.call(["limit", 1]) == [0, 1]
        helper._process.kill()  # it dies between two calls
        await trio.to_thread.run_sync(helper.wait)
        with pytest.raises(OSError, match="died") as died:  # its stdin's reader is gone: EPIPE
            await helper.call(["apply", []])
        assert died.value.errno == errno.EIO

    trio.run(main)
