#!/usr/bin/env python3
"""Round-trip time of a 64-byte message over loopback TCP (TCP_NODELAY) between two threads,
and of a thread wake-up through a condition variable: the floor under a served call's transit
on a machine (`bench/served_transit.py` gives the transit itself). Standard library only.
usage: loopback_rtt.py [ROUNDS]
"""
import socket
import statistics
import sys
import threading
import time


def tcp_rtt(rounds):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def echo():
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = conn.recv(64)
            if not data:
                return
            conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    client = socket.create_connection(server.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        client.sendall(b"x" * 64)
        got = 0
        while got < 64:
            got += len(client.recv(64 - got))
        samples.append((time.perf_counter() - start) * 1e6)
    client.close()
    return samples


def wake_rtt(rounds):
    cv = threading.Condition()
    state = {"ping": 0, "pong": 0}

    def ponger():
        for i in range(1, rounds + 1):
            with cv:
                cv.wait_for(lambda: state["ping"] >= i)
                state["pong"] = i
                cv.notify_all()

    threading.Thread(target=ponger, daemon=True).start()
    samples = []
    for i in range(1, rounds + 1):
        start = time.perf_counter()
        with cv:
            state["ping"] = i
            cv.notify_all()
            cv.wait_for(lambda: state["pong"] >= i)
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for name, samples in (("loopback TCP 64 B", tcp_rtt(rounds)), ("condition variable", wake_rtt(rounds))):
        q = statistics.quantiles(samples, n=10)
        print(f"{name} round trip: median {statistics.median(samples):.1f} us, p10 {q[0]:.1f}, p90 {q[-1]:.1f} "
              f"({rounds} rounds)")


if __name__ == "__main__":
    main()
