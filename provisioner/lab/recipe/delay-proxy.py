"""Add latency, and optionally a bandwidth limit, to a node's SSH link without the kernel
(where sch_netem / tbf are missing).

Usage: lab-delay-proxy.py PORT DELAY_MS [RATE_BIT_PER_S]

Listens on PORT and forwards each connection to 127.0.0.1:22, holding every chunk for
DELAY_MS/2 in each direction (so a round trip gains DELAY_MS), order kept. With a
rate, every byte in each direction also takes a token from that direction's token
bucket (shared by all connections, so it is the node's link that is limited, not each
connection): the bucket fills at RATE/8 bytes per second and holds at most BURST_S
seconds of it, so a stream averages the rate and bursts no more than that.
The lab redirects inbound port 22 here with an iptables REDIRECT rule.
"""

import asyncio
import sys
import time

PORT, DELAY = int(sys.argv[1]), int(sys.argv[2]) / 2000.0
RATE = float(sys.argv[3]) / 8 if len(sys.argv) > 3 else 0.0  # bytes per second; 0: none
BURST_S = 0.02
CHUNK = 65536


class Bucket:
    """A token bucket in bytes; a take may overdraw it, and then waits the debt out."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.cap = max(float(CHUNK), rate * BURST_S)
        self.tokens = 0.0
        self.t = time.monotonic()

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self.tokens = min(self.cap, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


UP = Bucket(RATE) if RATE else None  # towards the node's sshd
DOWN = Bucket(RATE) if RATE else None  # from it


async def pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bucket: "Bucket | None"
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)

    async def send() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(CHUNK)
            if bucket is not None and data:
                await bucket.take(len(data))
            await queue.put((loop.time() + DELAY, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
        writer.close()


async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", 22)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(
        pump(client_reader, server_writer, UP),
        pump(server_reader, client_writer, DOWN),
        return_exceptions=True,
    )


async def main() -> None:
    server = await asyncio.start_server(handle, "0.0.0.0", PORT, backlog=512)
    async with server:
        await server.serve_forever()


asyncio.run(main())
