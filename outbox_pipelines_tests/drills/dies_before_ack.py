"""The NATS example consumer (examples/consumers/nats_consumer.py), made to stall once between a commit and its ack:
at its ``DRILL_STALL_AT_ACK``-th ack it prints ``stalled-before-ack ID`` and blocks its event loop (nothing more is
acknowledged or flushed) until the drill kills it. JetStream then delivers the committed message again to the next
consumer: the crash the inbox exists for, made certain rather than left to a kill's timing."""

import os
import runpy
import sys
import time

from nats.aio.msg import Msg

STALL_AT = int(os.environ["DRILL_STALL_AT_ACK"])
_acked = 0
_ack = Msg.ack


async def _ack_or_stall(self: Msg) -> None:
    global _acked
    _acked += 1
    if _acked == STALL_AT:
        print("stalled-before-ack", (self.headers or {}).get("Nats-Msg-Id"), flush=True)
        time.sleep(3_600)  # blocking on purpose: the loop stops, so no ack leaves this process
    await _ack(self)


Msg.ack = _ack_or_stall  # type: ignore[method-assign]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
