#!/usr/bin/env python3
"""The start-up order is in effect: the functions src/cli/startup.order
lists lie together at the start of the binary's text, and the list still
names the program's functions.

  startup_order_test.py BINARY ORDER_FILE
"""
import subprocess
import sys


def main():
    binary, order_file = sys.argv[1], sys.argv[2]
    names = [line.strip() for line in open(order_file) if line.strip()]
    symbols = {}  # name: (address, size), the first of a name defined twice
    for line in subprocess.run(["nm", "--defined-only", "-S", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "TtWw":
            symbols.setdefault(parts[3], (int(parts[0], 16), int(parts[1], 16)))
    text = None
    for line in subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 5 and parts[1] == ".text":
            text = (int(parts[3], 16), int(parts[5], 16))
    if text is None:
        print(f"FAIL: {binary} has no .text section")
        return 1

    present = sorted({symbols[n] for n in names if n in symbols})
    share = sum(1 for n in names if n in symbols) / len(names)
    print(f"{share:.0%} of the {len(names)} functions listed are in {binary}")
    failed = False
    if share < 0.8:
        print("FAIL: the list no longer names the program's functions: remake it with scripts/startup-order.sh")
        failed = True
    # Gathered: 95 % of them within the start of .text that their own size
    # needs, with room for what shares their sections (a C library object
    # holds several functions in one) and alignment. Unordered, they spread
    # over the whole of it.
    listed_bytes = sum(size for _, size in present)
    room = int(listed_bytes * 1.5) + 256 * 1024
    within = sum(1 for address, _ in present if address < text[0] + room)
    print(f"{within} of {len(present)} lie within the first {room // 1024} KiB of the {text[1] // 1024} KiB of .text "
          f"(their own size: {listed_bytes // 1024} KiB)")
    if within < 0.95 * len(present):
        print("FAIL: the listed functions are not gathered at the start of the text: the linker did not apply the order")
        failed = True
    if not failed:
        print("PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
