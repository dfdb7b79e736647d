"""Plays an engine for the CUDA IPC import test.

Allocates a CUDA tensor with PyTorch, fills it with a known pattern, and prints one JSON line
with the IPC handle (hex), the byte offset of the data inside the shared allocation and its size.
Then it waits for a line on stdin, checks that the data now holds the pattern the Go side wrote
(seed given on that line), and prints OK or the first mismatch.
"""

import json
import sys

import torch


def pattern(n, seed):
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i * (2 * seed + 1) + seed) % 251).to(torch.uint8)


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 4 << 20
    lead = 4096  # the data starts inside the allocation, so the offset matters
    t = torch.empty(lead + size, dtype=torch.uint8, device="cuda")
    data = t[lead:]
    data.copy_(pattern(size, 1))
    torch.cuda.synchronize()
    shared = data.untyped_storage()._share_cuda_()
    handle, storage_offset = shared[1], shared[3]
    offset = storage_offset + data.storage_offset() * data.element_size()
    print(json.dumps({"handle": handle.hex(), "offset": offset, "size": size}), flush=True)

    line = sys.stdin.readline().strip()
    seed = int(line)
    torch.cuda.synchronize()
    want = pattern(size, seed)
    bad = (data != want).nonzero()
    if bad.numel() == 0:
        print("OK", flush=True)
    else:
        i = int(bad[0])
        print(f"MISMATCH at byte {i}: got {int(data[i])}, want {int(want[i])}", flush=True)


if __name__ == "__main__":
    main()
