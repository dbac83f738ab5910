"""One-way message channels between two ranks, on ``torch.distributed`` send/recv.

A message is a few integers (the header) and up to two 2-D tensors. On the wire it
is a fixed-size ``int64`` header tensor, then each payload tensor; the header says
their dtypes and shapes, so the receiver allocates exactly what comes.

Each channel runs its transfers in a thread of its own, over a 2-rank process
group that only this channel uses:

- gloo's point-to-point requests cannot be polled (``is_completed`` stays False
  until ``wait``, and a ``wait`` that times out closes the connection), so the
  thread blocks in ``recv``/``send`` (which release the GIL) and the main loop polls
  a ``queue.Queue`` instead;
- one group per direction and pair keeps each communicator's operations in one
  order on both sides, which NCCL requires.

A peer that dies closes its sockets: the blocked thread's ``recv`` fails at once
with gloo's "Connection closed by peer", and the consumer re-raises it as
``PeerLostError`` naming the peer. Every wait also has a timeout.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

HEADER = 16
"""Header length: kind, number of tensors, (dtype, rows, cols) per tensor, 8 user ints."""
MAX_TENSORS = 2
USER_INTS = HEADER - 2 - 3 * MAX_TENSORS
DATA, END = 1, 2
DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.int64,
    torch.float64,
    torch.bfloat16,
    torch.float16,
)


class PeerLostError(RuntimeError):
    """The rank on the other end of a channel stopped (died, or its link failed)."""


def _why(error: BaseException) -> str:
    """What a failed transfer says about the peer, in a few words."""
    text = str(error)
    if "Connection closed by peer" in text or "Connection reset by peer" in text:
        return "its connection closed: the process ended"
    return text


@dataclass
class Message:
    """What a channel carries.

    Attributes:
        ints: up to 8 user integers (zero-filled on the wire).
        tensors: up to two 2-D tensors of the ``DTYPES``.
        end: True for the channel's last message (no tensors).
    """

    ints: list[int] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    end: bool = False


def _header(message: Message, device: torch.device) -> Tensor:
    if len(message.ints) > USER_INTS or len(message.tensors) > MAX_TENSORS:
        raise ValueError(
            f"a message holds at most {USER_INTS} ints and {MAX_TENSORS} tensors, got "
            f"{len(message.ints)} and {len(message.tensors)}"
        )
    values = [END if message.end else DATA, len(message.tensors)]
    for tensor in message.tensors:
        if tensor.dim() != 2 or tensor.dtype not in DTYPES:
            raise ValueError(
                f"message tensors must be 2-D of {DTYPES}, got {tensor.dtype} {tuple(tensor.shape)}"
            )
        values += [DTYPES.index(tensor.dtype), *tensor.shape]
    values += [0] * (2 + 3 * MAX_TENSORS - len(values)) + list(message.ints)
    values += [0] * (HEADER - len(values))
    return torch.tensor(values, dtype=torch.int64, device=device)


def _read_header(header: Tensor) -> tuple[bool, list[tuple[torch.dtype, int, int]], list[int]]:
    values = header.tolist()
    specs = [
        (DTYPES[values[2 + 3 * i]], values[3 + 3 * i], values[4 + 3 * i]) for i in range(values[1])
    ]
    return values[0] == END, specs, values[2 + 3 * MAX_TENSORS :]


def _set_device(device: torch.device) -> None:
    if device.type == "cuda":  # the current CUDA device is per thread
        torch.cuda.set_device(device)


class Inbox:
    """Receives the messages one peer sends on ``group``, in a thread, into a queue.

    Args:
        peer: the sender's global rank.
        group: a process group used only by this channel.
        device: where the received tensors live (CPU for gloo, the GPU for NCCL).
        into: the queue that gets ``(tag, Message)``; several inboxes may share one.
        tag: identifies this inbox's messages in a shared queue.
        name: how errors name the peer, e.g. ``"actor 1 (rank 2)"``.
    """

    def __init__(
        self,
        peer: int,
        group: Any,
        device: torch.device,
        into: queue.Queue[tuple[int, Message | BaseException]],
        tag: int,
        name: str,
    ) -> None:
        self.peer, self.group, self.device, self.queue, self.tag, self.name = (
            peer,
            group,
            device,
            into,
            tag,
            name,
        )
        self.thread = threading.Thread(target=self._run, name=f"inbox-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        _set_device(self.device)
        try:
            while True:
                header = torch.empty(HEADER, dtype=torch.int64, device=self.device)
                dist.recv(header, src=self.peer, group=self.group)
                end, specs, ints = _read_header(header)
                tensors = []
                for dtype, rows, cols in specs:
                    tensor = torch.empty(rows, cols, dtype=dtype, device=self.device)
                    dist.recv(tensor, src=self.peer, group=self.group)
                    tensors.append(tensor)
                if self.device.type == "cuda":
                    torch.cuda.current_stream().synchronize()
                self.queue.put((self.tag, Message(ints, tensors, end)))
                if end:
                    return
        except Exception as error:  # handed to the consumer, who raises it
            lost = PeerLostError(
                f"{self.name} stopped ({_why(error)}); the run ends: a lost process is not "
                "replaced (docs/async.md#failures)"
            )
            self.queue.put((self.tag, lost))


def get_message(
    inbox_queue: queue.Queue[tuple[int, Message | BaseException]],
    timeout_s: float | None,
    waiting_for: str,
) -> tuple[int, Message] | None:
    """The next ``(tag, message)``; ``None`` at once when empty and ``timeout_s`` is 0.

    Raises:
        PeerLostError: a peer's channel failed (it died), or nothing came within
            ``timeout_s`` seconds.
    """
    try:
        if timeout_s == 0:
            tag, item = inbox_queue.get_nowait()
        else:
            tag, item = inbox_queue.get(timeout=timeout_s)
    except queue.Empty:
        if timeout_s == 0:
            return None
        raise PeerLostError(
            f"no {waiting_for} arrived in {timeout_s:.0f} s (AsyncConfig.timeout_s): a peer is "
            "stuck or gone; the run ends"
        ) from None
    if isinstance(item, BaseException):
        raise item
    return tag, item


class Outbox:
    """Sends messages to one peer on ``group``, in a thread, in order.

    Args:
        peer: the receiver's global rank.
        group: a process group used only by this channel.
        device: the device of the tensors sent (for NCCL, this thread's GPU).
        name: how errors name the peer.
        latest_only: keep only the newest unsent message (weights: an actor needs
            the latest version, not every one); otherwise every message is sent.
    """

    def __init__(self, peer: int, group: Any, device: torch.device, name: str, latest_only: bool):
        self.peer, self.group, self.device, self.name = peer, group, device, name
        self.latest_only = latest_only
        self._pending: list[Message] = []
        self._ready = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False
        self.thread = threading.Thread(target=self._run, name=f"outbox-{name}", daemon=True)
        self.thread.start()

    def put(self, message: Message) -> None:
        """Queue ``message`` (with ``latest_only``, replacing any unsent one)."""
        self.raise_if_failed()
        with self._ready:
            if self._closed:
                raise RuntimeError(f"outbox to {self.name} is closed")
            if self.latest_only:
                self._pending = [message]
            else:
                self._pending.append(message)
            self._ready.notify()

    def close(self, timeout_s: float) -> None:
        """Send what is queued, then the end message; wait until the peer has them all.

        Raises:
            PeerLostError: the peer stopped, or did not take the messages in time.
        """
        with self._ready:
            if not self._closed:
                self._pending.append(Message(end=True))
                self._closed = True
                self._ready.notify()
        self.thread.join(timeout_s)
        self.raise_if_failed()
        if self.thread.is_alive():
            raise PeerLostError(
                f"{self.name} did not take its last messages in {timeout_s:.0f} s; the run ends"
            )

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise PeerLostError(
                f"{self.name} stopped ({_why(self._error)}); the run ends: a lost process is not "
                "replaced (docs/async.md#failures)"
            ) from self._error

    def _run(self) -> None:
        _set_device(self.device)
        try:
            while True:
                with self._ready:
                    while not self._pending:
                        self._ready.wait()
                    message = self._pending.pop(0)
                self._send(message)
                if message.end:
                    return
        except Exception as error:
            self._error = error

    def _send(self, message: Message) -> None:
        dist.send(_header(message, self.device), dst=self.peer, group=self.group)
        for tensor in message.tensors:
            dist.send(tensor.contiguous(), dst=self.peer, group=self.group)
