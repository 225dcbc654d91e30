"""The host link: copies between the device and the host, counted (pinned buffers and a side stream on CUDA).

On a CPU-only run the "device" is the CPU: the copies are plain copies, and the bytes are counted all the same.
"""
from __future__ import annotations

import torch


class Link:
    """Copies between the device and the host, counted. On CUDA: pinned buffers and a side stream."""

    def __init__(self, device: torch.device, pin_memory: bool):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pin = bool(pin_memory) and self.cuda  # pinning needs a CUDA runtime; on CPU it means nothing
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._inflight: list = []  # (event, callback or None, host tensor kept alive) in issue order
        self.d2h_bytes = self.h2d_bytes = 0

    def host_zeros(self, n: int, dtype=torch.float32) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, pin_memory=self.pin)

    def to_host(self, src: torch.Tensor, then) -> None:
        """Copy device tensor ``src`` to the host and call ``then(host_copy)`` once it has arrived."""
        self.d2h_bytes += src.numel() * src.element_size()
        if not self.cuda:
            then(src)
            return
        buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # src is complete on the compute stream
        with torch.cuda.stream(self.stream):
            buf.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        src.record_stream(self.stream)  # the allocator must not reuse src before the copy has read it
        self._inflight.append((done, then, buf))
        self.poll()

    def to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy host tensor ``src`` into device tensor ``dst``, cast to ``dst``'s dtype on the host first."""
        self.h2d_bytes += dst.numel() * dst.element_size()
        if not self.cuda:
            dst.copy_(src)
            return
        stage = torch.empty(dst.shape, dtype=dst.dtype, pin_memory=True)
        stage.copy_(src)  # cast on the host: 16-bit values cross the link
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # earlier readers of dst (an all-gather) are done
        with torch.cuda.stream(self.stream):
            dst.copy_(stage, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        compute.wait_event(done)  # later kernels and collectives see the new values
        self._inflight.append((done, None, stage))

    def poll(self, wait: bool = False) -> None:
        """Finish the copies that have arrived (all of them with ``wait``), in issue order."""
        while self._inflight:
            done, then, buf = self._inflight[0]
            if not wait and not done.query():
                return
            done.synchronize()
            self._inflight.pop(0)
            if then is not None:
                then(buf)
