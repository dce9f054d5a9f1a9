"""The local HTTP server of the io_http workload: every GET is answered after a fixed
delay (50 ms), like a remote API that is never the bottleneck.

    python benchmarks/httpwait.py --port PORT [--delay 0.05]

run.py starts it as a worker process of its own (its own session, so its CPU counts as
the benchmark's, not as other load) for each io_http run and stops it afterwards. One
asyncio server, stdlib only: it reads the request head, sleeps, writes a 2-byte body with
`Connection: close` and closes. The listen backlog is 4096, so that hundreds of
connections opened at once are not refused. Each client (benchwork.http_get and
http_get_async) opens one connection per request.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
    b"Connection: close\r\n\r\nok"
)


async def serve(port: int, delay: float) -> None:
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(delay)
            writer.write(RESPONSE)
            await writer.drain()
            served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on 127.0.0.1:{port}, delay {delay * 1000:g} ms", flush=True)
    async with server:
        await stop.wait()
    print(f"served {served} requests", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay", type=float, default=0.05)
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.delay))


if __name__ == "__main__":
    main()
