"""vLLM's prefix-cache block hash chain in plain Python, for BenchmarkVLLMChainVsPython.

hash_fn is vLLM's default --prefix-caching-hash-algo sha256: hashlib's SHA-256 of the object
pickled with protocol 5. NONE_HASH = hash_fn(PYTHONHASHSEED string); block i's hash is
hash_fn((parent, tuple(tokens of block i), None)) for a request with no extra keys.

argv: the prompt as a JSON array, the PYTHONHASHSEED string. Each stdin line is a block size;
the answer is one line: the chain's thread CPU time and wall time in nanoseconds, and the hex of
the last block hash (which the benchmark compares with kvctl's).
"""

import hashlib
import json
import pickle
import sys
import time


def hash_fn(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def main() -> None:
    with open(sys.argv[1]) as f:
        tokens = json.load(f)
    seed = sys.argv[2]
    for line in sys.stdin:
        size = int(line)
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        parent = hash_fn(seed)
        for start in range(0, len(tokens) - size + 1, size):
            parent = hash_fn((parent, tuple(tokens[start : start + size]), None))
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        print(cpu, wall, parent.hex(), flush=True)


if __name__ == "__main__":
    main()
