"""Add latency to a node's SSH link where the kernel has no sch_netem.

Listens on PORT and forwards each connection to 127.0.0.1:22, holding every chunk
for DELAY_MS/2 in each direction (so a round trip gains DELAY_MS), order kept.
The lab redirects inbound port 22 here with an iptables REDIRECT rule.
"""

import asyncio
import sys

PORT, DELAY = int(sys.argv[1]), int(sys.argv[2]) / 2000.0


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

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
            data = await reader.read(65536)
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
        pump(client_reader, server_writer),
        pump(server_reader, client_writer),
        return_exceptions=True,
    )


async def main() -> None:
    server = await asyncio.start_server(handle, "0.0.0.0", PORT, backlog=512)
    async with server:
        await server.serve_forever()


asyncio.run(main())
