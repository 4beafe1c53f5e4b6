"""Several messages of an agent's stream as one write (AgentMessage.batch, ControllerMessage.batch).

Every message on the Connect stream costs each side one grpc.aio read or write: ~100-130 us of Python and
Cython, and a hand-over between gRPC's own thread and the event loop. Many messages are queued in one
event-loop turn (a cycle launching an array's tasks on a node, the acknowledgements of a group of results,
the results of jobs that ended together), so the writer takes what is queued by the time it runs, within
bounds, and sends it as one message. Only to a peer that said it reads batches (Register.accepts_batches,
RegisterAck.accepts_batches): an older one is sent every message on its own. The order is kept exactly: the
receiver acts on a batch's messages one after the other, as if each had come alone.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from google.protobuf.message import Message

# Bounds on one write: enough to carry a cycle's launches to a node, or a busy turn's reports, in a few writes.
MAX_BATCH_MESSAGES = 64
# A batch stays far inside gRPC's default 4 MiB limit on a received message; a message bigger than this on its
# own (a launch with a large script and environment) goes alone, as it always did.
MAX_BATCH_BYTES = 1 << 20

M = TypeVar("M", bound=Message)
M_co = TypeVar("M_co", covariant=True)


class MessageQueue(Protocol[M_co]):
    """What take_batch needs of an asyncio.Queue."""

    def empty(self) -> bool: ...

    def get_nowait(self) -> M_co: ...


def take_batch(first: M, queue: MessageQueue[M | None]) -> tuple[list[M], M | None, bool]:
    """``first`` and the messages queued behind it, in their order, within the bounds above.

    Returns (the messages to write as one, a message taken from the queue that did not fit and must start
    the next write, whether the queue's end (None) was taken after them). A message is measured only when
    another is waiting behind it: one at a time, nothing is measured and nothing is batched.
    """
    messages = [first]
    if queue.empty():
        return messages, None, False
    size = first.ByteSize()
    while len(messages) < MAX_BATCH_MESSAGES and not queue.empty():
        message = queue.get_nowait()
        if message is None:
            return messages, None, True
        size += message.ByteSize()
        if size > MAX_BATCH_BYTES:
            return messages, message, False
        messages.append(message)
    return messages, None, False
