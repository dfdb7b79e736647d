"""Removes keys from a Mooncake cluster with Mooncake's own Python store client, forcing past
leases. Run with the Mooncake environment's python:

    python hf_mc_remove.py METADATA_URL MASTER_ADDR KEY...

Prints one JSON object {"removed": {key: rc}}; exits 1 when a removal's rc is not 0.
"""

import json
import sys

from mooncake.store import MooncakeDistributedStore


def main() -> int:
    metadata, master, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", master)
    if rc != 0:
        print(json.dumps({"setup": rc}))
        return 1
    out = {k: store.remove(k, True) for k in keys}
    print(json.dumps({"removed": out}))
    store.close()
    return 0 if all(v == 0 for v in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
