#!/usr/bin/env python3
"""Holds every packet it reads from a TUN device for DELAY_MS milliseconds,
then writes it back into the device (used by scripts/sc-two-sites.sh, whose
kernel has no `tc netem`). Policy routing in the namespace sends every packet
forwarded between the sites into the device; written back, a packet arrives
from it and the main table routes it on. One way costs DELAY_MS, so a round
trip between the sites costs twice that.

Usage: delay-router.py DEVICE DELAY_MS   (runs until killed)
"""
import collections
import fcntl
import os
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main():
    device, delay = sys.argv[1], float(sys.argv[2]) / 1000.0
    fd = open_tun(device)
    held = collections.deque()  # (due time, packet), in arrival order
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            os.write(fd, held.popleft()[1])
        wait_ms = max(0, int((held[0][0] - now) * 1000)) if held else 1000
        for _ in poller.poll(wait_ms):
            packet = os.read(fd, 65535)
            held.append((time.monotonic() + delay, packet))


if __name__ == "__main__":
    main()
